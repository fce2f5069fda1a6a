"""The time-to-accuracy curve on MNIST: for each test accuracy (99.0 / 99.3 / 99.5 / 99.6 / 99.7%)
the time mnistflow's cheapest recipe takes to reach it on every seed, beside baselines A and B
measured in the same run. Prints the table, writes it as a PNG plot (matplotlib, optional) and
records every seed's figures in the results file (src/mnistflow/training/measured.json, the entry
for this kind of machine: benchmarks/results.py), from which ``--target-acc`` picks and
benchmarks/render_docs.py renders the docs' tables.

    MNISTFLOW_DATA=../shared/data/mnist python benchmarks/frontier.py [--seeds 0 1 2]
        [--recipes fast fast-plus seed-cnn mid best] [--cap-s 300] [--png benchmarks/frontier.png]
        [--device cuda] [--no-record]

On a GPU (``--device cuda``: bf16, the records resident on the GPU) everything runs there,
the baselines too, and one untimed ``fast`` run first pays the process's one-time costs
(cuDNN/cuBLAS handles, kernels loaded on first use); ``--no-warmup`` times them in seed 0 of
the first recipe instead.

Rows:
  mnistflow   each recipe through the public API from prepared records, one run per seed: a
              level is reached by a recipe when every seed's final test accuracy is at or
              above it; the time is that recipe's median wall time (records to the end of the
              test pass), and the curve takes the cheapest recipe for each level
  A, B        as in time_to_accuracy.py (the PyTorch example; the tutorial CNN as the tutorial
              trains it), tested after every epoch until the highest level or --cap-s: the
              first epoch whose test pass is at or above each level (one seed each)
  Fashion     Fashion-MNIST's target (94.5% on every seed), from the results file: its runs
              take minutes each, so benchmarks/family.py measures them
Accuracy is read on the test set only as the final figure of each run; the recipes themselves
were chosen on validation data (BENCHMARKS.md says how).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, table  # noqa: E402
from results import (FASHION_LEVEL, LEVELS, RESULTS, baseline_result, fashion_cell, machine_kind,  # noqa: E402
                     provenance, recipe_result, record)
from time_to_accuracy import baseline_a, baseline_b  # noqa: E402

import torch  # noqa: E402


def first_reach(accs: list[float], times: list[float], level: float) -> float | None:
    """Seconds to the first test pass at or above ``level`` (None: never within the cap)."""
    return next((t for a, t in zip(accs, times) if a >= level), None)


def curve(runs: dict[str, list[dict]], level: float) -> tuple[float, str] | None:
    """(median wall s, recipe) of the cheapest recipe whose every seed reaches ``level``."""
    able = [(statistics.median(r["wall_s"] for r in rs), name) for name, rs in runs.items()
            if all(r["test_acc"] >= level for r in rs)]
    return min(able) if able else None


def plot(rows: dict[str, list[float | None]], path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, secs in rows.items():
        pts = [(100 * lv, s) for lv, s in zip(LEVELS, secs) if s is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=name)
    ax.set_yscale("log")
    ax.set_xlabel("MNIST test accuracy reached (%)")
    ax.set_ylabel("seconds (log scale)")
    ax.set_title(title, fontsize=9)
    ax.set_xticks([100 * lv for lv in LEVELS])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("MNISTFLOW_DATA", "../shared/data/mnist"))
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--recipes", nargs="+", default=["fast", "fast-plus", "seed-cnn", "mid", "best"])
    ap.add_argument("--cap-s", type=float, default=300, help="time cap per baseline")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--png", type=Path, default=Path(__file__).resolve().parent / "frontier.png")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: every row (baselines too) runs there")
    ap.add_argument("--no-warmup", action="store_true", help="GPU: no untimed run before the timed ones")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the results file to update")
    ap.add_argument("--no-record", action="store_true", help="leave the results file as it is")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import mnistflow
    from mnistflow.data.records import open_records

    tmp = Path(tempfile.mkdtemp())
    rec = open_records(mnistflow.prepare("mnist", a.data, tmp / "mnist", quiet=True))
    print(machine(a.device), flush=True)
    common = dict(data=str(rec.path), threads=a.threads, quiet=True, tensorboard=False, device=a.device)
    if a.device != "cpu" and not a.no_warmup:
        w = mnistflow.train(recipe="fast", seed=100, run_dir=str(tmp / "warmup"), **common)
        print(f"warm-up (untimed): fast seed 100, {w['wall_s']:.3f} s, test {100 * w['test_acc']:.2f}%",
              flush=True)
    runs: dict[str, list[dict]] = {}
    for recipe in a.recipes:
        runs[recipe] = [mnistflow.train(recipe=recipe, seed=s, run_dir=str(tmp / f"{recipe}{s}"), **common)
                        for s in a.seeds]
        print(f"{recipe}: test " + " ".join(f"{100 * r['test_acc']:.2f}" for r in runs[recipe])
                    + "%, wall s " + " ".join(f"{r['wall_s']:.3f}" for r in runs[recipe])
              + f" ({runs[recipe][0]['precision']})", flush=True)
    series: dict[str, list[float | None]] = {}
    picks = [curve(runs, lv) for lv in LEVELS]
    series["mnistflow (cheapest recipe)"] = [p[0] if p else None for p in picks]
    prov, baselines = provenance(a.device), {}
    if not a.no_baselines:
        b = baseline_b(rec, a.cap_s, target=max(LEVELS), device=a.device)
        series["B: tutorial CNN (Adam 1e-4, batch 50)"] = [first_reach(b["accs"], b["times"], lv) for lv in LEVELS]
        A = baseline_a(rec, cap_epochs=100, cap_s=a.cap_s, target=max(LEVELS), device=a.device)
        series["A: PyTorch example"] = [first_reach(A["accs"], A["times"], lv) for lv in LEVELS]
        print(f"B: best {100 * max(b['accs']):.2f}% in {b['epochs']} epochs; "
              f"A: best {100 * max(A['accs']):.2f}% in {A['epochs']} epochs (cap {a.cap_s:.0f} s)")
        baselines = {"A": baseline_result(prov, a.cap_s, A, LEVELS), "B": baseline_result(prov, a.cap_s, b, LEVELS)}
    precision = next(iter(runs.values()))[0]["precision"]
    if not a.no_record:
        record(machine_kind(a.device, precision), precision, "mnist",
               {name: recipe_result(prov, a.seeds, rs) for name, rs in runs.items()}, baselines, a.results)
    rows = []
    for i, lv in enumerate(LEVELS):
        row = {"test acc": f"{100 * lv:.1f}%",
               "mnistflow recipe": picks[i][1] if picks[i] else "not reached"}
        for name, secs in series.items():
            row[name.split(" (")[0] + " s"] = secs[i] if secs[i] is not None else "not reached"
        a_s = series.get("A: PyTorch example", [None] * len(LEVELS))[i]
        if a_s is not None and picks[i]:
            row["x faster than A"] = a_s / picks[i][0]
        rows.append(row)
    cols = ["test acc", "mnistflow recipe", *[n.split(" (")[0] + " s" for n in series], "x faster than A"]
    print(f"\nseeds {a.seeds}; baselines capped at {a.cap_s:.0f} s\n")
    print(table(rows, cols))
    # Fashion-MNIST's runs take minutes each: benchmarks/family.py measures them into the same file
    kind = machine_kind(a.device, precision)
    fashion = json.loads(a.results.read_text())["machines"].get(kind, {}).get("datasets", {}).get("fashion-mnist", {})
    print(f"\nFashion-MNIST {100 * FASHION_LEVEL:.1f}% on every seed ({kind}, from {a.results.name}, measured by "
          f"benchmarks/family.py): {fashion_cell(fashion.get('recipes', {}))}")
    title = machine(a.device).split(",")[0] + (f", {a.threads} threads" if a.device == "cpu" else "") \
        + f"; seeds {a.seeds}"
    print(f"\nplot: {a.png}" if plot(series, a.png, title) else "\nplot: matplotlib is not installed")


if __name__ == "__main__":
    main()
