"""The MNIST family: test accuracy and wall time of each recipe on each dataset, beside the
tutorial's CNN trained as the tutorial does (baseline B) on the same dataset in the same run.

    python benchmarks/family.py --data-root ../shared/data [--recipes fast fast-plus ...]
                                [--seeds 0 1 2] [--datasets fashion-mnist mnist ...] [--no-record]

A dataset is measured when ``DATA_ROOT/<name>/`` holds its files (as ``mnistflow prep NAME
--data DIR`` reads them); the others are listed as not measured, never dropped.
Rows:
  mnistflow --recipe R   through the public API from prepared records, nothing but ``data``
                         given (the recipe's augmentation, normalization from the records);
                         one run per seed; test accuracy per seed, the median, wall time
  B                      the tutorial's deep CNN (seed-cnn), Adam 1e-4, batch 50, fp32, inputs
                         normalized by the records' own mean/std; tested every epoch until
                         --cap-s: the accuracy at the cap
Wall time: from prepared records to the end of the final test evaluation. Every seed's figures
go into the results file (src/mnistflow/training/measured.json, the entry for this kind of
machine and each dataset measured: benchmarks/results.py).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, table  # noqa: E402
from results import RESULTS, machine_kind, provenance, recipe_result, record  # noqa: E402
from time_to_accuracy import baseline_b  # noqa: E402

import torch  # noqa: E402

# Published test accuracies, for orientation (not measured here).
REFERENCE = {
    "mnist": "tutorial CNN 99.2%",
    "fashion-mnist": "small CNNs 92.5-94%, WRN 96.7%",
    "kmnist": "ResNet-18 97.8% (KMNIST paper)",
    "qmnist": "as MNIST (same digits)",
    "emnist-letters": "~93-95% (CNNs)",
    "emnist-balanced": "~88-91% (CNNs)",
    "cifar10": "ResNet-18 ~93-95%",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-root", default=os.environ.get("MNISTFLOW_DATA_ROOT", "../shared/data"))
    ap.add_argument("--datasets", nargs="+", default=["mnist", "fashion-mnist", "kmnist", "qmnist",
                                                      "emnist-letters", "emnist-balanced", "cifar10"])
    ap.add_argument("--recipes", nargs="+", default=["fast", "fast-plus", "seed-cnn", "mid", "best"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--cap-s", type=float, default=120, help="baseline B's time budget per dataset")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the results file to update")
    ap.add_argument("--no-record", action="store_true", help="leave the results file as it is")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import mnistflow
    from mnistflow.data.records import open_records

    tmp = Path(tempfile.mkdtemp())
    rows = []
    cols = ["dataset", "recipe", "test acc per seed", "median %", "wall s (median)", "reference"]
    print(machine())
    print(f"seeds {a.seeds}; baseline B capped at {a.cap_s:.0f} s\n", flush=True)

    def done(row: dict) -> None:
        """Keep the row and print it at once: an hour's run keeps what it measured so far."""
        rows.append(row)
        print("  ".join(f"{c}={table([row], [c]).splitlines()[2].strip()}" for c in cols if c in row),
              flush=True)

    for name in a.datasets:
        folder = Path(a.data_root) / name
        if not folder.is_dir():
            done({"dataset": name, "recipe": "-", "test acc per seed": "not measured (no data here)",
                  "reference": REFERENCE.get(name, "")})
            continue
        rec = open_records(mnistflow.prepare(name, folder, tmp / name, quiet=True))
        measured = {}
        for recipe in a.recipes:
            runs = [mnistflow.train(recipe=recipe, data=str(rec.path), seed=s, threads=a.threads, quiet=True,
                                    tensorboard=False, run_dir=str(tmp / f"{name}-{recipe}-{s}"))
                    for s in a.seeds]
            measured[recipe] = runs
            accs = [100 * r["test_acc"] for r in runs]
            done({"dataset": name, "recipe": recipe,
                  "test acc per seed": " ".join(f"{v:.2f}" for v in accs),
                  "median %": statistics.median(accs),
                  "wall s (median)": statistics.median(r["wall_s"] for r in runs),
                  "reference": REFERENCE.get(name, "")})
        if measured and not a.no_record:
            precision = next(iter(measured.values()))[0]["precision"]
            prov = provenance("cpu")
            record(machine_kind("cpu", precision), precision, name,
                   {r: recipe_result(prov, a.seeds, runs) for r, runs in measured.items()}, path=a.results)
        if not a.no_baseline:
            b = baseline_b(rec, a.cap_s, target=None)
            done({"dataset": name, "recipe": f"B: tutorial CNN, Adam 1e-4, batch 50 ({b['epochs']} ep)",
                  "test acc per seed": f"{100 * b['accs'][-1]:.2f}", "median %": 100 * b["accs"][-1],
                  "wall s (median)": b["wall"], "reference": REFERENCE.get(name, "")})
    print()
    print(table(rows, cols))


if __name__ == "__main__":
    main()
