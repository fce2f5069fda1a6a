"""What fault tolerance and several "machines" cost, on this machine.

    sudo python benchmarks/bench_elastic.py --data RECORDS [--steps 300] [--out results.json]

1. A killed process: `mnistflow train --nproc 2 --max-restarts 1` (softmax, batch 64, a
   checkpoint every 50 steps); rank 1 is killed (SIGKILL) 25 steps after a checkpoint. Timed:
   from the kill to the first step of the restarted job (the failure seen, both processes
   stopped and started again, the checkpoint loaded), and the steps it must redo.
2. Machines as Linux network namespaces (root; tests/helpers/netns.py): 1, 2 and 3 "machines",
   one torchrun and one training process each, meeting at a c10d rendezvous, the same global
   batch (48) and steps; and one plain process for reference. All share this machine's cores:
   more machines do not train faster here, the table shows what the rendezvous, the process
   group and the collectives cost (overhead, not speed-up).

The machine line names the CPU (lscpu's model name, family and model) and the load average at
the start: on a shared machine the numbers move with the neighbours.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # helpers.netns: the namespaces of the tests
from common import machine, table  # noqa: E402

COMMON = ["--model", "softmax", "--precision", "fp32", "--threads", "1", "--no-tensorboard", "--optimizer", "adam"]
ENV = {"MNISTFLOW_THREADS": "1", "OMP_NUM_THREADS": "1", "MNISTFLOW_DIST_TIMEOUT": "30", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def steps_logged(run: Path) -> list[int]:
    try:
        return [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()
                if '"train"' in ln]
    except (FileNotFoundError, ValueError):
        return []


def wait(cond, proc: subprocess.Popen, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        if proc.poll() is not None:
            raise SystemExit(f"the run ended while waiting for {what}")
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"no {what} within {timeout} s")
        time.sleep(0.01)
    return time.monotonic()


def killed_worker(data: str, tmp: Path, every: int = 50, after: int = 25) -> dict:
    """Kill rank 1 ``after`` steps past the checkpoint of step ``every``; time to the first new step."""
    import psutil

    run = tmp / "killed"
    cmd = [sys.executable, "-m", "mnistflow", "train", "--nproc", "2", "--max-restarts", "1", "--data", data,
           "--run-dir", str(run), "--batch-size", "64", "--max-steps", "3000", "--checkpoint-every", str(every),
           "--log-every", "1", "--quiet", *COMMON]
    t_start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **ENV})
    try:
        t_first = wait(lambda: bool(steps_logged(run)), proc, 300, "a first step")
        target = every + after
        wait(lambda: max(steps_logged(run), default=0) >= target, proc, 300, f"step {target}")
        at = max(steps_logged(run))
        ranks = {int(p.environ()["RANK"]): p for p in psutil.Process(proc.pid).children(recursive=True)
                 if "RANK" in p.environ()}
        size = (run / "metrics.jsonl").stat().st_size
        t_kill = time.monotonic()
        ranks[1].send_signal(signal.SIGKILL)
        # the restarted job cuts metrics.jsonl back to the checkpoint's step, then logs past it
        wait(lambda: (run / "metrics.jsonl").stat().st_size < size, proc, 300, "the resume")
        t_new = wait(lambda: max(steps_logged(run), default=0) > every, proc, 300, "a new step")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {"start_to_first_step_s": round(t_first - t_start, 2), "killed_at_step": at,
            "checkpoint_step": every, "steps_redone": at - every, "kill_to_first_new_step_s": round(t_new - t_kill, 2)}


def nodes(data: str, tmp: Path, n: int, steps: int) -> dict:
    """n namespace machines (0: one plain process, no torchrun): end-to-end and per-step times."""
    from helpers.netns import Machines

    run = tmp / f"nodes{n}"
    args = ["train", "--data", data, "--run-dir", str(run), "--batch-size", "48", "--max-steps", str(steps),
            "--log-every", "50", "--json", *COMMON]
    env = {**os.environ, **ENV}
    t0 = time.monotonic()
    if n == 0:
        out = subprocess.run([sys.executable, "-m", "mnistflow", *args], capture_output=True, text=True, env=env,
                             timeout=900).stdout
    else:
        with Machines(n) as m:
            env["GLOO_SOCKET_IFNAME"] = m.interface
            procs = []
            for i in range(n):
                cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(n), "--nproc-per-node", "1",
                       "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{m.addr(0)}:29400", "--rdzv-id", "bench",
                       "--local-addr", m.addr(i), "--rdzv-conf", f"is_host={int(i == 0)},last_call_timeout=1",
                       "-m", "mnistflow", *args]
                procs.append(m.popen(i, cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
            outs = [p.communicate(timeout=900)[0] for p in procs]
            out = next(o for o in outs if o.strip().startswith("{") or "\n{" in o)
    wall = time.monotonic() - t0
    s = json.loads(out.strip().splitlines()[-1])
    return {"machines": n or "1 (no torchrun)", "processes": max(n, 1), "world_size": s["world_size"],
            "launch_to_end_s": round(wall, 1), "train_s": s["train_s"],
            "ms_per_step": round(1000 * s["train_s"] / steps, 2), "train_img_per_s": s["train_img_per_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="prepared records (mnistflow prep mnist --out ...)")
    ap.add_argument("--steps", type=int, default=300, help="training steps of each namespace run")
    ap.add_argument("--skip-kill", action="store_true")
    ap.add_argument("--skip-nodes", action="store_true")
    ap.add_argument("--out", type=Path, help="write the results as JSON")
    a = ap.parse_args()
    print(machine(), f"; load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    results: dict = {"machine": machine(), "load_average": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if not a.skip_kill:
            results["killed_worker"] = k = killed_worker(str(Path(a.data).resolve()), tmp)
            print("\nA killed process (--nproc 2 --max-restarts 1, softmax, batch 64, checkpoint every 50 steps)")
            print(table([k], list(k)), flush=True)
        if not a.skip_nodes:
            from helpers.netns import unavailable

            why = unavailable()
            if why:
                print(f"\nnamespace machines skipped: {why}")
            else:
                rows = [nodes(str(Path(a.data).resolve()), tmp, n, a.steps) for n in (0, 1, 2, 3)]
                results["nodes"] = rows
                print(f"\nMachines as network namespaces (softmax, global batch 48, {a.steps} steps, one process "
                      "each, all on this machine's cores: overhead, not speed-up)")
                print(table(rows, list(rows[0])), flush=True)
    if a.out:
        a.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
