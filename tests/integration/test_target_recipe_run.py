"""``mnistflow train --target-acc T`` with no recipe, on real MNIST: it picks the cheapest
recipe measured to reach T, says so, trains it, and reports the time to the target."""
from __future__ import annotations

import json

from helpers.cli import run_cli


def test_the_picked_recipe_trains_and_reaches_the_target(mnist_records, tmp_path):
    run = tmp_path / "run"
    proc = run_cli("train", "--target-acc", "0.98", "--data", str(mnist_records), "--run-dir", str(run),
                   "--threads", "1", "--no-tensorboard")
    assert proc.returncode == 0, proc.stderr
    assert "--target-acc 0.98: recipe fast, the cheapest measured to reach it on mnist" in proc.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["model"] == "fast" and summary["test_acc"] >= 0.98
    assert summary["stop_reason"] in ("target", "epochs") and summary["time_to_target_s"] is not None
    assert 'recipe = "fast"' in (run / "config.toml").read_text()


def test_a_target_no_recipe_reaches_is_one_line_before_any_work(mnist_records, tmp_path):
    proc = run_cli("train", "--target-acc", "0.9999", "--data", str(mnist_records),
                   "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("mnistflow: error: --target-acc 0.9999: no recipe reaches it on mnist")
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
