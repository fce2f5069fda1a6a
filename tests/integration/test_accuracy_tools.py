"""The tools the fast and best recipes are built from: whitening initialisation (--whiten),
test-time shifts (--tta) and training on every labelled image (--train-on train+val)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers.cli import assert_one_line_error, run_cli

from mnistflow.data.augment import TTA_SHIFTS, shifted
from mnistflow.data.loader import make_loader
from mnistflow.data.normalize import normalize
from mnistflow.data.records import open_records
from mnistflow.inference import evaluate
from mnistflow.models import create_model
from mnistflow.models.evaluate import tta_logits
from mnistflow.models.whiten import whiten_first_conv
from mnistflow.training.api import train

QUIET = dict(quiet=True, threads=1, tensorboard=False)


def _images(records, n=2000, split="train") -> torch.Tensor:
    rec = open_records(records)
    return normalize(rec.split(split)[0][:n], rec.mean, rec.std)


def test_train_plus_val_is_every_labelled_image(mnist_records):
    rec = open_records(mnist_records)
    x, y = rec.split("train+val")
    assert rec.size("train+val") == len(x) == len(y) == 60000
    xt, yt = rec.split("train")
    xv, yv = rec.split("val")
    assert np.array_equal(x[:55000], xt) and np.array_equal(x[55000:], xv)
    assert np.array_equal(y, np.concatenate([yt, yv]))
    loader = make_loader(rec, "train+val", batch_size=1000)
    assert len(loader) == 60


def test_train_on_train_plus_val_run(mnist_records, tmp_path):
    s = train(model="softmax", optimizer="sgd", lr=0.3, batch_size=1000, max_steps=6,
              data=mnist_records, run_dir=tmp_path / "run", train_on="train+val", **QUIET)
    assert s["steps"] == 6 and s["epochs"] == pytest.approx(0.1)  # 6 of 60 batches
    assert s["val_acc"] is None  # the validation images were trained on: never scored
    assert s["test_acc"] > 0.5  # it learned (chance: 10%)


@pytest.mark.parametrize("args,fragment", [
    (["--train-on", "everything"], "--train-on must be one of train, train+val"),
    # (a model given: without one, --target-acc picks a recipe, tests/unit/test_target_recipe.py)
    (["--model", "seed-cnn", "--train-on", "train+val", "--target-acc", "0.9"], "--target-split test"),
    (["--model", "softmax", "--no-validate", "--target-acc", "0.1"], "never evaluates: add --target-split test"),
    (["--tta", "3"], "--tta must be one of 0, 2, 4, 8"),
    (["--model", "mlp", "--whiten"], "--whiten needs a model with a convolution"),
])
def test_bad_settings_fail_before_work(mnist_records, tmp_path, args, fragment):
    proc = run_cli("train", "--data", str(mnist_records), "--run-dir", str(tmp_path / "r"), *args)
    assert_one_line_error(proc, fragment)
    assert not (tmp_path / "r").exists()


def test_shifted_moves_the_picture_and_repeats_the_edge():
    x = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).view(2, 3, 4, 5)
    down = shifted(x, 1, 0)
    assert torch.equal(down[:, :, 1:], x[:, :, :-1]) and torch.equal(down[:, :, 0], x[:, :, 0])
    left = shifted(x, 0, -1)
    assert torch.equal(left[..., :-1], x[..., 1:]) and torch.equal(left[..., -1], x[..., -1])
    cl = x.contiguous(memory_format=torch.channels_last)
    assert shifted(cl, 1, 1).is_contiguous(memory_format=torch.channels_last)
    assert len(set(TTA_SHIFTS)) == 8 and (0, 0) not in TTA_SHIFTS


def test_tta_averages_the_shifted_views(mnist_records, tmp_path):
    """``--tta 2`` scores mean(softmax) over the image and its left/right shifts, computed here
    by hand from the same model on real test images."""
    train(recipe="fast", data=mnist_records, run_dir=tmp_path / "run", max_steps=30, **QUIET)
    res = evaluate(tmp_path / "run", "test", tta=2, device="cpu", threads=1)
    plain = evaluate(tmp_path / "run", "test", device="cpu", threads=1)
    from mnistflow import load_model

    model, _ = load_model(tmp_path / "run")
    model.eval()
    x = _images(mnist_records, 10000, "test")
    y = torch.from_numpy(np.array(open_records(mnist_records).split("test")[1]))
    with torch.inference_mode():
        probs = sum(model(v).softmax(1) for v in (x, shifted(x, 0, -1), shifted(x, 0, 1))) / 3
        assert torch.allclose(tta_logits(model, x[:500], 2).exp(), probs[:500], atol=1e-5)
    assert res["tta"] == 2 and res["n"] == 10000
    assert res["acc"] == pytest.approx((probs.argmax(1) == y).float().mean().item(), abs=2e-4)
    assert res["confusion"] != plain["confusion"]  # the views change predictions


def test_eval_cli_tta_flag(mnist_records, tmp_path):
    train(model="softmax", optimizer="sgd", lr=0.3, batch_size=500, max_steps=20,
          data=mnist_records, run_dir=tmp_path / "run", **QUIET)
    proc = run_cli("eval", str(tmp_path / "run"), "--tta", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tta"] == 4
    assert_one_line_error(run_cli("eval", str(tmp_path / "run"), "--tta", "5"), "--tta must be one of")


@pytest.mark.parametrize("name", ["fast", "seed-cnn"])
def test_whitening_decorrelates_the_first_layer(mnist_records, name):
    """After --whiten, the first convolution's paired filters answer real MNIST patches with
    uncorrelated, unit-scale outputs (for the directions well above eps) and their negations."""
    torch.manual_seed(0)
    model = create_model(name).double()
    x = _images(mnist_records).double()
    assert "32 of 32 filters" in whiten_first_conv(model, x)
    conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    seen = {}
    conv.register_forward_hook(lambda m, i, o: seen.setdefault("out", o))
    with torch.no_grad():
        model(x)
    out = seen["out"].permute(0, 2, 3, 1).reshape(-1, conv.out_channels)
    assert torch.allclose(out[:, :16], -out[:, 16:])
    cov = torch.cov(out[:, :16].T)
    var = cov.diagonal()  # variance / (variance + eps): ~1 for the strongest directions, then less
    assert (cov - torch.diag(var)).abs().max() < 1e-6  # uncorrelated
    assert torch.allclose(var[:4], torch.ones(4, dtype=var.dtype), atol=0.01)
    assert (var <= 1).all() and (var[1:] <= var[:-1] + 1e-9).all()


def test_whiten_runs_in_training_and_is_skipped_on_resume(mnist_records, tmp_path, capsys):
    run = tmp_path / "run"
    train(recipe="fast", data=mnist_records, run_dir=run, max_steps=4, threads=1, tensorboard=False,
          whiten=True)
    assert "whitened features.0: 32 of 32 filters" in capsys.readouterr().out
    train(recipe="fast", data=mnist_records, run_dir=run, max_steps=8, threads=1, tensorboard=False,
          whiten=True, resume="latest")
    assert "whitened" not in capsys.readouterr().out  # the checkpoint's weights are kept


@pytest.mark.parametrize("kernel,dilation,padding,stride", [
    ((3, 3), (1, 1), (1, 1), (1, 1)), ((5, 5), (1, 1), (2, 2), (1, 1)), ((3, 2), (2, 1), (0, 1), (2, 3))])
def test_whitening_patches_are_unfolds(kernel, dilation, padding, stride):
    from mnistflow.models.whiten import patches

    x = torch.randn(3, 4, 11, 9).contiguous(memory_format=torch.channels_last)
    want = torch.nn.functional.unfold(x, kernel, dilation, padding, stride)
    assert torch.equal(patches(x, kernel, dilation, padding, stride), want)
