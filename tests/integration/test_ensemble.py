"""An ensemble (``fast-x3``) trained as one run on the real MNIST: the members are different nets,
their averaged probabilities score above the members on the test set, and the saved model comes
back as the same ensemble from every format (safetensors, ONNX) and through ``mnistflow eval``."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers.cli import run_cli
from mnistflow.artifacts.load import load_any
from mnistflow.data.normalize import normalize
from mnistflow.data.records import open_records
from mnistflow.inference import evaluate
from mnistflow.models.ensemble import Ensemble
from mnistflow.training.api import train


@pytest.fixture(scope="module")
def ensemble_run(mnist_records, tmp_path_factory):
    run = tmp_path_factory.mktemp("ensemble") / "run"
    s = train(recipe="fast", model="fast-x3", data=str(mnist_records), run_dir=str(run), quiet=True,
              threads=1, tensorboard=False, seed=0)
    return run, s


def test_members_differ_and_their_average_beats_them(ensemble_run, mnist_records):
    run, s = ensemble_run
    model, info = load_any(run)
    assert isinstance(model, Ensemble) and len(model.members) == 3 and info.model == "fast-x3"
    x, y = open_records(mnist_records).split("test")
    xb, y = normalize(np.asarray(x), info.mean, info.std), torch.from_numpy(np.asarray(y)).long()
    model.eval()
    with torch.inference_mode():
        member_preds = [m(xb).argmax(1) for m in model.members]
        ens = model(xb).argmax(1)
    accs = [(p == y).sum().item() / len(y) for p in member_preds]
    acc = (ens == y).sum().item() / len(y)
    # the ensemble's figure, as eval gives it in fp32 (the run's own test pass ran in its own
    # precision: bf16 on a CPU with bf16 units, a few images apart; eval repeats that one below)
    assert abs(acc - evaluate(run, precision="fp32")["acc"]) < 1e-9
    # each member is a fast net trained as if alone (whitened, Muon): ~99% (recipes: 99.03-99.12%)
    assert all(a >= 0.985 for a in accs), accs
    assert len({tuple(p[:2000].tolist()) for p in member_preds}) == 3  # three different nets
    assert acc > sum(accs) / 3 and acc >= max(accs) - 0.0005, (acc, accs)
    assert acc >= 0.99, acc


def test_it_is_one_model_in_every_format(ensemble_run, tmp_path):
    run, s = ensemble_run
    proc = run_cli("eval", str(run), "--json")
    assert proc.returncode == 0, proc.stderr
    assert abs(json.loads(proc.stdout)["acc"] - s["test_acc"]) < 1e-9
    proc = run_cli("export", str(run), "--format", "onnx", "--out", str(tmp_path / "m.onnx"))
    assert proc.returncode == 0, proc.stderr
    onnx_model, _ = load_any(tmp_path / "m.onnx")
    torch_model, info = load_any(run)
    x, _ = open_records(info.records).split("test")
    batch = normalize(np.asarray(x[:64]), info.mean, info.std).numpy()
    got = onnx_model.run(batch)
    with torch.inference_mode():
        want = torch_model.eval()(torch.from_numpy(batch)).numpy()
    assert got.shape == (64, 10) and np.abs(got - want).max() < 1e-4


def test_an_interrupted_ensemble_resumes_to_the_same_weights(mnist_records, tmp_path):
    from safetensors.torch import load_file

    common = dict(model="fast-x2", optimizer="muon", lr=0.5, nesterov=True, data=str(mnist_records),
                  batch_size=64, quiet=True, threads=1, tensorboard=False, checkpoint_every=10,
                  channels_last=True, whiten=True)
    train(run_dir=str(tmp_path / "a"), epochs=0.02, **common)  # 17 steps (859 per epoch)
    s = train(run_dir=str(tmp_path / "a"), resume=True, epochs=0.04, quiet=True)
    assert s["resumed_from"] and s["model"] == "fast-x2"
    train(run_dir=str(tmp_path / "b"), epochs=0.04, **common)
    a, b = (load_file(str(tmp_path / r / "model.safetensors")) for r in "ab")
    assert set(a) == set(b) and any(k.startswith("members.1.") for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
