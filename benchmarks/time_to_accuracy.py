"""Time to 99.0% MNIST test accuracy: mnistflow's recipes vs what users pick instead. One process.

    MNISTFLOW_DATA=../shared/data/mnist python benchmarks/time_to_accuracy.py [--quick]

Rows:
  A  the common PyTorch MNIST example: per-sample Dataset + DataLoader (ToTensor, Normalize),
     batch 64, the two-conv net with dropout, Adadelta lr 1.0, StepLR gamma 0.7; test after
     every epoch until 99.0% or the cap.
  B  the tutorial's deep CNN trained as the tutorial does: Adam 1e-4, batch 50, fp32; test
     every 1,100 steps (one epoch) until 99.0% or the cap.
  mnistflow --recipe fast / seed-cnn through the public API from prepared records, 3 seeds.
Wall time: from records already prepared (for A and B: tensors / dataset already in memory)
to the end of the test evaluation that reaches the target; interpreter start-up excluded.
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
from bench_data import PerSampleMNIST  # noqa: E402
from common import machine, table  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

TARGET = 0.99


class ExampleNet(nn.Module):
    """pytorch/examples mnist/main.py's Net."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def _test(model, loader, device: torch.device | str = "cpu") -> float:
    model.eval()
    correct = n = 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            correct += (model(x).argmax(1) == y).sum().item()
            n += len(y)
    model.train()
    return correct / n


def baseline_a(rec, cap_epochs: int, cap_s: float, seed: int = 1, target: float = TARGET,
               device: torch.device | str = "cpu") -> dict:
    """A until ``target`` or the cap; ``accs``/``times``: test accuracy and wall time after each epoch.
    On a GPU, as the example runs there: the model on the device, each batch copied to it."""
    torch.manual_seed(seed)
    x, y = rec.split("train")
    tx, ty = rec.split("test")
    train = torch.utils.data.DataLoader(PerSampleMNIST(x, y), batch_size=64, shuffle=True)
    test = torch.utils.data.DataLoader(PerSampleMNIST(tx, ty), batch_size=1000)
    model = ExampleNet().to(device)
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    t0, accs, epoch_s, times = time.perf_counter(), [], [], []
    for epoch in range(cap_epochs):
        te = time.perf_counter()
        for xb, yb in train:
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad()
            F.nll_loss(model(xb), yb).backward()
            opt.step()
        sched.step()
        epoch_s.append(time.perf_counter() - te)
        accs.append(_test(model, test, device))
        times.append(time.perf_counter() - t0)
        if accs[-1] >= target or time.perf_counter() - t0 > cap_s:
            break
    wall = time.perf_counter() - t0
    return {"accs": accs, "times": times, "wall": wall, "reached": accs[-1] >= target, "epochs": len(accs),
            "img_per_s": len(accs) * len(y) / sum(epoch_s), "epoch_s": statistics.mean(epoch_s)}


def baseline_b(rec, cap_s: float, seed: int = 0, target: float | None = TARGET,
               device: torch.device | str = "cpu") -> dict:
    """B: the tutorial's CNN trained as the tutorial does (Adam 1e-4, batch 50, fp32), inputs
    normalized by the records' own mean/std, tested after every epoch until ``target`` (None:
    never stops early) or until ``cap_s`` seconds have passed (then mid-epoch, and tested
    there). ``accs``/``times``: test accuracy and wall time at each test. On a GPU the tensors
    live on the device (as the tutorial's feed would be at best)."""
    from mnistflow.data.normalize import normalize
    from mnistflow.models import create_model

    torch.manual_seed(seed)

    def tensors(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = rec.split(split)  # (N, H, W, C) uint8: the records' own size and channels
        return (normalize(torch.from_numpy(x.copy()), rec.mean, rec.std).to(device),
                torch.from_numpy(y.astype("int64")).to(device))

    X, Y = tensors("train")
    TX, TY = tensors("test")
    model = create_model("seed-cnn", tuple(X.shape[1:]), rec.num_classes).to(device)
    opt = torch.optim.Adam(model.parameters(), 1e-4)
    test = [(TX[i:i + 1000], TY[i:i + 1000]) for i in range(0, len(TY), 1000)]
    t0, accs, times, n, train_s = time.perf_counter(), [], [], 0, 0.0
    while True:
        perm = torch.randperm(len(Y), device=device)
        ts = time.perf_counter()
        for i in range(0, len(Y) - 49, 50):
            idx = perm[i:i + 50]
            loss = F.cross_entropy(model(X[idx]), Y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            n += 50
            if time.perf_counter() - t0 >= cap_s:
                break
        train_s += time.perf_counter() - ts
        accs.append(_test(model, test, device))
        times.append(time.perf_counter() - t0)
        if (target is not None and accs[-1] >= target) or times[-1] >= cap_s:
            break
    return {"accs": accs, "times": times, "wall": time.perf_counter() - t0, "epochs": len(accs),
            "reached": target is not None and accs[-1] >= target, "img_per_s": n / train_s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("MNISTFLOW_DATA", "../shared/data/mnist"))
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--cap-s", type=float, default=240, help="time cap per baseline")
    ap.add_argument("--quick", action="store_true", help="mnistflow rows only (no baselines)")
    ap.add_argument("--recipes", nargs="+", default=["fast", "seed-cnn"])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import mnistflow
    from mnistflow.data.records import open_records

    tmp = Path(tempfile.mkdtemp())
    rec = open_records(mnistflow.prepare("mnist", a.data, tmp / "mnist", quiet=True))
    rows = []
    for recipe in a.recipes:
        runs = [mnistflow.train(recipe=recipe, data=str(rec.path), seed=s, threads=a.threads, quiet=True,
                                tensorboard=False, run_dir=str(tmp / f"{recipe}{s}")) for s in a.seeds]
        rows.append({"recipe": f"mnistflow --recipe {recipe}", "seeds": len(runs),
                     "test acc per seed": " ".join(f"{100 * r['test_acc']:.2f}" for r in runs),
                     "all >= 99.0": all(r["test_acc"] >= TARGET for r in runs),
                     "wall s (median)": statistics.median(r["wall_s"] for r in runs),
                     "img/s": statistics.median(r["img_per_s"] for r in runs)})
    if not a.quick:
        b = baseline_b(rec, a.cap_s)
        rows.append({"recipe": "B: tutorial CNN, Adam 1e-4, batch 50, fp32", "seeds": 1,
                     "test acc per seed": f"{100 * b['accs'][-1]:.2f} ({b['epochs']} ep)",
                     "all >= 99.0": b["reached"], "wall s (median)": b["wall"], "img/s": b["img_per_s"]})
        A = baseline_a(rec, cap_epochs=14, cap_s=a.cap_s)
        rows.append({"recipe": f"A: PyTorch example ({A['epoch_s']:.0f} s/epoch)", "seeds": 1,
                     "test acc per seed": f"{100 * A['accs'][-1]:.2f} ({A['epochs']} ep)",
                     "all >= 99.0": A["reached"], "wall s (median)": A["wall"], "img/s": A["img_per_s"]})
        for r in rows:
            r["x faster than A"] = A["wall"] / r["wall s (median)"]
    print(machine())
    print(f"target {100 * TARGET:.1f}% test accuracy; 'not reached' rows stopped at the cap\n")
    print(table(rows, ["recipe", "seeds", "test acc per seed", "all >= 99.0", "wall s (median)", "img/s",
                       "x faster than A"]))


if __name__ == "__main__":
    main()
