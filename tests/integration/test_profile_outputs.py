"""What the observing verbs leave on disk, through the CLI (issue 19, "rough edges"):
``mnistflow profile`` writes its TensorBoard profiler files beside the Chrome trace, and
``train --recipe fast --quiet`` writes the model graph without printing anything."""
from __future__ import annotations

import json

from helpers.cli import run_cli

from mnistflow.artifacts.rundir import RunDir


def test_profile_writes_the_chrome_trace_and_the_tensorboard_profile(mnist_records, tmp_path):
    run = RunDir(tmp_path / "p")
    proc = run_cli("profile", "--model", "softmax", "--data", str(mnist_records), "--run-dir", str(run.path),
                   "--profile-steps", "1:3", "--threads", "1", "--batch-size", "32")
    assert proc.returncode == 0, proc.stderr
    # the profiler's C++ stage markers ("USDT: ... profiler_start") are held back
    assert "USDT:" not in proc.stderr and "STAGE:" not in proc.stderr, proc.stderr
    trace = run.profile / "trace.json"
    tb = sorted((run.profile / "tb").glob("*.pt.trace.json"))  # where TensorBoard's plugin looks
    assert trace.is_file() and len(tb) == 1, sorted(p.name for p in run.profile.rglob("*"))
    events = json.loads(tb[0].read_text())["traceEvents"]
    assert any(str(e.get("name", "")).startswith("ProfilerStep#") for e in events)
    assert tb[0].read_bytes() == trace.read_bytes()  # the same profile, not another
    assert (run.profile / "report.txt").read_text().startswith("ops by self time")


def test_train_recipe_fast_quiet_writes_the_graph_and_prints_nothing(mnist_records, tmp_path):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    run = RunDir(tmp_path / "f")
    proc = run_cli("train", "--recipe", "fast", "--data", str(mnist_records), "--run-dir", str(run.path),
                   "--max-steps", "3", "--threads", "1", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and proc.stdout == ""
    graphs = [ev for f in run.tensorboard.glob("events.out.tfevents.*")
              for ev in EventFileLoader(str(f)).Load() if ev.HasField("graph_def")]
    assert len(graphs) == 1
    assert json.loads(run.summary.read_text())["warnings"] == []
