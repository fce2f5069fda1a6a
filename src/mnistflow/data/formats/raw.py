"""What every reader returns: ``RawDataset`` (uint8 NHWC arrays + labels + class names), and
the label check they share.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mnistflow.core.errors import fail


@dataclass
class RawSplit:
    x: np.ndarray  # (N, H, W, C) uint8
    y: np.ndarray  # (N,) int64 in [0, num_classes)


@dataclass
class RawDataset:
    name: str
    class_names: list[str]
    train: RawSplit
    test: RawSplit | None = None
    source_files: list[Path] = field(default_factory=list)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def check_labels(y: np.ndarray, num_classes: int, path: Path | str) -> None:
    """A label outside [0, num_classes) is an error naming the file and the record index."""
    bad = np.flatnonzero((y < 0) | (y >= num_classes))
    if len(bad):
        i = int(bad[0])
        fail(path, f"record {i}: label {int(y[i])} is outside 0..{num_classes - 1}")
