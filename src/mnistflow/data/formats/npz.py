"""Keras-style ``.npz`` (like ``mnist.npz``): ``x_train, y_train[, x_test, y_test]``.

Opened with ``allow_pickle=False``: an object (pickled) array is refused. Images are
(N, H, W) or (N, H, W, C) with C in {1, 3}; uint8, or any integer/float dtype whose values
are all integers in 0..255 (``raw.as_pixels``, the rule every reader shares). Labels are (N,)
or (N, 1) integers >= 0; the classes are the values ``y_train`` uses (``raw.from_original_labels``).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from mnistflow.core import limits
from mnistflow.core.errors import fail
from mnistflow.data.formats.raw import (
    RawDataset,
    RawSplit,
    as_pixels,
    check_dataset_bytes,
    dataset_from_labels,
)
from mnistflow.core.fsutil import open_regular


def _peek_header(npz, key: str, path: Path) -> None:
    """Check a member's .npy header before numpy allocates what it declares."""
    fmt = np.lib.format
    member = key + ".npy"
    try:
        info = npz.zip.getinfo(member)
        with npz.zip.open(member) as f:
            major, _ = fmt.read_magic(f)
            if major not in (1, 2, 3):
                raise ValueError(f"unknown .npy format version {major}")
            reader = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
            shape, _, dtype = reader(f, max_header_size=limits.MAX_NPY_HEADER_BYTES)
            header_len = f.tell()
    except Exception as e:  # zipfile / header errors come in many kinds
        fail(path, f"{key}: unreadable array ({type(e).__name__}: {e})")
    if dtype.hasobject:
        fail(path, f"{key} is a pickled object array; refusing to load it (allow_pickle=False)")
    need = math.prod(shape) * dtype.itemsize
    check_dataset_bytes(path, need)
    if need > info.file_size - header_len:
        fail(path, f"{key}: truncated: header says {dtype} {shape} ({need} bytes), "
                   f"member holds {max(info.file_size - header_len, 0)}")


def _load(npz, key: str, path: Path) -> np.ndarray:
    _peek_header(npz, key, path)
    try:
        return npz[key]
    except Exception as e:  # BadZipFile (CRC), ValueError, EOFError, zlib.error, ...
        fail(path, f"{key}: unreadable array ({type(e).__name__}: {e})")


def _as_pixels(x: np.ndarray, key: str, path: Path) -> np.ndarray:
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4 or x.shape[-1] not in (1, 3) or 0 in x.shape[1:]:
        fail(path, f"{key} has shape {x.shape}; expected (N, H, W) or (N, H, W, C) with C 1 or 3")
    return as_pixels(x, path, key)


def _as_labels(y: np.ndarray, key: str, path: Path) -> np.ndarray:
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        fail(path, f"{key} has shape {y.shape}; expected (N,) labels")
    if np.issubdtype(y.dtype, np.floating):
        if not np.isfinite(y).all() or (y != np.round(y)).any():
            fail(path, f"{key} ({y.dtype}) holds non-integer labels")
    elif not np.issubdtype(y.dtype, np.integer):
        fail(path, f"{key} has dtype {y.dtype}; expected integer labels")
    if y.size and (y.min() < 0 or y.max() >= limits.MAX_CLASSES):
        i = int(np.flatnonzero((y < 0) | (y >= limits.MAX_CLASSES))[0])
        fail(path, f"{key}: record {i}: label {y[i]} is not a class index")
    return y.astype(np.int64)


def _split(npz, path: Path, which: str) -> RawSplit:
    x = _as_pixels(_load(npz, f"x_{which}", path), f"x_{which}", path)
    y = _as_labels(_load(npz, f"y_{which}", path), f"y_{which}", path)
    if len(x) != len(y):
        fail(path, f"x_{which} has {len(x)} images but y_{which} has {len(y)} labels")
    if len(x) == 0:
        fail(path, f"x_{which} has no images")
    return RawSplit(x, y)


def read_npz(path: str | os.PathLike, name: str | None = None) -> RawDataset:
    """Read a Keras-layout ``.npz`` into a ``RawDataset``."""
    path = Path(path)
    with open_regular(path) as fh:
        return _read_npz(fh, path, name)


def _read_npz(fh, path: Path, name: str | None) -> RawDataset:
    magic = fh.read(6)
    fh.seek(0)
    if magic.startswith(b"\x93NUMPY"):
        fail(path, "is a single .npy array, not an .npz archive with x_train/y_train")
    if not magic.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        fail(path, "not an .npz archive (no zip signature at the start)")
    try:
        npz = np.load(fh, allow_pickle=False)
    except OSError as e:
        fail(path, f"cannot read: {e.strerror or e}")
    except Exception as e:  # BadZipFile, EOFError, ...
        fail(path, f"not a readable .npz archive ({type(e).__name__}: {e})")
    if not isinstance(npz, np.lib.npyio.NpzFile):
        fail(path, "is a single .npy array, not an .npz archive with x_train/y_train")
    with npz:
        keys = set(npz.files)
        if not {"x_train", "y_train"} <= keys:
            fail(path, f"expected arrays x_train and y_train (Keras mnist.npz layout), "
                       f"found: {', '.join(sorted(keys)) or 'none'}")
        if ("x_test" in keys) != ("y_test" in keys):
            fail(path, "has only one of x_test / y_test")
        train = _split(npz, path, "train")
        test = _split(npz, path, "test") if "x_test" in keys else None
    if test is not None and test.x.shape[1:] != train.x.shape[1:]:
        fail(path, f"x_test images are {test.x.shape[1:]} but x_train are {train.x.shape[1:]}")
    stem = path.name.split(".")[0]
    return dataset_from_labels(name or stem, train, test, [path], where=f"{path}: y_train",
                               test_where=f"{path}: y_test")
