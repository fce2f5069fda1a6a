"""The tutorial's deep CNN: mnistflow's seed-cnn recipe vs a plain PyTorch loop, one run.

    MNISTFLOW_DATA=../shared/data/mnist python benchmarks/bench_seed_cnn.py [--seeds 0 1 2]

Plain loop: the same architecture in plain PyTorch, fp32, Adam 1e-3, batch 128, data already
in memory as normalized float tensors (no DataLoader: the most favourable plain setup), one
epoch. mnistflow: `train(recipe="seed-cnn")` through the public API from prepared records
(median of the seeds must reach 99.2% test accuracy).

Two rates: "train img/s" is images per second of the training steps (the plain loop's only
figure: its timer stops before its test pass; mnistflow's leaves out its evaluations and
checkpoint writes), the like-for-like comparison the 7,000 img/s target is about; "end-to-end
img/s" divides by mnistflow's whole wall time, per-epoch validation and final test included.
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
from common import machine, table  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def plain_loop(rec, epochs: int = 1, batch: int = 128, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    x, y = rec.split("train")
    tx, ty = rec.split("test")
    norm = lambda a: (torch.from_numpy(a[..., 0].copy()).float().unsqueeze(1) / 255 - 0.1307) / 0.3081  # noqa: E731
    X, Y, TX, TY = norm(x), torch.from_numpy(y), norm(tx), torch.from_numpy(ty)
    model = nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(3136, 1024), nn.ReLU(), nn.Dropout(0.5), nn.Linear(1024, 10))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    t0 = time.perf_counter()
    n = 0
    for _ in range(epochs):
        perm = torch.randperm(len(Y))
        for i in range(0, len(Y), batch):
            idx = perm[i:i + batch]
            loss = F.cross_entropy(model(X[idx]), Y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            n += len(idx)
    wall = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():
        acc = sum((model(TX[i:i + 1000]).argmax(1) == TY[i:i + 1000]).sum().item() for i in range(0, 10000, 1000)) / 1e4
    return {"wall_s": wall, "img_per_s": n / wall, "train_img_per_s": n / wall, "test_acc": acc,
            "epochs": epochs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("MNISTFLOW_DATA", "../shared/data/mnist"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--plain-epochs", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import mnistflow
    from mnistflow.data.records import open_records

    tmp = Path(tempfile.mkdtemp())
    rec = open_records(mnistflow.prepare("mnist", a.data, tmp / "mnist", quiet=True))
    plain = plain_loop(rec, a.plain_epochs)
    runs = [mnistflow.train(recipe="seed-cnn", data=str(rec.path), seed=s, threads=a.threads,
                            run_dir=str(tmp / f"run{s}"), quiet=True, tensorboard=False) for s in a.seeds]
    med_acc = statistics.median(r["test_acc"] for r in runs)
    med_ips = statistics.median(r["img_per_s"] for r in runs)
    med_train = statistics.median(r["train_img_per_s"] for r in runs)
    rows = [{"setup": f"plain PyTorch fp32 ({a.plain_epochs} epoch)", "seeds": "0",
             "test acc": f"{100 * plain['test_acc']:.2f}%", "wall s": plain["wall_s"],
             "train img/s": plain["train_img_per_s"], "end-to-end img/s": "-", "x plain": 1.0},
            {"setup": f"mnistflow --recipe seed-cnn ({runs[0]['epochs']:g} epochs, {runs[0]['precision']})",
             "seeds": " ".join(map(str, a.seeds)),
             "test acc": " ".join(f"{100 * r['test_acc']:.2f}%" for r in runs) + f" (median {100 * med_acc:.2f}%)",
             "wall s": statistics.median(r["wall_s"] for r in runs), "train img/s": med_train,
             "end-to-end img/s": med_ips, "x plain": med_train / plain["train_img_per_s"]}]
    print(machine())
    print(table(rows, ["setup", "seeds", "test acc", "wall s", "train img/s", "end-to-end img/s", "x plain"]))
    print(f"\ntargets: median >= 99.20% -> {'PASS' if med_acc >= 0.992 else 'FAIL'}; "
          f">= 7,000 train img/s at batch 128 -> {'PASS' if med_train >= 7000 else 'FAIL'} "
          f"(end to end {med_ips:,.0f}); "
          f"wall <= 90 s -> {'PASS' if max(r['wall_s'] for r in runs) <= 90 else 'FAIL'}")


if __name__ == "__main__":
    main()
