"""Training that knows the data (issue 20): the recipes run on every family member with
nothing but the data, take the input shape, classes and normalization from the records, and
``--augment auto`` takes the dataset's own policy (Fashion-MNIST for real; the members not
on this machine as small synthetic record sets named after them)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.cli import run_cli
from helpers.realdata import real_data

from mnistflow.training.config import load_toml
from mnistflow.training.api import train

QUIET = dict(quiet=True, threads=1, tensorboard=False)


@pytest.fixture(scope="module")
def fashion_records(tmp_path_factory) -> Path:
    from mnistflow.data.known import KNOWN
    from mnistflow.data.prepare import prepare

    return prepare("fashion-mnist", real_data(KNOWN["fashion-mnist"]), tmp_path_factory.mktemp("rec") / "fashion",
                   quiet=True)


def _family_member(out: Path, name: str, *, channels: int, size: int, classes: int) -> Path:
    """A small synthetic record set named after a family member (2,000 train: ``fast``'s batches
    of 384 make 2 steps in its 0.45 epoch / 50 val / 100 test)."""
    from helpers.synthetic import digits

    from mnistflow.data.formats.raw import RawDataset, RawSplit
    from mnistflow.data.write_records import write_records

    xtr, ytr = digits(2050, classes=classes, size=size, channels=channels)
    xte, yte = digits(100, classes=classes, size=size, channels=channels, seed=7)
    names = [chr(ord("a") + k) for k in range(classes)] if classes == 26 else [str(k) for k in range(classes)]
    raw = RawDataset(name, names, RawSplit(xtr, ytr), RawSplit(xte, yte))
    return write_records(raw, out / name, key=name, options={}, source_checksums={}, val_size=50)


MEMBERS = {  # name: (channels, size, classes, the policy auto takes)
    "cifar10": (3, 32, 10, "photos"),
    "emnist-letters": (1, 28, 26, "glyphs"),
}


@pytest.fixture(scope="module")
def members(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("family")
    return {name: _family_member(out, name, channels=c, size=s, classes=k) for name, (c, s, k, _) in MEMBERS.items()}


@pytest.mark.parametrize("member", list(MEMBERS))
@pytest.mark.parametrize("recipe", ["fast", "fast-plus", "seed-cnn", "mid", "best"])
def test_every_recipe_runs_on_every_family_member_with_only_the_data(members, tmp_path, recipe, member):
    from mnistflow.artifacts.load import load_any
    from mnistflow.data.records import open_records

    channels, size, classes, policy = MEMBERS[member]
    run = tmp_path / "run"
    s = train(recipe=recipe, data=members[member], run_dir=run, max_steps=2, **QUIET)
    assert s["steps"] == 2 and 0 <= s["test_acc"] <= 1, s
    # best takes the dataset's policy, mid and fast-plus too but on clothing (FOR_DATA); fast and
    # seed-cnn do not augment (recipes.py)
    takes = recipe == "best" or (recipe in ("mid", "fast-plus") and policy != "clothing")
    assert load_toml(run / "config.toml")["augment"] == (policy if takes else "off")
    _, info = load_any(run)
    assert tuple(info.in_shape) == (channels, size, size) and info.num_classes == classes
    assert list(info.mean) == open_records(members[member]).mean and len(info.mean) == channels


def test_auto_on_an_unknown_input_is_shifts_and_says_so(tmp_path, capsys):
    from helpers.synthetic import write_records

    rec = write_records(tmp_path / "scans", n_train=300, n_test=50, val_size=50)  # named 'synthetic'
    train(model="mlp", data=rec, run_dir=tmp_path / "run", max_steps=2, augment="auto",
          threads=1, tensorboard=False)
    assert load_toml(tmp_path / "run" / "config.toml")["augment"] == "shifts"
    notes = [ln for ln in capsys.readouterr().err.splitlines() if "--augment auto" in ln]
    assert notes == [("mnistflow: note: --augment auto: 'synthetic' is not a known dataset, so shifts: shifts "
                      "of a few pixels only (no flips, no rotations) (or name one: --augment "
                      "glyphs|elastic|clothing|photos, or off)")]


def test_fast_on_fashion_mnist_trains_with_only_the_data(fashion_records, tmp_path):
    """``--recipe fast --data <Fashion-MNIST>``: the records' shape and normalization, and a
    model far above chance (10%) in its 0.45 epoch; fast does not augment (every image is new)."""
    run = tmp_path / "run"
    proc = run_cli("train", "--recipe", "fast", "--data", str(fashion_records), "--run-dir", str(run),
                   "--threads", "1", "--no-tensorboard", "--json")
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout.splitlines()[-1])
    assert s["test_acc"] >= 0.8, s
    assert load_toml(run / "config.toml")["augment"] == "off"


def test_auto_takes_clothing_on_fashion_mnist(fashion_records, tmp_path):
    """``--augment auto`` on Fashion-MNIST is the dataset's policy, clothing (best's default);
    seed-cnn capped at 30 steps with it still learns far above chance (10%)."""
    run = tmp_path / "run"
    s = train(recipe="seed-cnn", augment="auto", data=fashion_records, run_dir=run, max_steps=30,
              validate=False, **QUIET)
    assert load_toml(run / "config.toml")["augment"] == "clothing"
    assert s["test_acc"] >= 0.5, s
