"""Elastic, fault-tolerant data parallel training on one machine (CPU, gloo, 127.0.0.1), and the
launch errors of R8 (HOSTILE-INPUTS.md): a process killed mid-run costs only the steps since
the last checkpoint (``--max-restarts``: the restart resumes by itself, bit for bit); a restart
never continues a run that the job did not start; the ranks compare their settings and data
before they train (A26, A30, A32); ``--nproc`` checks what each process would refuse before it
starts any (H10-H12, a run directory in use: H06), and its processes die with it (kill -9: H06;
SIGTERM: H09)."""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from helpers import inject
from helpers.cli import assert_one_line_error, run_cli
from integration.test_dist import metrics
from integration.test_multinode import free_port

import mnistflow
from mnistflow.artifacts import checkpoint
from mnistflow.artifacts.rundir import RunLock
from mnistflow.training.api import train

# dropout: each rank draws its own masks, so a resume must give each rank its own RNG back
DROPOUT = "fc32-relu,dropout0.5,fc10"
COMMON = ["--precision", "fp32", "--threads", "1", "--log-every", "5", "--no-tensorboard", "--optimizer", "adam"]
ENV = {"MNISTFLOW_DIST_TIMEOUT": "30", "OMP_NUM_THREADS": "1"}


def nproc_train(run: Path, records: Path, *extra: str, env: dict | None = None, timeout: float = 240):
    return run_cli("train", "--nproc", "2", "--model", DROPOUT, "--data", str(records), "--run-dir", str(run),
                   "--batch-size", "64", "--max-steps", "60", "--checkpoint-every", "20", *COMMON, *extra,
                   env={**ENV, **(env or {})}, timeout=timeout)


def error_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("mnistflow: error:")]


def assert_no_crash_output(text: str) -> None:
    """No C++ abort, no Python traceback, no torchrun report: only mnistflow's own lines."""
    for bad in ("terminate called", "Traceback", "ChildFailedError", "SignalException", "Root Cause"):
        assert bad not in text, text[-3000:]


@pytest.mark.slow  # ~45 s on 2 shared cores: two --nproc 2 runs, one restarted
def test_a_killed_process_costs_only_the_steps_since_the_checkpoint(mnist_records, tmp_path):
    """`train --nproc 2 --max-restarts 2`, no --resume: rank 1 is killed (SIGKILL) at step 30,
    after the checkpoint of step 20; torchrun restarts both processes, which resume from step
    20 by themselves, and the final weights equal the uninterrupted run's byte for byte (a
    dropout model: rank 1's masks continue its own stream, restored from the checkpoint)."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    with ThreadPoolExecutor(2) as pool:  # side by side: most of each is starting Python processes
        uninterrupted = pool.submit(nproc_train, ref, mnist_records)
        proc = nproc_train(run, mnist_records, "--max-restarts", "2",
                           env=inject.env(die_at_step={"rank": 1, "step": 30}))
        done = uninterrupted.result()
    assert done.returncode == 0, done.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "torchrun restarted this job: it continues its run" in out
    resumed = out.split("resumed from ")[1].splitlines()[0]
    assert resumed.startswith(str(run / "checkpoints" / "step-000020.pt")) and "step 20," in resumed, resumed
    # the first attempt ended with one line, from rank 0, which lost its peer
    (line,) = error_lines(out)
    assert "rank 0 of 2: a collective operation failed" in line, line
    assert_no_crash_output(out)
    assert (ref / "model.safetensors").read_bytes() == (run / "model.safetensors").read_bytes()
    train_records = lambda rs: [(r["step"], r["loss"]) for r in rs if r["kind"] == "train"]  # noqa: E731
    assert train_records(metrics(run)) == train_records(metrics(ref))  # the same curve, exactly
    s = json.loads((run / "summary.json").read_text())
    assert s["steps"] == 60 and s["world_size"] == 2 and s["ranks_in_sync"] is True


def test_a_process_killed_with_no_restart_left_is_named_in_one_line(mnist_records, tmp_path):
    """--max-restarts 0: rank 1 killed (SIGKILL) at step 10 says nothing; the launcher names it
    and exits 128 + 9, as a shell would, with no torchrun report."""
    proc = run_cli("train", "--nproc", "2", "--model", "softmax", "--data", str(mnist_records), "--run-dir",
                   str(tmp_path / "run"), "--batch-size", "64", "--max-steps", "200", *COMMON,
                   env={**ENV, **inject.env(die_at_step={"rank": 1, "step": 10})}, timeout=240)
    assert proc.returncode == 128 + 9, proc.stderr[-3000:]
    lines = error_lines(proc.stderr)
    assert lines[-1].startswith("mnistflow: error: the process of rank 1 (pid "), lines
    assert lines[-1].endswith("was killed by SIGKILL; the job stopped (--max-restarts 0)"), lines
    assert all("a collective operation failed" in ln for ln in lines[:-1]), lines  # rank 0's, if it saw it
    assert_no_crash_output(proc.stdout + proc.stderr)


def test_a_restart_never_continues_a_run_the_job_did_not_start(mnist_records, tmp_path):
    """A run directory that holds an older run, under `torchrun --max-restarts 1` without
    --resume: the first start refuses it, and so does the restart (TORCHELASTIC_RESTART_COUNT
    is 1 there, but this job never trained that run): the old run is left as it was. (One
    process per start: what decides is the job's store, which torchrun keeps for one too.)"""
    old = tmp_path / "old"
    train(model="softmax", data=str(mnist_records), run_dir=str(old), batch_size=32, max_steps=10,
          checkpoint_every=5, threads=1, quiet=True, tensorboard=False)
    before = {p.name: p.read_bytes() for p in sorted(old.rglob("*")) if p.is_file() and p.name != ".lock"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           "--max-restarts", "1", "-m", "mnistflow", "train", "--model", "softmax", "--data", str(mnist_records),
           "--run-dir", str(old), "--batch-size", "32", "--max-steps", "20", *COMMON]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV}, timeout=240)
    assert proc.returncode != 0
    lines = error_lines(proc.stderr)
    assert len(lines) == 2, proc.stderr[-3000:]  # the first start, then the restart
    assert all("this run directory holds a run already" in ln for ln in lines), lines
    assert "resumed from" not in proc.stdout + proc.stderr
    after = {p.name: p.read_bytes() for p in sorted(old.rglob("*")) if p.is_file() and p.name != ".lock"}
    assert after == before


# --- the ranks agree before they train (R8) -----------------------------------------------------

def two_machines(tmp_path: Path, common: list[str], per_node: list[list[str]], timeout: float = 180) -> list[str]:
    """One torchrun per "machine" on 127.0.0.1 (static rendezvous), as R8 reproduces it: the same
    ``common`` arguments, then each machine's own. Returns each machine's output."""
    port, procs, logs = free_port(), [], []
    for node, own in enumerate(per_node):
        logs.append(tmp_path / f"node{node}.log")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
               "-m", "mnistflow", "train", *common, *own]
        with open(logs[-1], "w") as f:
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **ENV}))
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                for w in psutil.Process(p.pid).children(recursive=True):
                    w.kill()
                p.kill()
    assert all(p.returncode != 0 for p in procs), [log.read_text() for log in logs]
    return [log.read_text() for log in logs]


@pytest.mark.parametrize("case", ["A26-model", "A30-steps-and-data", "A32-lr"])
def test_ranks_started_with_different_settings_stop_before_training(mnist_records, synthetic_records, tmp_path,
                                                                     case):
    """Each machine's process stops with the same one line naming each difference and where it
    is, before the model is built: no training step, no C++ abort, no traceback of ours
    (torchrun's own report of a failed process follows: it is the user's torchrun)."""
    run = tmp_path / "run"
    common = ["--recipe", "softmax", "--batch-size", "50", "--run-dir", str(run), "--max-steps", "30"]
    own, expected = {
        "A26-model": ([["--data", str(mnist_records), "--model", "softmax"],
                       ["--data", str(mnist_records), "--model", "fc32,fc10"]],
                      ["--model softmax on rank 0, fc32,fc10 on rank 1"]),
        "A30-steps-and-data": ([["--data", str(mnist_records), "--max-steps", "40"],
                                ["--data", str(synthetic_records)]],
                               ["--max-steps 40 on rank 0, 30 on rank 1", "--data mnist (sha256 "]),
        "A32-lr": ([["--data", str(mnist_records), "--lr", "0.1"], ["--data", str(mnist_records), "--lr", "0.2"]],
                   ["--lr 0.1 on rank 0, 0.2 on rank 1"]),
    }[case]
    outs = two_machines(tmp_path, common, own)
    lines = [error_lines(o) for o in outs]
    assert all(len(ls) == 1 for ls in lines), outs
    assert lines[0] == lines[1]
    assert lines[0][0].startswith("mnistflow: error: the processes were started with different settings"), lines
    for fragment in expected:
        assert fragment in lines[0][0], lines[0][0]
    package = str(Path(mnistflow.__file__).parent)
    for o in outs:
        assert "terminate called" not in o
        assert not [ln for ln in o.splitlines() if 'File "' in ln and package in ln], o  # no traceback of ours
    assert not (run / "metrics.jsonl").exists() or not any(r["kind"] == "train" for r in metrics(run))


# --- the --nproc launcher ------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["H10-no-data", "H11-a-run-there", "H12-bad-timeout", "H06-run-in-use",
                                  "uneven-batch"])
def test_nproc_refuses_a_bad_launch_with_one_line_before_starting_processes(mnist_records, tmp_path, case):
    """What every process would refuse is checked once, before any starts: one line, exit 2,
    no C++ abort, no torchrun traceback, and nothing left behind."""
    run = tmp_path / "run"
    data, env, held = str(mnist_records), dict(ENV), None
    args = ["--batch-size", "64"]
    if case == "H10-no-data":
        data = str(tmp_path / "nonexistent")
        expected = "nonexistent: no such file or directory"
    elif case == "H11-a-run-there":
        train(model="softmax", data=data, run_dir=str(run), max_steps=2, threads=1, quiet=True, tensorboard=False)
        expected = "this run directory holds a run already"
    elif case == "H12-bad-timeout":
        env["MNISTFLOW_DIST_TIMEOUT"] = "nan"
        expected = "MNISTFLOW_DIST_TIMEOUT must be a positive number of seconds"
    elif case == "H06-run-in-use":  # e.g. the processes of an earlier launch, still training
        held = RunLock(run).acquire()
        expected = f"another training is using this run directory (pid {os.getpid()})"
    else:
        args = ["--batch-size", "63"]
        expected = "--batch-size 63 (the global batch) does not split evenly over 2 processes"
    try:
        proc = run_cli("train", "--nproc", "2", "--recipe", "softmax", "--data", data, "--run-dir", str(run), *args,
                       env=env, timeout=120)
    finally:
        if held is not None:
            held.release()
    assert_one_line_error(proc, expected)
    assert_no_crash_output(proc.stdout + proc.stderr)
    if case in ("H10-no-data", "H12-bad-timeout", "uneven-batch"):
        assert not run.exists()


def test_max_restarts_belongs_to_the_nproc_launcher():
    assert_one_line_error(run_cli("train", "--recipe", "softmax", "--max-restarts", "2", timeout=120),
                          "--max-restarts restarts the processes of --nproc N")


@pytest.fixture
def subreaper():
    """This test process adopts its orphaned descendants (PR_SET_CHILD_SUBREAPER): the processes
    of a killed launcher become its children, so their exit codes can be read."""
    prctl = ctypes.CDLL(None).prctl
    prctl(36, 1, 0, 0, 0)
    yield
    prctl(36, 0, 0, 0, 0)


def _start_launcher(run: Path, records: Path) -> tuple[subprocess.Popen, list[psutil.Process]]:
    """`train --nproc 2` of a long run; returns once step 10 is logged, with its two processes."""
    cmd = [sys.executable, "-m", "mnistflow", "train", "--nproc", "2", "--model", "softmax", "--data", str(records),
           "--run-dir", str(run), "--batch-size", "64", "--max-steps", "5000", "--checkpoint-every", "1000", *COMMON]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **ENV, **inject.env(data_delay=0.01)})
    t0 = time.monotonic()
    while not any(r["kind"] == "train" and r["step"] >= 10 for r in _metrics_so_far(run)):
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() - t0 < 120, "training did not get going"
        time.sleep(0.05)
    workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if "RANK" in p.environ()]
    assert len(workers) == 2, workers
    return proc, workers


def _metrics_so_far(run: Path) -> list[dict]:
    try:
        return metrics(run)
    except (FileNotFoundError, ValueError):
        return []


def _exit_codes(workers: list[psutil.Process], timeout: float) -> list[int]:
    codes, deadline = [], time.monotonic() + timeout
    for w in workers:
        while True:
            pid, status = os.waitpid(w.pid, os.WNOHANG)
            if pid:
                codes.append(os.waitstatus_to_exitcode(status))
                break
            assert time.monotonic() < deadline, f"process {w.pid} still running {timeout} s after its launcher died"
            time.sleep(0.05)
    return codes


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_processes_of_nproc_stop_with_it(mnist_records, tmp_path, subreaper, sig):
    """kill -9 of the launcher (H06): its processes are told (the parent-death signal) and stop
    as for SIGTERM: at one step, rank 0 saving a checkpoint, exit 143; none trains on in the
    background, and the run is free to resume at once. SIGTERM to the launcher (H09): passed on,
    the same stop, and the launcher exits 143 with the processes' lines only."""
    run = tmp_path / "run"
    proc, workers = _start_launcher(run, mnist_records)
    os.kill(proc.pid, sig)
    out = proc.communicate(timeout=120)[0]
    if sig == signal.SIGKILL:  # orphans, adopted by this test
        assert _exit_codes(workers, timeout=60) == [143, 143], out[-3000:]
    else:  # the launcher waited for them, and exits as they did
        assert proc.returncode == 143, out[-3000:]
        assert not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    last = checkpoint.find_latest(run / "checkpoints")
    assert checkpoint.read_header(last)["reason"] == "interrupt"
    assert "interrupted by SIGTERM at step" in out and "continue with: mnistflow train --resume" in out
    if sig == signal.SIGKILL:
        assert "the torchrun agent that started this process is gone" in out
    assert_no_crash_output(out)
    RunLock(run).acquire().release()  # nobody holds the run: a resume may start now
