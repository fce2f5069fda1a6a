"""The benchmarks' one results file, ``src/mnistflow/training/measured.json``: what each recipe
reached, per kind of machine ("cpu": fp32, "cpu-bf16", "gpu") and dataset, every seed's test
accuracy and wall seconds, with the machine, torch, commit and date of the run.

benchmarks/frontier.py and benchmarks/family.py call ``record`` after their runs; ``mnistflow
train --target-acc`` reads the file (``mnistflow.training.recipes.measured``), and
benchmarks/render_docs.py renders README.md's and BENCHMARKS.md's tables from it. The schema
is in ``recipes.measured``'s docstring.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path

from common import cpu_line, gpu_line

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "src" / "mnistflow" / "training" / "measured.json"
LEVELS = (0.990, 0.993, 0.995, 0.996, 0.997)  # the frontier's test accuracies
FASHION_LEVEL = 0.945  # the frontier's Fashion-MNIST row (issue 42's target, in <= 300 s)


def machine_kind(device: str, precision: str) -> str:
    """The kind of machine a run's figures are for: "gpu", "cpu-bf16" (a CPU that trained in
    bf16) or "cpu" (fp32)."""
    if device.startswith("cuda"):
        return "gpu"
    return "cpu-bf16" if precision == "bf16" else "cpu"


def git_commit() -> str:
    """``git rev-parse HEAD`` of this checkout, "-dirty" appended when the tree has changes
    (the figures are then for code no commit holds); "unknown" outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def provenance(device: str) -> dict:
    """Where and when a run was measured: machine (GPU first, then the CPU and its cores),
    torch, commit and date."""
    import torch

    return {"machine": f"{gpu_line(device)}{cpu_line()}, {len(os.sched_getaffinity(0))} cores",
            "torch": torch.__version__, "commit": git_commit(), "date": datetime.date.today().isoformat()}


def recipe_result(prov: dict, seeds: list[int], summaries: list[dict]) -> dict:
    """One recipe's entry from its runs' summaries (one per seed, as ``mnistflow.train`` returns)."""
    return {**prov, "seeds": list(seeds), "test_acc": [round(s["test_acc"], 4) for s in summaries],
            "wall_s": [round(s["wall_s"], 3) for s in summaries]}


def baseline_result(prov: dict, cap_s: float, out: dict, levels: tuple[float, ...]) -> dict:
    """A baseline's entry (time_to_accuracy.py's ``baseline_a``/``baseline_b`` result): the
    seconds to the first test pass at or above each level it reached within ``cap_s``."""
    reached = {f"{lv:.3f}": round(next(t for a, t in zip(out["accs"], out["times"]) if a >= lv), 1)
               for lv in levels if max(out["accs"]) >= lv}
    return {**prov, "cap_s": cap_s, "epochs": out["epochs"], "best_acc": round(max(out["accs"]), 4),
            "reached_s": reached}


def record(kind: str, precision: str, dataset: str, recipes: dict[str, dict],
           baselines: dict[str, dict] | None = None, path: Path = RESULTS) -> None:
    """Put one run's results into the file: each recipe (and baseline) measured replaces its
    entry for this kind of machine and dataset; what this run did not measure stays as it was."""
    data = json.loads(path.read_text()) if path.exists() else {"version": 1, "machines": {}}
    entry = data["machines"].setdefault(kind, {"precision": precision, "datasets": {}})
    entry["precision"] = precision
    ds = entry["datasets"].setdefault(dataset, {"recipes": {}})
    ds["recipes"].update(recipes)
    if baselines:
        ds.setdefault("baselines", {}).update(baselines)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dumps(data))
    os.replace(tmp, path)
    print(f"results: {kind} / {dataset}: {', '.join([*recipes, *(baselines or {})])} -> {path}")


def dumps(data: dict) -> str:
    """The file's text: one line per run, so that a rerun shows in a diff as the lines of the
    runs it replaced."""
    def fmt(v, depth: int) -> str:
        if not isinstance(v, dict) or not v or "machine" in v:  # a value, or one run: one line
            return json.dumps(v)
        pad = " " * (depth + 1)
        items = ",\n".join(f"{pad}{json.dumps(k)}: {fmt(x, depth + 1)}" for k, x in v.items())
        return "{\n" + items + "\n" + " " * depth + "}"

    return fmt(data, 0) + "\n"


def secs(s: float) -> str:
    """Seconds as the benchmarks print them: 161, 76.6, 6.48, 0.083."""
    return f"{s:.0f}" if s >= 99.95 else f"{s:.3f}" if s < 1 else f"{s:#.3g}"


def cheapest_to(runs: dict[str, dict], level: float) -> tuple[float, str] | None:
    """(median wall s, recipe) of the cheapest of ``runs`` (recipe -> results-file entry) whose
    every seed's test accuracy is at or above ``level``; None when none is."""
    from mnistflow.training.recipes import median_wall_s

    able = sorted((median_wall_s(r), n) for n, r in runs.items() if min(r["test_acc"]) >= level)
    return able[0] if able else None


def fashion_cell(runs: dict[str, dict], level: float = FASHION_LEVEL) -> str:
    """The frontier's Fashion-MNIST cell for one kind of machine: the cheapest recipe at
    ``level`` on every seed, else the most accurate recipe's range over its seeds."""
    from mnistflow.training.recipes import median_wall_s

    if not runs:
        return "not measured"
    if hit := cheapest_to(runs, level):
        return f"`{hit[1]}` {secs(hit[0])} s"
    name, r = max(runs.items(), key=lambda kv: min(kv[1]["test_acc"]))
    lo, hi = min(r["test_acc"]), max(r["test_acc"])
    return f"not reached: `{name}` {100 * lo:.2f}-{100 * hi:.2f}% in {secs(median_wall_s(r))} s"
