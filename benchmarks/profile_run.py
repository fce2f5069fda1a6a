"""Where a whole training run's time goes, against the arithmetic it does: a recipe (default
``fast``) trained through the public API from prepared records, one run per seed in one
process, each split into

  start-up   the API call before the run's clock starts (settings, records, model, kernels)
  steps      the training steps (``train_s``; a whitened first layer's data-dependent
             initialisation is inside it)
  eval       the evaluation passes (``eval_s``)
  rest       the clock's other time (the checkpoint, the summary)

and beside the steps and the passes, the arithmetic they do and the time it takes at this CPU's
matmul peak, measured in the same process (a 2048^3 product in the run's precision). The
arithmetic is counted by ``torch.utils.flop_counter`` on one image's forward pass of the
recipe's model: a training image costs 3 forward passes (the backward pass ~2), a test image
one per view. The first run of a process pays its one-time costs (imports, the kernels' first
use): it is shown, and left out of the medians.

    MNISTFLOW_DATA=../shared/data/mnist python benchmarks/profile_run.py [--recipe fast]
        [--seeds 0 1 2 3] [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import forward_flops, machine, matmul_peak, table  # noqa: E402

import torch  # noqa: E402


def profile(recipe: str, seed: int, common: dict, out: Path) -> dict:
    """One run's phases, in seconds."""
    import mnistflow

    t0 = time.perf_counter()
    s = mnistflow.train(recipe=recipe, seed=seed, run_dir=str(out / f"{recipe}{seed}"), **common)
    call = time.perf_counter() - t0
    return {"seed": seed, "call_s": call, "start_s": call - s["wall_s"], "steps_s": s["train_s"],
            "eval_s": s["eval_s"], "rest_s": s["wall_s"] - s["train_s"] - s["eval_s"],
            "samples": s["steps"] * s["global_batch"], "tta": s["tta"], "test_acc": s["test_acc"],
            "precision": s["precision"], "data_wait": s["data_wait_frac"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("MNISTFLOW_DATA", "../shared/data/mnist"))
    ap.add_argument("--recipe", default="fast")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import mnistflow
    from mnistflow.data.records import open_records
    from mnistflow.models import create_model
    from mnistflow.training.recipes import RECIPES

    tmp = Path(tempfile.mkdtemp())
    rec = open_records(mnistflow.prepare("mnist", a.data, tmp / "mnist", quiet=True))
    common = dict(data=str(rec.path), threads=a.threads, quiet=True, tensorboard=False)
    print(machine(), flush=True)
    runs = [profile(a.recipe, s, common, tmp) for s in a.seeds]
    dtype = torch.bfloat16 if runs[0]["precision"] == "bf16" else torch.float32
    peak = matmul_peak(dtype)
    model = RECIPES[a.recipe]["model"]
    fwd = forward_flops(create_model(model, tuple(rec.in_shape), rec.num_classes), tuple(rec.in_shape))
    test_n = rec.size("test")
    rows = []
    for r in runs:
        train_flops, eval_flops = 3 * fwd * r["samples"], fwd * test_n * (1 + r["tta"])
        rows.append({"seed": r["seed"], "test %": round(100 * r["test_acc"], 2),
                     "API call s": r["call_s"], "start-up s": r["start_s"], "steps s": r["steps_s"],
                     "steps at peak s": train_flops / peak,
                     "steps % of peak": round(100 * train_flops / peak / r["steps_s"]),
                     "eval s": r["eval_s"], "eval at peak s": eval_flops / peak,
                     "rest s": r["rest_s"], "data wait %": round(100 * (r["data_wait"] or 0), 1)})
    warm = rows[1:] or rows
    med = {k: statistics.median(row[k] for row in warm) for k in rows[0] if k != "seed"}
    print(f"\n{a.recipe}: model {model}, {fwd / 1e6:.3f} MFLOP per image forward; {runs[0]['samples']:,} "
          f"training images, {test_n:,} test images x {1 + runs[0]['tta']} views; precision "
          f"{runs[0]['precision']}, matmul peak {peak / 1e9:.0f} GFLOP/s ({a.threads} threads)\n")
    print(table(rows + [{"seed": "median (warm)", **med}], list(rows[0])))


if __name__ == "__main__":
    main()
