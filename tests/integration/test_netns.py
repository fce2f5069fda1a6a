"""Several machines for real: each a Linux network namespace with its own address (10.213.N.x,
on a bridge the test makes; ``helpers.netns``), one torchrun agent in each, meeting at a c10d
rendezvous whose endpoint is inside machine 0. Machines see one filesystem: the run directory
is "storage every node sees". Needs root (skipped with the reason otherwise).

Checks: N machines train like one process with the same global batch; with ``--nnodes 1:2`` a
machine killed mid-run leaves the other going on alone from the last checkpoint, and a machine
that starts later is taken in at the next restart; with a fixed ``--nnodes 2`` the survivor ends
with one line, within the timeout. Each machine runs one process of a softmax model, a few
hundred steps at most: 2 cores run it all."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import inject, netns
from integration.test_dist import assert_same_curves, metrics, weights_close

from mnistflow.artifacts import checkpoint
from mnistflow.training.api import train

pytestmark = pytest.mark.slow  # 25-50 s each on 2 shared cores: several torchruns and their processes

RDZV_PORT = 29400  # inside machine 0's namespace: no other process there can hold it
# a dead machine is dropped after 10 s without a heartbeat (torch: 5 s x 3); shorter lets a busy CI
# machine drop a live one, whose agent could not send its heartbeat in time
FAST_RDZV = "last_call_timeout=1,keep_alive_interval=2,keep_alive_max_attempt=5,join_timeout=120"
COMMON = ["--precision", "fp32", "--threads", "1", "--log-every", "5", "--no-tensorboard"]


class Cluster(netns.Machines):
    """Machines that each run one torchrun agent (one process per machine), logging to tmp."""

    def __init__(self, n: int, tmp: Path):
        super().__init__(n)
        self.tmp = tmp
        self.agents: dict[int, subprocess.Popen] = {}

    def agent(self, i: int, train_args: list[str], nnodes: str, restarts: int = 0, env: dict | None = None,
              log: str | None = None) -> subprocess.Popen:
        e = {**os.environ, "GLOO_SOCKET_IFNAME": self.interface, "OMP_NUM_THREADS": "1", "MNISTFLOW_THREADS": "1",
             "MNISTFLOW_DIST_TIMEOUT": "30", "TORCH_CPP_LOG_LEVEL": "ERROR", **(env or {})}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", nnodes, "--nproc-per-node", "1",
               f"--max-restarts={restarts}", "--rdzv-backend", "c10d", "--rdzv-endpoint",
               f"{self.addr(0)}:{RDZV_PORT}", "--rdzv-id", "job", "--local-addr", self.addr(i),
               "--rdzv-conf", f"is_host={int(i == 0)},{FAST_RDZV}", "-m", "mnistflow", "train", *train_args]
        with open(self.tmp / (log or f"machine{i}.log"), "w") as out:
            self.agents[i] = self.popen(i, cmd, env=e, stdout=out, stderr=subprocess.STDOUT)
        return self.agents[i]

    def output(self, i: int, log: str | None = None) -> str:
        return (self.tmp / (log or f"machine{i}.log")).read_text()

    def wait(self, timeout: float, *which: int) -> None:
        deadline = time.monotonic() + timeout
        for i in which or list(self.agents):
            left = max(deadline - time.monotonic(), 0.1)
            try:
                self.agents[i].wait(timeout=left)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"machine {i} still running after {timeout} s:\n"
                                     f"{self.output(i)[-3000:]}") from None


@pytest.fixture
def cluster(tmp_path):
    why = netns.unavailable()
    if why:
        pytest.skip(why)
    made: list[Cluster] = []

    def make(n: int) -> Cluster:
        made.append(Cluster(n, tmp_path).__enter__())
        return made[-1]

    yield make
    for c in made:
        c.close()


def train_steps(run: Path) -> list[int]:
    try:
        return [r["step"] for r in metrics(run) if r["kind"] == "train"]
    except (FileNotFoundError, ValueError):
        return []


def wait_for(condition, timeout: float, what: str, alive: list[subprocess.Popen]) -> float:
    t0 = time.monotonic()
    while not condition():
        assert all(p.poll() is None for p in alive), f"a machine ended while waiting for {what}"
        assert time.monotonic() - t0 < timeout, f"no {what} within {timeout} s"
        time.sleep(0.05)
    return time.monotonic() - t0


def error_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("mnistflow: error:")]


@pytest.mark.parametrize("n", [2, 3])
def test_machines_train_like_one_process_with_the_global_batch(mnist_records, tmp_path, cluster, n):
    """N machines x 48/N images (--batch-size 48) == one process x 48: weights, loss curve and
    evaluations, to float summation order."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    c = cluster(n)
    args = ["--model", "softmax", "--data", str(mnist_records), "--run-dir", str(run), "--batch-size", "48",
            "--max-steps", "30", "--optimizer", "adam", "--json", *COMMON]
    for i in range(n):
        c.agent(i, args, nnodes=str(n))
    train(model="softmax", data=str(mnist_records), run_dir=str(ref), batch_size=48, max_steps=30, log_every=5,
          precision="fp32", threads=1, quiet=True, tensorboard=False, optimizer="adam")
    c.wait(300)
    outs = [c.output(i) for i in range(n)]
    assert [c.agents[i].returncode for i in range(n)] == [0] * n, outs
    (primary,) = [o for o in outs if "data parallel:" in o]  # rank 0 alone prints
    assert f"data parallel: {n} processes (gloo), the batch of 48 split into {48 // n} per process" in primary
    summary = json.loads(primary.strip().splitlines()[-1])
    assert summary["world_size"] == n and summary["global_batch"] == 48 and summary["ranks_in_sync"] is True
    weights_close(ref, run)
    assert_same_curves(metrics(ref), metrics(run))


def test_an_elastic_job_goes_on_without_a_dead_machine(mnist_records, tmp_path, cluster):
    """`--nnodes 1:2 --max-restarts 2`, no --resume: machine 1 is killed (kill -9 of its torchrun
    and its process) after the checkpoint of step 40; machine 0's process ends with one line,
    its torchrun starts it again alone, and it resumes by itself from step 40 (a change of world
    size: the checkpoint of two processes, continued by one) to the last step."""
    run = tmp_path / "run"
    c = cluster(2)
    args = ["--model", "softmax", "--data", str(mnist_records), "--run-dir", str(run), "--batch-size", "48",
            "--max-steps", "150", "--checkpoint-every", "20", "--json", *COMMON]
    env = inject.env(data_delay=0.02)
    a, b = c.agent(0, args, "1:2", restarts=2, env=env), c.agent(1, args, "1:2", restarts=2, env=env)
    wait_for(lambda: any(s >= 45 for s in train_steps(run)), 240, "step 45", [a, b])
    c.kill(1)
    t_kill = time.monotonic()
    wait_for(lambda: "continued by 1" in c.output(0), 120, "machine 0 going on alone", [a])
    # the resume cut metrics.jsonl back to step 40 before it said so: a later step is a new one
    wait_for(lambda: max(train_steps(run), default=0) > 40, 120, "a new step", [a])
    lost = time.monotonic() - t_kill
    c.wait(240, 0)
    out = c.output(0)
    assert a.returncode == 0, out[-3000:]
    first, alone = out.split("resumed from ")
    (line,) = error_lines(first)  # the one line of the lost machine
    assert line.startswith("mnistflow: error: rank 0 of 2: a collective operation failed"), line
    assert alone.startswith(str(run / "checkpoints" / "step-000040.pt")), alone[:200]
    assert "(saved by 2 process(es), continued by 1)" in alone.splitlines()[0]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 150 and summary["world_size"] == 1
    print(f"machine 1 killed: machine 0 took its first new step {lost:.1f} s later")


def test_a_machine_that_starts_later_is_taken_in_at_the_next_restart(mnist_records, tmp_path, cluster):
    """`--nnodes 1:2`: machine 0 starts alone; machine 1, started while it trains, is taken in at
    the next restart: torchrun stops machine 0's process (SIGTERM: it saves a checkpoint) and
    both resume from it. Torch 2.13's c10d rendezvous cannot tell a machine that joins a
    running job where its shared store is (it waits for MASTER_ADDR in vain):
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 makes each round publish it. Without that store no
    restart can be told from a new launch, so the command says --resume (docs/distributed.md)."""
    run = tmp_path / "run"
    c = cluster(2)
    args = ["--resume", "--model", "softmax", "--data", str(mnist_records), "--run-dir", str(run),
            "--batch-size", "48", "--max-steps", "150", "--checkpoint-every", "20", "--json", *COMMON]
    # alone, machine 0 trains slowly: machine 1 has the time to join before the end
    env = {**inject.env(data_delay_alone=0.2), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    a = c.agent(0, args, "1:2", restarts=1, env=env)
    wait_for(lambda: any(s >= 10 for s in train_steps(run)), 240, "step 10", [a])
    b = c.agent(1, args, "1:2", restarts=1, env=env)
    c.wait(300, 0, 1)
    out = c.output(0)
    assert a.returncode == 0 and b.returncode == 0, (out[-3000:], c.output(1)[-3000:])
    assert "no checkpoint in" in out  # the first start: --resume of an empty run directory
    alone, joined = out.split("resumed from ")
    # torchrun stopped machine 0's process to take machine 1 in: it saved where it stopped
    stopped = alone.split("interrupted by SIGTERM at step ")[1].split(";")[0]
    assert joined.startswith(str(run / "checkpoints" / checkpoint.checkpoint_name(int(stopped)))), joined[:300]
    assert "(saved by 1 process(es), continued by 2)" in joined.splitlines()[0], joined[:300]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 150 and summary["world_size"] == 2 and summary["ranks_in_sync"] is True


def test_a_dead_machine_ends_the_other_with_one_line_within_the_timeout(mnist_records, tmp_path, cluster):
    """A fixed `--nnodes 2`: machine 0 (the rendezvous endpoint and rank 0) is killed mid-run;
    machine 1's process says in one line that it lost the other, and its torchrun ends, within
    the collective timeout (30 s) and the rendezvous' own."""
    run = tmp_path / "run"
    c = cluster(2)
    args = ["--model", "softmax", "--data", str(mnist_records), "--run-dir", str(run), "--batch-size", "48",
            "--max-steps", "100000", *COMMON]
    env = inject.env(data_delay=0.02)
    a, b = c.agent(0, args, "2", env=env), c.agent(1, args, "2", env=env)
    wait_for(lambda: any(s >= 10 for s in train_steps(run)), 240, "step 10", [a, b])
    c.kill(0)
    t0 = time.monotonic()
    c.wait(120, 1)
    took = time.monotonic() - t0
    out = c.output(1)
    assert b.returncode != 0
    (line,) = error_lines(out)
    assert line.startswith("mnistflow: error: rank 1 of 2: a collective operation failed"), line
    assert "terminate called" not in out
    print(f"machine 0 died: machine 1 ended {took:.1f} s later")
