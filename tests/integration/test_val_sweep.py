"""benchmarks/val_sweep.py, the tool recipes are chosen with: it trains on records that have no
test split at all, so a sweep cannot compute a test figure, and it saves what it compares."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import mnistflow
from mnistflow.data.records import open_records

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "val_sweep.py"


def _val_sweep():
    spec = importlib.util.spec_from_file_location("val_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_records_without_test_hold_train_and_val_only(mnist_records, tmp_path):
    view = _val_sweep().records_without_test(Path(mnist_records), tmp_path / "view")
    rec, full = open_records(view), open_records(mnist_records)  # opening checks every checksum
    assert rec.has("train") and rec.has("val") and not rec.has("test")
    assert not list(view.glob("test_*"))
    for split in ("train", "val"):
        (x, y), (fx, fy) = rec.split(split), full.split(split)
        assert np.array_equal(np.asarray(x), np.asarray(fx)) and np.array_equal(np.asarray(y), np.asarray(fy))
    r = mnistflow.train(recipe="fast", data=str(view), epochs=0.05, threads=1, quiet=True,
                        tensorboard=False, run_dir=str(tmp_path / "run"), train_on="train")
    assert r["test_acc"] is None and r["val_acc"] is None  # no test pass, and none asked on val


def test_run_saves_validation_probabilities_and_compare_and_time_read_them(mnist_records, tmp_path):
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "records").symlink_to(Path(mnist_records).resolve())  # prepared already: not again
    env = {**os.environ, "MNISTFLOW_SWEEP_DIR": str(out)}

    def sweep(*args: str, rc: int = 0) -> str:
        p = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == rc, p.stderr
        return p.stdout + p.stderr

    ran = sweep("run", "tiny", "--recipe", "fast", "--set", "epochs=0.1", "--seeds", "0", "1",
                "--views", "2", "--threads", "1")
    _, vy = open_records(mnist_records).split("val")
    accs = []
    for seed in (0, 1):
        p = np.load(out / f"tiny_{seed}.npy")
        assert p.shape == (len(vy), 10) and np.allclose(p.sum(1), 1, atol=1e-4)
        accs.append(100 * (p.argmax(1) == np.asarray(vy)).mean())
        assert f"tiny seed {seed}: val {accs[-1]:.2f}%" in ran
    assert min(accs) > 90  # a tenth of an epoch of fast already learns the digits
    compared = sweep("compare", "tiny")
    assert f"tiny: val {accs[0]:.2f}%" in compared and "ensemble of 2" in compared
    # --per-seed: a second tag holding the same two models, seeds swapped, so each seed's mixed
    # ensemble is the two models averaged; a tag that starts like another's is not read as it
    p0, p1 = np.load(out / "tiny_0.npy"), np.load(out / "tiny_1.npy")
    np.save(out / "mix_0.npy", p1)
    np.save(out / "mix_1.npy", p0)
    np.save(out / "tiny_x_0.npy", np.eye(10)[np.zeros(len(vy), dtype=int)])  # another tag, "tiny_x"
    both = 100 * ((p0 + p1).argmax(1) == np.asarray(vy)).mean()
    mixed = sweep("compare", "tiny", "mix", "--per-seed")
    assert "tiny: ensemble of 2" in mixed and "ensemble of 3" not in mixed
    assert f"| tiny + mix | 0: {both:.2f} / 1: {both:.2f} | {both:.3f} |" in mixed
    # `time` trains the tag again from its saved settings: one round, one line, ratio 1 to itself
    timed = sweep("time", "tiny", "--rounds", "1")
    row = next(line for line in timed.splitlines() if line.startswith("| tiny |"))
    wall, ratio = (float(v) for v in row.split("|")[2:4])
    assert 0 < wall < 60 and ratio == 1.0
    assert "no settings saved for missing" in sweep("time", "tiny", "missing", rc=1)
