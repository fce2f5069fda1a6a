"""Small synthetic 'digits' for the unit tier: learnable, made in milliseconds, no MNIST.

Class k is a fixed random 28x28 stroke pattern (seeded by k), shifted by up to 2 pixels and
blurred with noise, so a linear model learns it in a few steps while the classes still overlap
a little (accuracy is neither 0 nor trivially 100% after one step).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def prototypes(classes: int = 10, size: int = 28, channels: int = 1) -> np.ndarray:
    """(classes, size, size, channels) float patterns in [0, 1]."""
    protos = np.zeros((classes, size, size, channels), np.float32)
    for k in range(classes):
        r = np.random.default_rng(1000 + k)
        for _ in range(4):  # four strokes: a thick line between two random points
            (y0, x0), (y1, x1) = r.integers(4, size - 4, (2, 2))
            for t in np.linspace(0, 1, 2 * size):
                y, x = int(round(y0 + t * (y1 - y0))), int(round(x0 + t * (x1 - x0)))
                protos[k, max(y - 1, 0):y + 2, max(x - 1, 0):x + 2, :] = 1.0
    return protos


def digits(n: int, *, classes: int = 10, size: int = 28, channels: int = 1, seed: int = 0,
           noise: float = 0.25) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images (N, H, W, C) uint8 and labels (N,) int64, balanced over the classes."""
    r = np.random.default_rng(seed)
    protos = prototypes(classes, size, channels)
    y = np.arange(n) % classes
    r.shuffle(y)
    x = np.empty((n, size, size, channels), np.float32)
    for i, k in enumerate(y):
        dy, dx = r.integers(-2, 3, 2)
        x[i] = np.roll(protos[k], (dy, dx), axis=(0, 1))
    x = np.clip(x + noise * r.standard_normal(x.shape).astype(np.float32), 0, 1)
    return (x * 255).round().astype(np.uint8), y.astype(np.int64)


def raw_dataset(n_train: int = 600, n_test: int = 200, **kw):
    """A ``RawDataset`` of synthetic digits (what every format reader returns)."""
    from mnistflow.data.formats.raw import RawDataset, RawSplit

    classes = kw.get("classes", 10)
    xtr, ytr = digits(n_train, seed=kw.pop("seed", 0), **kw)
    xte, yte = digits(n_test, seed=99, **kw)
    return RawDataset("synthetic", [str(k) for k in range(classes)], RawSplit(xtr, ytr), RawSplit(xte, yte))


def write_records(out: Path, n_train: int = 600, n_test: int = 200, val_size: int = 100, **kw) -> Path:
    """Synthetic digits written as a record set (the format ``mnistflow prep`` writes)."""
    from mnistflow.data.write_records import write_records as write

    return write(raw_dataset(n_train, n_test, **kw), Path(out), key="synthetic", options={"synthetic": kw},
                 source_checksums={}, val_size=val_size)
