"""Training next to a busy process: each recipe idle and beside one (or more) busy neighbours, under
libgomp's own wait policy (what mnistflow ran with before) and mnistflow's default, one run.

    MNISTFLOW_DATA=../shared/data/mnist python benchmarks/busy_neighbour.py [--max-steps 40] [--repeats 3]

Each cell is a fresh ``python -m mnistflow train --recipe R --max-steps N`` process; the time is its
summary.json ``train_s`` (training steps only: no start-up, evaluation or checkpoint writes), the
median of ``--repeats``. A busy neighbour is a ``while True: pass`` process this script starts before
the run and stops after it (it is in this script's session, so in the same scheduler autogroup as
the run where the kernel groups by session). Threads: mnistflow's default (which may shed threads when it sees other
processes busy) and ``--threads`` = all usable cores (what users and the other benchmarks pass).
Policies, in the environment of the run:
  old      ``GOMP_SPINCOUNT=300000``: libgomp's default (an idle thread spins ~300k rounds before it
           sleeps), exactly what mnistflow ran with before it set a policy
  active   ``OMP_WAIT_POLICY=ACTIVE`` (spin for minutes)
  passive  ``OMP_WAIT_POLICY=PASSIVE`` (sleep at once): mnistflow's default from issue 19 until
           2026-11-27
  auto     nothing set: mnistflow's choice at import (``core.openmp``): libgomp's default when no
           other process is running, passive beside one (the neighbour starts before the run)
  spinN    ``OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=N``: a middle ground
All cells are interleaved (repeat by repeat, policy and load alternating) so that drift in the
machine's speed hits every column alike. "busy/idle" is the slowdown a neighbour causes (the goal:
2x or less); "idle vs old" is the policy's cost on an idle machine (1.00: none). With the
defaults (4 recipes, 2 thread settings, 3 policies, 2 repeats: 96 runs) it takes about 12
minutes on 2 idle cores (estimated; the header says how long it took).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine

# steps a run: ~2-5 s of training each on 2 Zen 2 cores (softmax's steps take well under 1 ms)
STEPS = {"softmax": 300, "seed-cnn": 25, "fast": 30, "best": 6}
OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def policy_env(policy: str) -> dict:
    """The OpenMP variables a policy name stands for (see the module docstring)."""
    if policy == "old":
        return {"GOMP_SPINCOUNT": "300000"}
    if policy == "active":
        return {"OMP_WAIT_POLICY": "ACTIVE"}
    if policy == "passive":
        return {"OMP_WAIT_POLICY": "PASSIVE"}
    if policy == "auto":
        return {}
    if policy.startswith("spin") and policy[4:].isdigit():
        return {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": policy[4:]}
    raise SystemExit(f"unknown policy {policy!r}: old, active, passive, auto or spinN")


class Neighbours:
    """``n`` busy processes, one core's worth of work each, for the duration of a ``with``."""

    def __init__(self, n: int):
        self.n, self.procs = n, []

    def __enter__(self):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        if self.procs:
            time.sleep(0.5)  # running flat out before the run samples the load
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()


def train_s(recipe: str, data: str, steps: int, threads: int | None, policy: str, out: Path) -> tuple[float, int]:
    """One run in a fresh process: its summary.json ``train_s`` and the threads it trained on."""
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS + ("MNISTFLOW_THREADS",)}
    env.update(policy_env(policy))
    cmd = [sys.executable, "-m", "mnistflow", "train", "--recipe", recipe, "--data", data,
           "--max-steps", str(steps), "--run-dir", str(out), "--quiet", "--no-tensorboard",
           "--no-validate", "--tta", "0", "--keep-checkpoints", "0"]  # less around the timed steps
    if threads:
        cmd += ["--threads", str(threads)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return summary["train_s"], summary["threads"]


def markdown(rows: list[dict], cols: list[str]) -> str:
    """Rows of dicts as a markdown table (BENCHMARKS.md's), seconds with 3 decimals."""
    cell = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(out + ["| " + " | ".join(cell(r.get(c, "")) for c in cols) + " |" for r in rows])


def main() -> None:
    cores = len(os.sched_getaffinity(0))
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("MNISTFLOW_DATA", "../shared/data/mnist"))
    ap.add_argument("--recipes", nargs="+", default=list(STEPS))
    ap.add_argument("--max-steps", type=int, help="training steps a run (default: "
                    + ", ".join(f"{r} {n}" for r, n in STEPS.items()) + ")")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--policies", nargs="+", default=["old", "passive", "auto"],
                    help="the first is the baseline: old, active, passive, auto, spinN (default: old passive auto)")
    ap.add_argument("--neighbours", type=int, default=1, help="busy processes beside a busy run")
    ap.add_argument("--threads", nargs="+", default=["default", str(cores)],
                    help="'default' (mnistflow's choice) and/or numbers")
    a = ap.parse_args()
    for p in a.policies:
        policy_env(p)
    tmp = Path(tempfile.mkdtemp())
    t0 = time.perf_counter()
    train_s(a.recipes[0], a.data, 1, None, a.policies[-1], tmp / "warm-up")  # prepares the cache
    loads = {"idle": 0, "busy": a.neighbours}
    times: dict = {}
    used: dict = {}  # the threads a cell trained on (mnistflow's default may shed some)
    for rep in range(a.repeats):
        for recipe in a.recipes:
            for th in a.threads:
                # alternate the order from repeat to repeat: no cell always runs first
                cells = [(p, ld) for p in a.policies for ld in loads]
                for policy, load in (cells if rep % 2 == 0 else cells[::-1]):
                    with Neighbours(loads[load]):
                        s, used[recipe, th, policy, load] = train_s(recipe, a.data, a.max_steps or STEPS.get(recipe, 30), None if th == "default" else int(th),
                                    policy, tmp / f"{recipe}-{th}-{policy}-{load}-{rep}")
                    times.setdefault((recipe, th, policy, load), []).append(s)
    wall = time.perf_counter() - t0
    rows, base = [], a.policies[0]
    for recipe in a.recipes:
        for th in a.threads:
            med = {(p, ld): statistics.median(times[recipe, th, p, ld]) for p in a.policies for ld in loads}
            row = {"recipe": recipe, "threads": th}
            for p in a.policies:
                row[f"{p} idle s"] = med[p, "idle"]
                row[f"{p} busy s"] = med[p, "busy"]
                if th == "default":  # say what it chose: idle, busy
                    row[f"{p} busy s"] = f"{med[p, 'busy']:.3f} ({used[recipe, th, p, 'busy']} thr)"
                    row[f"{p} idle s"] = f"{med[p, 'idle']:.3f} ({used[recipe, th, p, 'idle']} thr)"
                row[f"{p} busy/idle"] = f"{med[p, 'busy'] / med[p, 'idle']:.2f}x"
                if p != base:
                    row[f"{p} idle vs {base}"] = f"{med[p, 'idle'] / med[base, 'idle']:.2f}x"
            rows.append(row)
    cols = ["recipe", "threads"] + [c for p in a.policies for c in
                                    (f"{p} idle s", f"{p} busy s", f"{p} busy/idle")
                                    + ((f"{p} idle vs {base}",) if p != base else ())]
    print(machine())
    steps = ", ".join(f"{r} {a.max_steps or STEPS.get(r, 30)}" for r in a.recipes)
    print(f"steps a run: {steps}; median of {a.repeats}, busy = {a.neighbours} busy process(es) "
          f"on {cores} core(s); policies: " + ", ".join(f"{p} {policy_env(p) or '(nothing set)'}"
                                                        for p in a.policies)
          + f"; the whole benchmark took {wall / 60:.1f} min")
    print(markdown(rows, cols))


if __name__ == "__main__":
    main()
