"""``mnistflow.train(data=..., val_data=..., test_data=...)`` and ``mnistflow.evaluate(data=...)``
with data in memory (synthetic digits): the run trains on records made from it, and everything
after (config.toml, resume, eval, predict) works as for any records."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import mnistflow
from helpers.synthetic import digits
from mnistflow.core.errors import MnistflowError
from mnistflow.training.config import load_toml

QUICK = dict(quiet=True, threads=1, tensorboard=False, keep_checkpoints=0, batch_size=50)


@pytest.fixture(scope="module")
def data():
    return digits(400, seed=1), digits(60, seed=2), digits(100, seed=3)


def test_train_on_arrays_with_val_and_test_data(data, tmp_path):
    (x, y), (vx, vy), (tx, ty) = data
    xt = torch.from_numpy(tx).permute(0, 3, 1, 2).float() / 255  # float N x 1 x 28 x 28 in 0..1
    s = mnistflow.train("softmax", (x[..., 0], y), val_data=(vx, vy), test_data=(xt, torch.from_numpy(ty)),
                        run_dir=tmp_path / "run", epochs=3, **QUICK)
    assert s["val_acc"] > 0.5 and s["test_acc"] > 0.5  # learnt: ten classes, chance is 0.1
    records = load_toml(tmp_path / "run" / "config.toml")["data"]  # the run names its records
    rec = mnistflow.open_records(records)
    assert rec.meta["splits"] == {"train": 400, "val": 60, "test": 100}
    # evaluated later on the same images in memory: the run's own test accuracy, within what
    # normalizing by the evaluated records' own mean and std (evaluate's rule) can change
    ev = mnistflow.evaluate(tmp_path / "run", data=(tx, ty), precision="fp32")
    assert abs(ev["acc"] - s["test_acc"]) <= 0.02 and ev["records"] != records
    ev = mnistflow.evaluate(tmp_path / "run", data=DataLoader(TensorDataset(xt, torch.from_numpy(ty)), batch_size=30))
    assert abs(ev["acc"] - s["test_acc"]) <= 0.02
    probs = mnistflow.predict(tmp_path / "run", tx[:5])  # predict takes uint8 N x H x W x C arrays
    assert [p["image"] for p in probs] == [f"array[{i}]" for i in range(5)]
    assert all(abs(sum(p["probabilities"]) - 1) < 1e-4 for p in probs)
    with pytest.raises(MnistflowError, match=r"^data: x has shape \(100, 784\)"):
        mnistflow.evaluate(tmp_path / "run", data=(tx.reshape(100, -1), ty))


def test_a_dataset_without_val_data_carves_one_and_resumes(data, tmp_path):
    (x, y), _, _ = data
    ds = TensorDataset(torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(y))  # uint8 N x C x H x W
    run = tmp_path / "run"
    s = mnistflow.train("softmax", ds, run_dir=run, max_steps=4, **{**QUICK, "keep_checkpoints": 2})
    rec = mnistflow.open_records(load_toml(run / "config.toml")["data"])
    assert rec.meta["splits"] == {"train": 360, "val": 40}  # a tenth carved, as prep does; no test
    assert "val_acc" in s and s.get("test_acc") is None
    again = mnistflow.train("softmax", ds, run_dir=run, resume=True, max_steps=8,
                            **{**QUICK, "keep_checkpoints": 2})  # the same data: the same records
    assert again["steps"] == 8 and again["resumed_from"].endswith("step-000004.pt")


def test_config_toml_replays_a_run_trained_from_arrays(data, tmp_path):
    (x, y), _, _ = data
    a = mnistflow.train("softmax", (x, y), run_dir=tmp_path / "a", max_steps=3, seed=1, **QUICK)
    b = mnistflow.train(config=tmp_path / "a" / "config.toml", run_dir=tmp_path / "b", quiet=True)
    assert a["val_acc"] == b["val_acc"]


def test_bad_data_fails_before_the_run_starts(data, tmp_path):
    (x, y), _, _ = data
    with pytest.raises(MnistflowError, match=r"^data: x has 3 dimensions \(N x H x W\) but y has 5 "
                                             r"labels for 6 images$"):
        mnistflow.train("softmax", (x[:6, ..., 0], y[:5]), run_dir=tmp_path / "run", **QUICK)
    with pytest.raises(MnistflowError, match=r"^val_data must be a path, an \(x, y\) pair"):
        mnistflow.train("softmax", (x, y), val_data=3, run_dir=tmp_path / "run", **QUICK)
    assert not (tmp_path / "run").exists()


def test_a_shuffling_loader_is_said_unless_quiet(data, caplog):
    (x, y), _, _ = data
    loader = DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=64, shuffle=True)
    from mnistflow.data.open import training_data

    with caplog.at_level("INFO", logger="mnistflow"):
        training_data(loader, quiet=True)
        assert not caplog.records
        training_data(loader)
    assert any("the DataLoader shuffles" in r.getMessage() for r in caplog.records)
    assert any("wrote the data in memory" in r.getMessage() for r in caplog.records)
