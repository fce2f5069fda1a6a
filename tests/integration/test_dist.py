"""Data parallel training under torchrun (CPU, gloo, 127.0.0.1): two processes with batch B/2
train exactly like one process with batch B; only rank 0 writes; a dead rank ends the job;
a signal stops every rank at the same step; resume works with another number of processes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from helpers import inject
from helpers.cli import run_cli
from mnistflow.artifacts import checkpoint
from mnistflow.training.config import TrainConfig
from mnistflow.data.loader import epoch_order, make_loader
from mnistflow.data.records import open_records
from mnistflow.training.api import train
from mnistflow.training.resume import resume_differences

# No batch norm, no dropout: one process and two are then equal up to float summation order.
SPEC = "conv5x5x8-relu,maxpool2,fc10"
COMMON = ["--precision", "fp32", "--threads", "1", "--log-every", "5", "--optimizer", "adam"]


def torchrun(*args: str, nproc: int = 2, env: dict | None = None, cwd: Path | None = None,
             popen: bool = False, timeout: float = 120):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "mnistflow", *args]
    e = dict(os.environ, OMP_NUM_THREADS="1", MNISTFLOW_DIST_TIMEOUT="20")
    e.update(env or {})
    if popen:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e,
                                cwd=cwd)
    return subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=cwd, timeout=timeout)


def metrics(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]


def weights_close(a: Path, b: Path, rtol: float = 1e-5) -> float:
    """Max abs difference of two model.safetensors; asserts it is within ``rtol`` of the scale."""
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert set(wa) == set(wb)
    worst = 0.0
    for k in wa:
        d = (wa[k] - wb[k]).abs().max().item()
        assert d <= rtol * max(wa[k].abs().max().item(), 1e-3), (k, d)
        worst = max(worst, d)
    return worst


def assert_same_curves(ref: list[dict], got: list[dict], resumed_at: int | None = None) -> None:
    if resumed_at is not None:
        # Compare the training curve and the final evaluations: the first run's own end-of-run
        # evaluations stay in the file, and a log window cut by the resume (it restarts there)
        # averages fewer steps.
        cut = lambda r: r["step"] - 5 < resumed_at < r["step"]  # noqa: E731
        keep = lambda rs: [r for r in rs if (r["kind"] == "train" and not cut(r))  # noqa: E731
                           or r["step"] == rs[-1]["step"]]
        ref, got = keep(ref), keep(got)
    assert [(r["kind"], r["step"]) for r in ref] == [(r["kind"], r["step"]) for r in got]
    for r, g in zip(ref, got):
        assert g["loss"] == pytest.approx(r["loss"], rel=1e-5), (r, g)
        assert g["acc"] == pytest.approx(r["acc"], abs=1e-9), (r, g)  # the same predictions
        if r["kind"] != "train":
            assert g["n"] == r["n"]  # every evaluation image counted exactly once


def _wait_for_step(run: Path, proc: subprocess.Popen, step: int, timeout: float = 60) -> None:
    t0 = time.monotonic()
    while True:
        try:
            if any(r["step"] >= step for r in metrics(run) if r["kind"] == "train"):
                return
        except (FileNotFoundError, ValueError):
            pass
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() - t0 < timeout, "training did not get going"
        time.sleep(0.05)


def _ranks(proc: subprocess.Popen) -> dict[int, psutil.Process]:
    """The worker processes torchrun started, by rank (from their environment)."""
    out = {}
    for p in psutil.Process(proc.pid).children(recursive=True):
        try:
            env = p.environ()
        except psutil.Error:
            continue
        if "RANK" in env and "mnistflow" in " ".join(p.cmdline()):
            out[int(env["RANK"])] = p
    return out


# --- without processes ---------------------------------------------------------------------------

@pytest.mark.parametrize("world", [2, 3, 7])
def test_evaluation_shards_count_every_image_once(world):
    shards = [epoch_order(1000, 0, 0, r, world, shuffle=False, pad=False) for r in range(world)]
    assert sorted(torch.cat(shards).tolist()) == list(range(1000))
    train = [epoch_order(1000, 0, 0, r, world) for r in range(world)]  # padded: equal lengths
    assert len({len(t) for t in train}) == 1 and len(torch.cat(train)) == -(-1000 // world) * world


def test_steps_per_epoch_depend_only_on_the_global_batch(mnist_records):
    rec = open_records(mnist_records)
    one = len(make_loader(rec, "train", batch_size=96))
    for world in (2, 3, 4):
        lens = {len(make_loader(rec, "train", batch_size=96 // world, rank=r, world_size=world))
                for r in range(world)}
        assert lens == {one}
    val = [make_loader(rec, "val", batch_size=700, train=False, rank=r, world_size=3, pad=False)
           for r in range(3)]
    assert sum(len(y) for L in val for _, y in L) == 5000


def test_resume_compares_the_global_batch():
    """--batch-size is the global batch, whatever the number of processes: a resume compares it
    as it is."""
    old = {"model": "mlp", "batch_size": 64}
    assert resume_differences(old, TrainConfig(model="mlp", batch_size=64)) == []
    assert resume_differences(old, TrainConfig(model="mlp", batch_size=32)) == ["batch_size: 64 -> 32"]


# --- under torchrun -----------------------------------------------------------------------------

@pytest.mark.parametrize("opt", ["adam", "muon"])
def test_two_processes_train_like_one_with_the_global_batch(mnist_records, tmp_path, opt):
    """--batch-size 64 over 2 processes (32 each) == 1 process x 64: weights, loss curve,
    evaluations; one run directory.
    Muon too: it orthogonalizes the averaged gradient's momentum, the same on every rank."""
    ref = tmp_path / "ref"
    train(model=SPEC, data=str(mnist_records), run_dir=str(ref), batch_size=64, max_steps=30,
          log_every=5, precision="fp32", threads=1, quiet=True, tensorboard=False, optimizer=opt)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    t0 = time.monotonic()
    proc = torchrun("train", "--model", SPEC, "--data", str(mnist_records), "--batch-size", "64",
                    "--max-steps", "30", "--no-tensorboard", "--json", *COMMON, "--optimizer", opt,
                    cwd=cwd)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "data parallel: 2 processes (gloo), the batch of 64 split into 32 per process" in proc.stdout
    rows = [ln.split() for ln in proc.stdout.splitlines()]
    assert sum(r[:2] == ["epoch", "step"] for r in rows) == 1  # only rank 0 prints: one table...
    assert sum(len(r) > 1 and r[1] == "30" for r in rows) == 1  # ...whose last row is step 30
    (run,) = list((cwd / "runs").iterdir())  # one run directory, named by rank 0
    assert sorted(p.name for p in cwd.iterdir()) == ["runs"]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and summary["global_batch"] == 64 and summary["steps"] == 30
    assert summary["ranks_in_sync"] is True  # every rank's parameters equal rank 0's, bit for bit
    assert json.loads((run / "summary.json").read_text())["ranks_in_sync"] is True
    worst = weights_close(ref, run)
    assert_same_curves(metrics(ref), metrics(run))
    payload = checkpoint.load(checkpoint.find_latest(run / "checkpoints"))
    assert payload["train_state"]["world_size"] == 2 and payload["config"]["batch_size"] == 64
    print(f"max |w(1 x 64) - w(2 x 32)| = {worst:.3g}; torchrun run {elapsed:.1f} s")


def test_whiten_under_torchrun_gives_every_rank_the_same_start(mnist_records, tmp_path):
    """--whiten is data-dependent: each rank computes it from the same images, rank 0's result
    is broadcast, and the ranks stay bit-for-bit in sync."""
    proc = torchrun("train", "--model", SPEC, "--data", str(mnist_records), "--batch-size", "32",
                    "--max-steps", "3", "--no-tensorboard", "--json", "--whiten", "--run-dir",
                    str(tmp_path / "run"), *COMMON, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("whitened conv1: 8 of 8 filters from 784,000 patches of 25 values") == 1
    assert json.loads(proc.stdout.strip().splitlines()[-1])["ranks_in_sync"] is True


def test_nproc_launcher_and_resume_with_another_number_of_processes(mnist_records, tmp_path):
    """1 process (batch 64) to step 20, resumed by `--nproc 2` (32 each) to step 40, equals 40
    uninterrupted steps; a resume that changes the batch is refused."""
    args = dict(model="softmax", data=str(mnist_records), batch_size=64, log_every=5,
                precision="fp32", threads=1, quiet=True, tensorboard=False, checkpoint_every=10)
    ref, run = tmp_path / "ref", tmp_path / "run"
    train(run_dir=str(ref), max_steps=40, **args)
    train(run_dir=str(run), max_steps=20, **args)
    bad = run_cli("train", "--resume", "--run-dir", str(run), "--nproc", "2", "--batch-size", "128",
                  "--max-steps", "40")
    assert bad.returncode != 0
    assert "batch_size: 64 -> 128" in bad.stderr
    proc = run_cli("train", "--resume", "--run-dir", str(run), "--nproc", "2", "--max-steps", "40",
                   "--threads", "1", "--no-quiet", env={"MNISTFLOW_DIST_TIMEOUT": "20"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "saved by 1 process(es), continued by 2" in proc.stdout
    assert "the batch of 64 split into 32 per process" in proc.stdout and "OMP_NUM_THREADS" not in proc.stderr
    weights_close(ref, run)
    assert_same_curves(metrics(ref), metrics(run), resumed_at=20)
    assert json.loads((run / "summary.json").read_text())["world_size"] == 2


def test_sigterm_stops_every_rank_at_one_step_and_one_process_resumes(mnist_records, tmp_path):
    run, ref = tmp_path / "run", tmp_path / "ref"
    proc = torchrun("train", "--model", "softmax", "--data", str(mnist_records), "--run-dir", str(run),
                    "--batch-size", "32", "--max-steps", "2000", "--checkpoint-every", "1000", *COMMON,
                    env=inject.env(data_delay=0.01), popen=True)  # ~100 steps/s
    _wait_for_step(run, proc, 15)
    proc.send_signal(signal.SIGTERM)  # torchrun passes it to every rank
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode != 0, out
    steps = {int(ln.split(" at step ")[1].split(";")[0]) for ln in out.splitlines() if "interrupted by SIGTERM" in ln}
    assert len(steps) == 1, out  # both ranks stopped at the same step...
    (step,) = steps
    assert "rank 1: interrupted by SIGTERM" in out and "rank 0 saved the checkpoint" in out
    last = checkpoint.find_latest(run / "checkpoints")
    assert last.name == checkpoint.checkpoint_name(step)  # ...which rank 0 saved
    assert checkpoint.read_header(last)["reason"] == "interrupt"
    # one process continues it (the same batch of 32, all in one process) to step 60
    s = train(run_dir=str(run), resume=True, max_steps=60, threads=1, quiet=True)
    assert s["steps"] == 60 and s["world_size"] == 1 and s["global_batch"] == 32
    train(model="softmax", data=str(mnist_records), run_dir=str(ref), batch_size=32, max_steps=60,
          log_every=5, precision="fp32", threads=1, quiet=True, tensorboard=False)
    weights_close(ref, run)
    assert_same_curves(metrics(ref), metrics(run), resumed_at=step)


@pytest.mark.parametrize("how", ["kill", pytest.param("hang", marks=pytest.mark.slow)])
def test_a_dead_or_hung_rank_ends_the_job_promptly(mnist_records, tmp_path, how):
    """kill -9 of rank 1: rank 0's next collective fails at once (well within its 30 s timeout).
    SIGSTOP of rank 1 (a hang):
    rank 0's collective times out ($MNISTFLOW_DIST_TIMEOUT, 10 s here: 5 s once timed out a
    healthy step on a VM stalled by its host) and it exits; torchrun
    then stops the hung process (SIGTERM, and SIGKILL 30 s later: a stopped process ignores
    SIGTERM). Either way: a non-zero exit within a bound, never a hang."""
    run = tmp_path / "run"
    proc = torchrun("train", "--model", "softmax", "--data", str(mnist_records), "--run-dir", str(run),
                    "--batch-size", "32", "--max-steps", "5000", "--no-tensorboard", *COMMON,
                    env={**inject.env(data_delay=0.01),
                         "MNISTFLOW_DIST_TIMEOUT": "30" if how == "kill" else "10"}, popen=True)
    ranks: dict = {}
    try:
        _wait_for_step(run, proc, 10)
        ranks = _ranks(proc)
        assert sorted(ranks) == [0, 1]
        t0 = time.monotonic()
        if how == "kill":
            ranks[1].kill()  # no chance to say goodbye
        else:
            ranks[1].suspend()
        out = proc.communicate(timeout=90)[0]
        took = time.monotonic() - t0
    finally:
        for p in [*ranks.values(), psutil.Process(proc.pid)] if proc.poll() is None else []:
            try:
                p.kill()
            except psutil.Error:
                pass
    assert proc.returncode != 0
    assert took < (15 if how == "kill" else 60), took  # kill: detected at once, not by the timeout
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks.values())
    # Rank 0 says why, unless torchrun saw rank 1 die first and stopped rank 0 itself (a race
    # that a loaded machine can lose): then torchrun's report names the dead rank as the cause.
    stopped_by_torchrun = (how == "kill" and "exitcode  : -15" in out
                           and "Root Cause" in out and "Signal 9 (SIGKILL)" in out)
    assert "rank 0 of 2: a collective operation failed" in out or stopped_by_torchrun, out[-3000:]
    if how == "hang":
        assert "Timed out" in out and "given up on after 10 s ($MNISTFLOW_DIST_TIMEOUT)" in out
    print(f"{how}: the job ended {took:.2f} s after rank 1 stopped (exit {proc.returncode})")


def test_torchrun_restarts_continue_from_the_latest_checkpoint(mnist_records, tmp_path):
    """--max-restarts with --resume: after a rank dies the job restarts and resumes."""
    run = tmp_path / "run"
    args = ["train", "--resume", "--model", "softmax", "--data", str(mnist_records), "--run-dir", str(run),
            "--batch-size", "32", "--max-steps", "120", "--checkpoint-every", "20", "--no-tensorboard", *COMMON]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "--max-restarts=1", "-m", "mnistflow", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MNISTFLOW_DIST_TIMEOUT": "10", **inject.env(data_delay=0.01)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        _wait_for_step(run, proc, 45)
        _ranks(proc)[1].kill()
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "note: no checkpoint" in out and "resumed from" in out and "step 40" in out
    assert json.loads((run / "summary.json").read_text())["steps"] == 120


def test_a_recipe_keeps_its_batch_schedule_and_promise_on_two_processes(mnist_records, tmp_path):
    """`--recipe fast --nproc 2` (the docs' example): the recipe's batch of 384 is split 192 + 192,
    so it runs the steps and schedule of one process and keeps its >= 99.0% test accuracy (the
    batch doubled to 768 before, and ended at 98.8%)."""
    proc = run_cli("train", "--recipe", "fast", "--data", str(mnist_records), "--run-dir", str(tmp_path / "r"),
                   "--nproc", "2", "--threads", "1", "--no-quiet", "--json", env={"MNISTFLOW_DIST_TIMEOUT": "60"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "the batch of 384 split into 192 per process" in proc.stdout
    s = json.loads(proc.stdout.strip().splitlines()[-1])
    assert s["world_size"] == 2 and s["global_batch"] == 384 and s["steps"] == 65  # one process: 65
    assert s["test_acc"] >= 0.99, s["test_acc"]
