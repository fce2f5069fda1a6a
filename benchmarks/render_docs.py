"""Render the measured figures in README.md and BENCHMARKS.md from the results file.

    python benchmarks/render_docs.py            # rewrite the tables in place
    python benchmarks/render_docs.py --check    # exit 1 when a doc is out of date (a unit test runs it)

Each table sits between ``<!-- measured:NAME -->`` and ``<!-- /measured -->``; everything else
in the docs is left as written. The figures come from src/mnistflow/training/measured.json,
which benchmarks/frontier.py and benchmarks/family.py write (benchmarks/results.py).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import FASHION_LEVEL, LEVELS, REPO, RESULTS, cheapest_to, fashion_cell, secs  # noqa: E402

from mnistflow.training.recipes import RECIPES, median_wall_s  # noqa: E402

KINDS = {"cpu": "CPU, fp32", "cpu-bf16": "CPU, bf16", "gpu": "GPU"}
DATASETS = {"mnist": "MNIST", "fashion-mnist": "Fashion-MNIST"}
BASELINES = {"A": "A: the PyTorch example", "B": "B: the tutorial's CNN"}
DOCS = {"README.md": ("readme",), "BENCHMARKS.md": ("machines", "seeds", "frontier")}
BLOCK = re.compile(r"(<!-- measured:([a-z-]+) -->\n)(.*?)(<!-- /measured -->)", re.S)


def pct(a: float) -> str:
    return f"{100 * a:.2f}"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join([_row(header), _row(["---"] * len(header)), *map(_row, rows)]) + "\n"


def _runs(data: dict, kind: str, dataset: str) -> dict[str, dict]:
    """The recipes' runs on that machine and dataset, in the file's order (the benchmarks')."""
    runs = data["machines"].get(kind, {}).get("datasets", {}).get(dataset, {}).get("recipes", {})
    return {name: r for name, r in runs.items() if name in RECIPES}


def _kinds(data: dict, dataset: str) -> list[str]:
    return [k for k in KINDS if _runs(data, k, dataset)]


def readme(data: dict) -> str:
    """Per dataset: each recipe's test accuracy (lowest-highest seed) and median wall seconds,
    one column per kind of machine; then the machines."""
    out = []
    for ds, title in DATASETS.items():
        kinds = _kinds(data, ds)
        names = list(dict.fromkeys(n for k in kinds for n in _runs(data, k, ds)))
        rows = []
        for n in names:
            cells = []
            for k in kinds:
                r = _runs(data, k, ds).get(n)
                cells.append(f"{pct(min(r['test_acc']))}-{pct(max(r['test_acc']))}%, {secs(median_wall_s(r))} s"
                             if r else "")
            rows.append([f"`{n}`", *cells])
        out.append(f"**{title}**, test accuracy (lowest-highest seed) and median seconds:\n\n"
                   + _table(["recipe", *(KINDS[k] for k in kinds)], rows))
    machines = {k: next(iter(_runs(data, k, "mnist").values()))["machine"] for k in _kinds(data, "mnist")}
    out.append("Machines: " + "; ".join(f"{KINDS[k]}: {m}" for k, m in machines.items()) + ".\n")
    return "\n".join(out)


def machines(data: dict) -> str:
    """Which machine, torch, commit and date each kind's figures come from."""
    rows = []
    for kind in KINDS:
        for ds in DATASETS:
            entry = data["machines"].get(kind, {}).get("datasets", {}).get(ds)
            if not entry:
                continue
            groups: dict[tuple, list[str]] = {}
            for name, r in [*_runs(data, kind, ds).items(), *entry.get("baselines", {}).items()]:
                groups.setdefault((r["machine"], r["torch"], r["commit"][:7], r["date"]), []).append(name)
            for (m, torch, commit, date), names in groups.items():
                rows.append([KINDS[kind], DATASETS[ds], m, torch, commit, date, ", ".join(names)])
    return _table(["kind", "dataset", "machine", "torch", "commit", "date", "what"], rows)


def seeds(data: dict) -> str:
    """Every seed's test accuracy and wall seconds, per kind of machine and dataset."""
    out = []
    for kind in KINDS:
        for ds, title in DATASETS.items():
            runs = _runs(data, kind, ds)
            if not runs:
                continue
            rows = []
            for n, r in runs.items():
                walls = " / ".join(secs(s) for s in r["wall_s"]) if r["wall_s"] else "median only"
                rows.append([n, " / ".join(map(str, r["seeds"])), " / ".join(pct(a) for a in r["test_acc"]),
                             pct(statistics.median(r["test_acc"])), walls, secs(median_wall_s(r))])
            out.append(f"**{KINDS[kind]}, {title}**\n\n" + _table(
                ["recipe", "seeds", "test %", "median %", "wall s", "median s"], rows))
    return "\n".join(out)


def frontier(data: dict) -> str:
    """MNIST: the cheapest recipe whose every seed reaches each level, per kind of machine, and
    the baselines' time to 99.0% measured in the same runs; then Fashion-MNIST's target."""
    kinds = _kinds(data, "mnist")
    rows = []
    for level in LEVELS:
        hits = [cheapest_to(_runs(data, k, "mnist"), level) for k in kinds]
        rows.append([f"{100 * level:.1f}%", *(f"`{h[1]}` {secs(h[0])} s" if h else "not reached" for h in hits)])
    rows.append([f"Fashion-MNIST {100 * FASHION_LEVEL:.1f}%", *(fashion_cell(_runs(data, k, "fashion-mnist"))
                                                             for k in kinds)])
    for b, title in BASELINES.items():
        cells = []
        for k in kinds:
            base = data["machines"][k]["datasets"]["mnist"].get("baselines", {}).get(b)
            if not base:
                cells.append("not measured")
                continue
            to99 = base["reached_s"].get("0.990")
            fast = median_wall_s(_runs(data, k, "mnist")["fast"]) if "fast" in _runs(data, k, "mnist") else None
            times = f"99.0% at {secs(to99)} s" + (f", {to99 / fast:.0f}x `fast`'s time" if fast else "") if to99 \
                else "99.0% not reached"
            cells.append(f"{times}; best {pct(base['best_acc'])}% ({base['epochs']} epochs, cap {base['cap_s']:g} s)")
        rows.append([title, *cells])
    return _table(["MNIST test accuracy, every seed", *(KINDS[k] for k in kinds)], rows)


RENDER = {"readme": readme, "machines": machines, "seeds": seeds, "frontier": frontier}


def render(text: str, data: dict, names: tuple[str, ...]) -> str:
    """``text`` with each of its measured blocks rendered anew; an error when one of ``names``
    is missing or a marker names no known block."""
    found = [m.group(2) for m in BLOCK.finditer(text)]
    unknown, missing = set(found) - set(RENDER), set(names) - set(found)
    if unknown or missing:
        raise SystemExit(f"render_docs: unknown blocks {sorted(unknown)}, missing blocks {sorted(missing)}")
    return BLOCK.sub(lambda m: m.group(1) + RENDER[m.group(2)](data) + m.group(4), text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a doc is out of date, change nothing")
    ap.add_argument("--results", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    data = json.loads(a.results.read_text())
    stale = []
    for doc, names in DOCS.items():
        path = REPO / doc
        text = path.read_text()
        new = render(text, data, names)
        if new != text:
            stale.append(doc)
            if not a.check:
                path.write_text(new)
    if stale:
        verb = "out of date" if a.check else "rendered"
        print(f"{verb}: {', '.join(stale)}" + (" (run python benchmarks/render_docs.py)" if a.check else ""))
    return 1 if stale and a.check else 0


if __name__ == "__main__":
    sys.exit(main())
