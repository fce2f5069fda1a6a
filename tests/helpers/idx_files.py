"""Synthetic IDX files and an orientation probe, for the family readers' tests."""
from __future__ import annotations

import struct

import numpy as np


def idx_bytes(arr: np.ndarray, code: int = 0x08) -> bytes:
    """``arr`` as an IDX file (big-endian data for the multi-byte types)."""
    arr = np.asarray(arr)
    dt = {0x08: np.uint8, 0x0C: ">i4"}[code]
    return (bytes([0, 0, code, arr.ndim]) + b"".join(struct.pack(">I", s) for s in arr.shape)
            + arr.astype(dt).tobytes())


def l_glyph() -> np.ndarray:
    """An upright 'L': a vertical bar on the left, its foot along the bottom (asymmetric under
    transposition, flips and rotations)."""
    g = np.zeros((28, 28), np.uint8)
    g[4:22, 6:9] = 255  # the bar: rows 4..21, columns 6..8
    g[19:22, 6:20] = 255  # the foot: rows 19..21, columns 6..19
    return g
