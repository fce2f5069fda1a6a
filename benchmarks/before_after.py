"""A change's effect on the recipes: the same recipes and seeds trained by the code at a git ref
(before) and by the working tree (after), interleaved in one sitting (before, after, before, ...)
so that the machine's drift hits both alike. Each run is its own process, from records each tree
prepared itself; the figures are each run's summary (test accuracy, wall seconds from prepared
records to the end of the test pass).

    MNISTFLOW_DATA=../shared/data/mnist python benchmarks/before_after.py --base d26e7d6 \\
        [--recipes fast seed-cnn best] [--seeds 0 1] [--threads 2] [--device cuda]

``--base-tree DIR`` instead of ``--base``: the before code as a folder (``git archive REF``), for a
machine without the repository's history.

On a CPU a refactoring that changes no arithmetic gives the very same accuracy seed for seed;
the wall-time ratio (after / before, median over seeds) is the speed change.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RUN = """
import json, sys
import mnistflow
steps = {"max_steps": int(sys.argv[7])} if int(sys.argv[7]) else {}
s = mnistflow.train(recipe=sys.argv[1], data=sys.argv[2], seed=int(sys.argv[3]), run_dir=sys.argv[4],
                    threads=int(sys.argv[5]), device=sys.argv[6], quiet=True, tensorboard=False, **steps)
print(json.dumps({k: s[k] for k in ("test_acc", "wall_s", "train_s", "train_img_per_s", "precision")}))
"""
PREP = "import sys, mnistflow; mnistflow.prepare('mnist', sys.argv[1], out=sys.argv[2], quiet=True)"


def _python(tree: Path, code: str, *args: str, home: Path) -> str:
    """Run ``code`` with ``tree``'s mnistflow (its src/ first on the path); its stdout."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "MNISTFLOW_HOME": str(home)}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    return proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    base = ap.add_mutually_exclusive_group(required=True)
    base.add_argument("--base", help="the git ref of 'before'")
    base.add_argument("--base-tree", type=Path, help="the 'before' code as a folder (git archive REF)")
    ap.add_argument("--data", default=os.environ.get("MNISTFLOW_DATA", str(REPO.parent / "shared/data/mnist")))
    ap.add_argument("--recipes", nargs="+", default=["fast", "seed-cnn", "best"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-steps", type=int, default=0,
                    help="stop each run here (0: the whole recipe): many short runs, interleaved, "
                         "compare the speed of a step more finely than a few whole ones")
    ap.add_argument("--rounds", type=int, default=1, help="before/after pairs per recipe and seed")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = a.base_tree.resolve() if a.base_tree else tmp / "before"
        if a.base:
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(base), a.base], check=True)
        try:
            trees = {"before": base, "after": REPO}
            for name, tree in trees.items():  # each its own records (and its own kernel cache)
                _python(tree, PREP, a.data, str(tmp / f"records-{name}"), home=tmp / f"home-{name}")
            res: dict[tuple[str, str], list[dict]] = {}
            for recipe in a.recipes:
                for seed, k in ((seed, k) for seed in a.seeds for k in range(a.rounds)):
                    for name, tree in trees.items():
                        out = _python(tree, RUN, recipe, str(tmp / f"records-{name}"), str(seed),
                                      str(tmp / f"run-{name}-{recipe}-{seed}-{k}"), str(a.threads), a.device,
                                      str(a.max_steps), home=tmp / f"home-{name}")
                        r = json.loads(out.strip().splitlines()[-1])
                        res.setdefault((recipe, name), []).append(r)
                        print(f"{recipe} seed {seed} {name}: {100 * r['test_acc']:.2f}% {r['wall_s']:.2f} s "
                              f"({r['train_img_per_s']:,.0f} img/s training)", flush=True)
        finally:
            if a.base:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)
    rows = []
    for recipe in a.recipes:
        b, f = res[(recipe, "before")], res[(recipe, "after")]
        wall_b, wall_a = statistics.median(r["wall_s"] for r in b), statistics.median(r["wall_s"] for r in f)
        rate_b = statistics.median(r["train_img_per_s"] for r in b)
        rate_a = statistics.median(r["train_img_per_s"] for r in f)
        rows.append({"recipe": recipe, "precision": f[0]["precision"],
                     "test % before": " / ".join(f"{100 * r['test_acc']:.2f}" for r in b),
                     "test % after": " / ".join(f"{100 * r['test_acc']:.2f}" for r in f),
                     "same acc": "yes" if all(x["test_acc"] == y["test_acc"] for x, y in zip(b, f)) else "no",
                     "wall s before": round(wall_b, 2), "wall s after": round(wall_a, 2),
                     "after / before": round(wall_a / wall_b, 3),
                     "img/s after / before": round(rate_a / rate_b, 3)})
    print(f"\n{machine(a.device)}; {a.threads} threads; seeds {a.seeds} x {a.rounds} round(s)"
          f"{f'; {a.max_steps} steps a run' if a.max_steps else ''}; base {a.base or a.base_tree}\n")
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
