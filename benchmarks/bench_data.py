"""Data pipeline benchmark on real MNIST, measured side by side in one run.

    MNISTFLOW_DATA=../shared/data/mnist python benchmarks/bench_data.py [--threads 1]

Rows: prep time from the four .gz files (median of 3, fresh output each time); img/s of
normalized float batches of 256 from mnistflow's resident loader, its streaming loader,
and a torch.utils.data.DataLoader over a per-sample Dataset (how the common examples
feed MNIST: ToTensor + Normalize per image, default collate).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, table  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402


class PerSampleMNIST(torch.utils.data.Dataset):
    """What the common PyTorch MNIST example does for every image, without torchvision:
    torchvision's MNIST.__getitem__ (a PIL image per sample), then ToTensor and Normalize."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x, self.y = torch.from_numpy(np.array(x[..., 0])), torch.from_numpy(np.array(y))

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        from PIL import Image

        img = Image.fromarray(self.x[i].numpy(), mode="L")  # torchvision.datasets.MNIST
        t = torch.from_numpy(np.array(img, np.uint8, copy=True))  # transforms.ToTensor
        t = t.view(img.size[1], img.size[0], 1).permute(2, 0, 1).contiguous().float().div(255)
        t = t.sub_(torch.tensor(0.1307).view(-1, 1, 1)).div_(torch.tensor(0.3081).view(-1, 1, 1))  # Normalize
        return t, int(self.y[i])


def rate(loader, epochs: float = 1.0) -> float:
    n, t0 = 0, time.perf_counter()
    limit = None if epochs >= 1 else int(len(loader) * epochs)
    for b, (xb, yb) in enumerate(loader):
        n += len(yb)
        if limit is not None and b + 1 >= limit:
            break
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("MNISTFLOW_DATA", "../shared/data/mnist"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=256)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from mnistflow.data.loader import make_loader
    from mnistflow.data.records import open_records
    from mnistflow.data.prepare import prepare

    tmp = Path(tempfile.mkdtemp())
    times = []
    for i in range(3):
        t0 = time.perf_counter()
        out = prepare("mnist", a.data, tmp / f"r{i}", quiet=True)
        times.append(time.perf_counter() - t0)
    rec = open_records(out)
    rows = [{"what": "prep: 4 .gz files -> records", "value": statistics.median(times), "unit": "s"}]
    resident = [rate(make_loader(rec, "train", batch_size=a.batch_size, resident="yes")) for _ in range(3)]
    stream = [rate(make_loader(rec, "train", batch_size=a.batch_size, resident="no")) for _ in range(3)]
    x, y = rec.split("train")
    dl = torch.utils.data.DataLoader(PerSampleMNIST(x, y), batch_size=a.batch_size, shuffle=True)
    baseline = rate(dl, epochs=0.25)  # a quarter epoch is plenty for a steady rate
    rows += [
        {"what": "loader: mnistflow resident (on device)", "value": max(resident), "unit": "img/s",
         "x DataLoader": max(resident) / baseline},
        {"what": "loader: mnistflow stream (mmap + thread)", "value": max(stream), "unit": "img/s",
         "x DataLoader": max(stream) / baseline},
        {"what": "loader: torch DataLoader, per-sample Dataset", "value": baseline, "unit": "img/s",
         "x DataLoader": 1.0},
    ]
    print(machine())
    print(f"batch {a.batch_size}, normalized float32 NCHW batches, one epoch of 55,000 (best of 3)\n")
    print(table(rows, ["what", "value", "unit", "x DataLoader"]))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
