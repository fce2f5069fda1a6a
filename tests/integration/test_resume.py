"""Resume: killed at any moment (kill -9, also mid-save), interrupted (SIGTERM/SIGINT), resumed,
the run ends bitwise identical to an uninterrupted one; changed model/data is refused."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import inject
from helpers.cli import assert_one_line_error, run_cli
from mnistflow.artifacts import checkpoint
from mnistflow.training.api import train

STEPS = 300  # batch 256: 215 steps per epoch, so the run crosses an epoch boundary


def _args(records, run_dir) -> list[str]:
    # mlp with dropout (global torch RNG) + on-device augmentation (the loader's generator):
    # a resume that restored the wrong RNG state, data position or optimizer would diverge.
    return ["train", "--model", "mlp", "--data", str(records), "--run-dir", str(run_dir),
            "--epochs", "2", "--max-steps", str(STEPS), "--batch-size", "256", "--augment", "--optimizer", "adam",
            "--schedule", "cosine", "--checkpoint-every", "15", "--log-every", "5", "--threads", "1",
            "--quiet"]  # validation at the epoch end (step 215) and at the end


def _launch(args, log: Path, env: dict | None = None) -> subprocess.Popen:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "mnistflow", *args, "--resume"], env=e,
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"))


def _logged_step(run: Path) -> int:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    steps = [0]
    for ln in lines:
        try:
            steps.append(json.loads(ln)["step"])
        except ValueError:
            pass
    return max(steps)


def _run_of(proc):
    return Path(proc.args[proc.args.index("--run-dir") + 1])


def _wait(cond, proc: subprocess.Popen, timeout: float = 180.0) -> None:  # a busy 2-core machine is slow
    t0 = time.monotonic()
    while not cond():
        assert proc.poll() is None, f"training ended before the kill point ({_logged_step(_run_of(proc))})"
        assert time.monotonic() - t0 < timeout, "kill point not reached"
        time.sleep(0.01)


def _assert_no_corrupt_checkpoint(run: Path) -> list[int]:
    files = checkpoint.step_files(run / "checkpoints")
    for _, p in files:
        checkpoint.verify(p)  # size + sha256 of every checkpoint on disk
    if files:
        checkpoint.load(files[-1][1])  # and the newest loads fully (weights_only)
    return [s for s, _ in files]


@pytest.mark.slow
def test_killed_at_any_moment_resumes_bitwise_identical(mnist_records, tmp_path):
    ref_dir, run = tmp_path / "ref", tmp_path / "run"
    proc = run_cli(*_args(mnist_records, ref_dir))
    assert proc.returncode == 0, proc.stderr
    rng = random.Random(0)
    log = tmp_path / "stderr.txt"
    report = []

    # 1. kill -9 early: after a few steps, before the first checkpoint (step 15)
    p = _launch(_args(mnist_records, run), log)
    _wait(lambda: _logged_step(run) >= 5, p)
    p.kill()
    p.wait()
    report.append(("kill -9 early", _logged_step(run), _assert_no_corrupt_checkpoint(run)))

    # 2./3. kill -9 at random moments after some checkpoints exist, the second near the
    # epoch boundary (step 215: validation, epoch bookkeeping, a 'best' checkpoint)
    for target in (60, 212):
        p = _launch(_args(mnist_records, run), log)
        _wait(lambda: _logged_step(run) >= target, p)
        time.sleep(rng.uniform(0, 0.15))
        p.kill()
        p.wait()
        report.append((f"kill -9 near {target}", _logged_step(run), _assert_no_corrupt_checkpoint(run)))

    # 4. kill -9 inside a checkpoint write (temp file written, not yet renamed)
    before = _assert_no_corrupt_checkpoint(run)
    p = _launch(_args(mnist_records, run), log, env=inject.env(slow_save=30))
    _wait(lambda: any((run / "checkpoints").glob(".step-*.tmp-*")), p)
    time.sleep(0.2)
    p.kill()
    p.wait()
    tmp = list((run / "checkpoints").glob(".step-*.tmp-*"))
    assert tmp and tmp[0].stat().st_size > 1_000_000  # killed with the payload written
    after = _assert_no_corrupt_checkpoint(run)
    assert after[-1] == before[-1]  # the half-saved checkpoint never appeared
    report.append(("kill -9 in a save", _logged_step(run), after))

    # 5. SIGTERM and 6. SIGINT: a checkpoint at the current step, exit 143 / 130
    for sig, code, target in ((signal.SIGTERM, 143, 235), (signal.SIGINT, 130, 265)):
        p = _launch(_args(mnist_records, run), log)
        _wait(lambda: _logged_step(run) >= target, p)
        p.send_signal(sig)
        assert p.wait(timeout=60) == code
        err = log.read_text()
        assert f"interrupted by {sig.name} at step" in err and "continue with: mnistflow train --resume" in err
        step = int(err.split(" at step ")[1].split(";")[0])
        steps = _assert_no_corrupt_checkpoint(run)
        assert steps[-1] == step and not list((run / "checkpoints").glob(".*.tmp-*"))
        reason = checkpoint.read_header(run / "checkpoints" / checkpoint.checkpoint_name(step))["reason"]
        assert reason in ("interrupt", "every")  # (the signal may land during a periodic save)
        report.append((sig.name, step, steps))

    # 7. run to the end
    p = _launch(_args(mnist_records, run), log)
    assert p.wait(timeout=120) == 0, log.read_text()
    _assert_no_corrupt_checkpoint(run)

    ref, got = load_file(str(ref_dir / "model.safetensors")), load_file(str(run / "model.safetensors"))
    assert set(ref) == set(got) and all(torch.equal(ref[k], got[k]) for k in ref), report
    # the evaluations, logged once each, are the uninterrupted run's to the last bit
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    ref_recs = [json.loads(ln) for ln in (ref_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["kind"] == "train"] == list(range(5, STEPS + 1, 5))
    evals = lambda rs: [(r["kind"], r["step"], r["acc"], r["loss"]) for r in rs if r["kind"] != "train"]  # noqa: E731
    assert evals(recs) == evals(ref_recs)
    # TensorBoard continues: superseded events are purged, each step appears once
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run / "tb"))
    ea.Reload()
    assert [e.step for e in ea.Scalars("train/loss")] == list(range(5, STEPS + 1, 5))
    assert [e.step for e in ea.Scalars("val/acc")] == [215, 300]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["resumed_from"]
    assert summary["warnings"] == []  # (--quiet: warnings are recorded, not printed)


def test_more_epochs_on_resume_is_allowed_and_continues_exactly(mnist_records, tmp_path):
    common = dict(model="mlp", data=str(mnist_records), batch_size=64, augment="auto", quiet=True,
                  threads=1, tensorboard=False, checkpoint_every=20)
    train(run_dir=str(tmp_path / "a"), epochs=0.05, **common)  # 43 steps (860 per epoch)
    s = train(run_dir=str(tmp_path / "a"), resume=True, epochs=0.1, quiet=True)
    assert s["steps"] == 86 and s["resumed_from"].endswith("step-000043.pt")
    train(run_dir=str(tmp_path / "b"), epochs=0.1, **common)
    a, b = (load_file(str(tmp_path / r / "model.safetensors")) for r in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert 'epochs = 0.1' in (tmp_path / "a" / "config.toml").read_text()
    assert "\nresume = " not in (tmp_path / "a" / "config.toml").read_text()


def test_resume_refuses_a_different_model_or_data_listing_the_differences(mnist_records, mnist_dir,
                                                                          tmp_path):
    from mnistflow.data.prepare import prepare

    run = tmp_path / "run"
    train(model="mlp", data=str(mnist_records), run_dir=str(run), max_steps=5, batch_size=64, quiet=True,
          threads=1, tensorboard=False)
    proc = run_cli("train", "--resume", "--run-dir", str(run), "--model", "softmax", "--batch-size", "32",
                   "--max-steps", "10")
    assert_one_line_error(proc, "step-000005.pt", "cannot resume with a different model or data",
                          "model: mlp -> softmax", "batch_size: 64 -> 32")
    other = prepare("mnist", mnist_dir, tmp_path / "other", val_size=1000, quiet=True)
    proc = run_cli("train", "--resume", "--run-dir", str(run), "--data", str(other), "--max-steps", "10")
    assert_one_line_error(proc, "cannot resume with a different model or data", "data: mnist (")
    assert_one_line_error(run_cli("train", "--resume", str(tmp_path / "nope.pt")), "no such checkpoint")


def test_a_signal_landing_while_the_save_is_decided_still_stops_with_a_checkpoint(mnist_records, tmp_path,
                                                                                   monkeypatch):
    """The signal arrives inside the save decision of step 7 (no save due there): the run must
    not stop at 7 unsaved (it did when the flag was read twice). The flag is read once, after
    the decision (the signal and the decision are then agreed by every rank at once): the run
    saves at 7 and stops there, and that checkpoint is the step the interruption names."""
    from mnistflow.training import checkpointing

    decided = checkpointing.Saver.is_new_best

    def signal_inside(self, step: int) -> bool:
        if step == 7:
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs before this function returns
        return decided(self, step)

    monkeypatch.setattr(checkpointing.Saver, "is_new_best", signal_inside)
    run = tmp_path / "run"
    with pytest.raises(checkpointing.TrainingInterrupted) as stopped:
        train(model="mlp", data=str(mnist_records), run_dir=str(run), max_steps=40, batch_size=64,
              checkpoint_every=20, quiet=True, threads=1, tensorboard=False)
    steps = _assert_no_corrupt_checkpoint(run)
    assert stopped.value.step == 7 and steps == [7], (stopped.value.step, steps)
    assert stopped.value.path is not None and stopped.value.path.name == "step-000007.pt"


def test_a_checkpoint_copied_in_from_another_run_does_not_take_the_run_over(mnist_records, tmp_path):
    """A seed-cnn checkpoint copied into a softmax run's checkpoints/ was resumed: config.toml
    rewritten to seed-cnn, the softmax metrics cut, seed-cnn trained into the run. Refused now,
    the run untouched; its own checkpoint still resumes."""
    import shutil

    common = dict(data=str(mnist_records), batch_size=64, quiet=True, threads=1, tensorboard=False)
    run, other = tmp_path / "run", tmp_path / "other"
    train(model="softmax", run_dir=str(run), max_steps=5, checkpoint_every=5, **common)
    train(model="mlp", run_dir=str(other), max_steps=3, checkpoint_every=3, **common)
    shutil.copy(other / "checkpoints" / "step-000003.pt", run / "checkpoints" / "step-000999.pt")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    proc = run_cli("train", "--resume", "--run-dir", str(run), "--max-steps", "1200")
    assert_one_line_error(proc, "step-000999.pt: was written by another run than the one in", "model 'mlp' (the run's: "
                          "'softmax')", "move it out of checkpoints/")
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    (run / "checkpoints" / "step-000999.pt").unlink()
    s = train(run_dir=str(run), resume=True, max_steps=8, quiet=True)
    assert s["steps"] == 8 and s["resumed_from"].endswith("step-000005.pt")
