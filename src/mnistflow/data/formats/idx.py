"""IDX files (MNIST's own format), gzipped or not, validated strictly.

Layout: 2 zero bytes, a type code, the number of dimensions d, then d big-endian
uint32 sizes, then the data. MNIST uses type 0x08 (uint8): images (N, 28, 28), labels (N,).
"""
from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from mnistflow.core.errors import fail

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_bytes(path: Path) -> bytes:
    """The file's content, decompressed when it is gzip; errors name the file."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        fail(path, f"cannot read: {e.strerror or e}")
    if str(path).endswith(".gz") or raw[:2] == b"\x1f\x8b":
        if raw[:2] != b"\x1f\x8b":
            fail(path, "not a gzip file (bad magic bytes)")
        try:
            return gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as e:
            fail(path, f"corrupt or truncated gzip data ({e})")
    return raw


def parse_idx(data: bytes, path: Path | str = "<bytes>") -> np.ndarray:
    """Decode IDX bytes into an array; every inconsistency is a ``MnistflowError``."""
    if len(data) < 4:
        fail(path, f"too short for an IDX header ({len(data)} bytes)")
    if data[0] != 0 or data[1] != 0:
        fail(path, f"bad IDX magic number 0x{data[:4].hex()} (expected 0x0000 then type and rank)")
    code, ndim = data[2], data[3]
    if code not in _DTYPES:
        fail(path, f"unknown IDX data type 0x{code:02x}")
    if ndim == 0 or ndim > 4:
        fail(path, f"unsupported IDX rank {ndim}")
    header = 4 + 4 * ndim
    if len(data) < header:
        fail(path, "truncated IDX header")
    shape = tuple(int(s) for s in np.frombuffer(data, ">u4", ndim, 4))
    dtype = np.dtype(_DTYPES[code])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    got = len(data) - header
    if got < expected:
        fail(path, f"truncated: header says {shape} ({expected} bytes of data), file has {got}")
    if got > expected:
        fail(path, f"{got - expected} unexpected trailing bytes after the {shape} array")
    return np.frombuffer(data, dtype, offset=header).reshape(shape)


def read_idx(path: Path | str) -> np.ndarray:
    """Read one IDX(.gz) file into a read-only array."""
    return parse_idx(read_bytes(Path(path)), path)


def read_idx_pair(images: Path, labels: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images as (N, H, W, 1) uint8 and labels as (N,) int64, checked against each other."""
    x = read_idx(images)
    y = read_idx(labels)
    if x.ndim not in (3, 4) or x.dtype != np.uint8:
        fail(images, f"expected uint8 images of rank 3 or 4, got {x.dtype} of shape {x.shape}")
    if y.ndim != 1:
        fail(labels, f"expected a rank-1 label file, got shape {y.shape}")
    if len(x) != len(y):
        fail(labels, f"{len(y)} labels for {len(x)} images in {Path(images).name}")
    if x.ndim == 3:
        x = x[..., None]
    return x, y.astype(np.int64)
