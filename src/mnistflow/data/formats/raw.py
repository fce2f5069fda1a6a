"""What every reader returns: ``RawDataset`` (uint8 NHWC arrays + labels + class names), the
label check they share, and the limits every reader applies before it allocates.

Limits (what only a malicious or broken file would exceed; each is checked *before* the
memory is taken):

* ``MAX_CLASSES``: a label is a class index below 100,000.
* ``MAX_DATASET_BYTES``: the decoded images of one dataset take at most 16 GiB.
* ``open_regular``: inputs are regular files; a FIFO, socket or device is refused, never read.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from mnistflow.core.errors import fail

MAX_CLASSES = 100_000
MAX_DATASET_BYTES = 16 << 30


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


def class_count(path: Path | str, *labels: np.ndarray) -> int:
    """K for classes "0".."K-1" taken from the labels (largest + 1), refused above
    ``MAX_CLASSES`` before any class name is made; a negative label is an error."""
    k = 0
    for y in labels:
        if y is None or not len(y):
            continue
        lo, hi = int(y.min()), int(y.max())
        if lo < 0:
            i = int(np.flatnonzero(y < 0)[0])
            fail(path, f"record {i}: label {lo} is negative")
        if hi >= MAX_CLASSES:
            i = int(np.flatnonzero(y >= MAX_CLASSES)[0])
            fail(path, f"record {i}: label {hi} is not a class index (at most {MAX_CLASSES - 1:,})")
        k = max(k, hi + 1)
    return k


def warn_empty_classes(path: Path | str, y: np.ndarray, k: int) -> None:
    """One warning when classes taken from the labels have no training image (a stray large
    label silently adds classes the model can never learn)."""
    if not len(y):
        return
    empty = np.flatnonzero(np.bincount(y, minlength=k) == 0)
    if len(empty):
        from mnistflow.core.log import warn

        shown = ", ".join(str(int(c)) for c in empty[:5]) + (", ..." if len(empty) > 5 else "")
        warn(f"{path}: labels run 0..{k - 1} but {len(empty)} of those classes have no training "
             f"image ({shown}); is a label wrong?")


def check_dataset_bytes(path: Path | str, nbytes: int, limit: int | None = None) -> None:
    """Refuse a dataset whose decoded images would take more than ``limit`` bytes."""
    limit = MAX_DATASET_BYTES if limit is None else limit
    if nbytes > limit:
        fail(path, f"the images would take {nbytes:,} bytes decoded, more than the "
                   f"{limit:,}-byte limit for one dataset")


def check_regular(path: Path | str) -> os.stat_result:
    """``stat`` of ``path``, refusing anything but a regular file (a FIFO would block forever)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        fail(path, "no such file")
    except OSError as e:
        fail(path, f"cannot read: {e.strerror or e}")
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, socket or device?)"
        fail(path, f"is {kind}; refusing to read it")
    return st


def open_regular(path: Path | str) -> BinaryIO:
    """Open ``path`` for binary reading if it is a regular file, else a ``MnistflowError``.

    Opened without blocking and checked on the open descriptor (no race with a swap to a
    FIFO between a check and the open)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        fail(path, "no such file")
    except IsADirectoryError:
        fail(path, "is a folder; refusing to read it")
    except OSError as e:
        fail(path, f"cannot read: {e.strerror or e}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, socket or device?)"
            fail(path, f"is {kind}; refusing to read it")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
