"""Runs are never silently overwritten or mixed (D6, D7), through the CLI as users run it: two
trainings on one run directory, a run trained into again, ``--resume`` of a run killed before
its first checkpoint; ``--config RUN/config.toml`` from another directory; the thread count
of a resumed run."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from helpers import inject
from helpers.cli import assert_one_line_error, run_cli

from mnistflow.artifacts.rundir import LOCK, RunDir

SLOW = inject.env(data_delay=0.01)  # ~10 ms a batch: a run long enough to meet


def _softmax(records, run, *more: str) -> list[str]:
    return ["train", "--recipe", "softmax", "--data", str(records), "--run-dir", str(run), "--threads", "1",
            "--log-every", "10", *more]


def _start(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mnistflow", *args], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(cond, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    t0 = time.monotonic()
    while not cond():
        assert proc.poll() is None, f"ended before {what}: {proc.communicate()}"
        assert time.monotonic() - t0 < timeout, f"{what}: not reached"
        time.sleep(0.02)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_second_training_on_a_run_in_use_fails_at_once_and_a_killed_one_leaves_no_lock(
        mnist_records, tmp_path):
    """D7 (concurrent runs mix) and D6 (a resume without checkpoint trains another model)."""
    run = tmp_path / "runs" / "early"
    # ~100 ms a batch: its first checkpoint (the epoch's end: a new best) ~55 s away
    first = _start(_softmax(mnist_records, run, "--checkpoint-every", "100000"),
                   inject.env(data_delay=0.1))
    try:
        rd = RunDir(run)
        _wait_for(lambda: rd.metrics.is_file() and rd.metrics.read_text().count("\n") >= 2, first,
                  "two logged steps")
        assert rd.lock.read_text().strip() == str(first.pid)
        for more in ((), ("--resume",), ("--seed", "5")):
            t0 = time.monotonic()
            proc = run_cli(*_softmax(mnist_records, run, *more))
            assert_one_line_error(proc, str(run), f"another training is using this run directory (pid {first.pid})")
            assert first.poll() is None and time.monotonic() - t0 < 60
        assert 'model = "softmax"' in rd.config.read_text()
    finally:
        first.kill()  # kill -9 before its first checkpoint
        first.communicate()
    assert not list(rd.checkpoints.glob("step-*.pt"))
    # the lock died with it; --resume restarts THAT run (softmax), not the default seed-cnn
    proc = run_cli("train", "--resume", "--run-dir", str(run), "--max-steps", "5")
    assert proc.returncode == 0, proc.stderr
    assert f"no checkpoint in {run}; restarting it from step 0 with its config.toml" in proc.stderr
    assert "training softmax on mnist" in proc.stdout and "1 thread," in proc.stdout
    assert 'model = "softmax"' in rd.config.read_text()
    assert json.loads(rd.summary.read_text())["steps"] == 5
    recs = [json.loads(ln) for ln in rd.metrics.read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in recs] == [("train", 5), ("val", 5), ("test", 5)]  # the killed run's are gone


def test_two_trainings_started_together_never_mix(mnist_records, tmp_path):
    """D7: started at once into one directory, one trains and the other stops with one line."""
    run = tmp_path / "dup"
    procs = [_start(_softmax(mnist_records, run, "--checkpoint-every", "25", "--seed", str(s), "--max-steps",
                             "300"), SLOW) for s in (1, 2)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    loser = next(err for p, (_, err) in zip(procs, outs) if p.returncode == 2)
    lines = [ln for ln in loser.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("mnistflow: error: "), loser
    # whichever way they met: in use at once, or a finished run the second may not overwrite
    assert "another training is using this run directory" in lines[0] or "holds a run already" in lines[0]
    steps = [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(ln)["kind"] == "train"]
    assert steps == list(range(10, 301, 10))  # every step once


def test_training_again_into_a_finished_run_is_refused(mnist_records, tmp_path):
    """D7: a run without checkpoints (--keep-checkpoints 0) was overwritten without a word."""
    run = tmp_path / "nock"
    proc = run_cli(*_softmax(mnist_records, run, "--keep-checkpoints", "0", "--max-steps", "40"))
    assert proc.returncode == 0, proc.stderr
    before = {p.name: _sha(p) for p in run.iterdir() if p.is_file()}
    proc = run_cli(*_softmax(mnist_records, run, "--keep-checkpoints", "0", "--max-steps", "40", "--lr", "0.01",
                             "--seed", "5"))
    assert_one_line_error(proc, str(run), "holds a run already", "continue it with --resume",
                          "pick another --run-dir")
    assert {p.name: _sha(p) for p in run.iterdir() if p.is_file()} == before


def test_config_toml_trains_again_from_any_directory(mnist_records, tmp_path):
    """The data path in config.toml is absolute (it was the path as typed, relative to the cwd)."""
    here, a = tmp_path / "here", tmp_path / "a"
    here.mkdir()
    a.mkdir()
    proc = run_cli(*_softmax(os.path.relpath(mnist_records, here), "run", "--max-steps", "10"), cwd=here)
    assert proc.returncode == 0, proc.stderr
    config = here / "run" / "config.toml"
    text = config.read_text()
    assert f"data = {json.dumps(str(mnist_records))}" in text
    assert f"run_dir = {json.dumps(str(here / 'run'))}" in text
    proc = run_cli("train", "--config", str(config), "--run-dir", "again", cwd=a)
    assert proc.returncode == 0, proc.stderr
    assert _sha(a / "again" / "model.safetensors") == _sha(here / "run" / "model.safetensors")
    # without another --run-dir it names the run it came from: that run is not trained into again
    assert_one_line_error(run_cli("train", "--config", str(config), cwd=a), "holds a run already")


def test_a_resume_on_another_thread_count_says_so(mnist_records, tmp_path):
    run = tmp_path / "r"
    proc = run_cli(*_softmax(mnist_records, run, "--max-steps", "20", "--checkpoint-every", "10"))
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("train", "--resume", "--run-dir", str(run), "--max-steps", "30", "--threads", "2")
    assert proc.returncode == 0, proc.stderr
    said = [ln for ln in proc.stderr.splitlines() if "thread" in ln]
    assert said == [("mnistflow: warning: the resumed part trains on 2 thread(s), the run so far on 1: it will "
                     "not be bitwise identical to an uninterrupted run (leave --threads and $MNISTFLOW_THREADS "
                     "unset to keep 1)")], proc.stderr
    assert not (run / LOCK).exists()
    # (without a choice the run's own count is kept: tests/unit/test_run_ownership.py)


def test_a_run_that_fails_before_its_first_steps_leaves_no_directory_and_the_retry_works(mnist_records,
                                                                                          tmp_path):
    """A setup error left config.toml, metrics.jsonl, tb/ and checkpoints/ behind, and the same
    command with the mistake fixed was refused ('holds a run already')."""
    import numpy as np

    np.savez(tmp_path / "wrong.npz", foo=np.zeros(3, np.float32))
    (tmp_path / "x.safetensors").write_bytes(b"")
    run = tmp_path / "ir"
    for more, fragment in ((["--init-from", str(tmp_path / "nonexist.npz")],
                            "nonexist.npz: --init-from: does not exist"),
                           (["--init-from", str(tmp_path / "wrong.npz")], "no parameter of the model was restored"),
                           (["--init-from", str(tmp_path / "x.safetensors")], "--init-from takes an npz"),
                           (["--batch-size", "100000"], "larger than the training set"),
                           (["--device", "meta"], "unknown device 'meta' (use auto, cpu, cuda, cuda:N or mps)")):
        assert_one_line_error(run_cli(*_softmax(mnist_records, run, "--max-steps", "2", *more)), fragment)
        assert not run.exists(), (more, sorted(p.name for p in run.iterdir()))
    proc = run_cli(*_softmax(mnist_records, run, "--max-steps", "2"))
    assert proc.returncode == 0, proc.stderr
    assert RunDir(run).model.is_file()


def test_a_run_named_with_any_unicode_reads_back(mnist_records, tmp_path):
    """A non-BMP character in a setting was written to config.toml as a JSON surrogate pair,
    which TOML refuses: report and train --config of that run failed; bytes that are not UTF-8
    are refused before anything is made."""
    run = tmp_path / "emoji😀 \"q\" run"
    proc = run_cli(*_softmax(mnist_records, run, "--max-steps", "2", "--keep-checkpoints", "0"))
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("report", str(run))
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("train", "--config", str(run / "config.toml"), "--run-dir", str(tmp_path / "again😀"))
    assert proc.returncode == 0, proc.stderr
    assert _sha(tmp_path / "again😀" / "model.safetensors") == _sha(run / "model.safetensors")
    bad = os.fsdecode(b"bad\xffname")
    proc = subprocess.run([sys.executable, "-m", "mnistflow", *_softmax(mnist_records, bad, "--max-steps", "2")],
                          capture_output=True, text=True, cwd=tmp_path, check=False)
    assert_one_line_error(proc, "--run-dir must be valid UTF-8 text")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["again😀", run.name])
