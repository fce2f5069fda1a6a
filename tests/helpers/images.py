"""Images for tests: real MNIST test digits, and any array as PNG/JPEG bytes."""
from __future__ import annotations

import functools
import io
import struct
import zlib

import numpy as np

from helpers.realdata import MNIST_DIR


def real_digits(n: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` real MNIST test digits (uint8 (n, 28, 28)) and their labels."""
    from mnistflow.data.formats.idx import read_idx

    x = read_idx(MNIST_DIR / "t10k-images-idx3-ubyte.gz")[start:start + n]
    y = read_idx(MNIST_DIR / "t10k-labels-idx1-ubyte.gz")[start:start + n]
    return x, y


def png(a: np.ndarray, fmt: str = "PNG", **kw) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(a).save(buf, fmt, **kw)
    return buf.getvalue()


@functools.lru_cache(maxsize=None)
def bomb_png(w: int, h: int | None = None, rows: int | None = None) -> bytes:
    """A 1-bit PNG of zeros that declares ``w`` x ``h`` pixels (12000x12000 is ~17 KB): a
    decompression bomb. ``rows``: store only that many rows (a refusal must come from the
    header alone; decoding such a file would fail)."""
    h = w if h is None else h

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\0" * (1 + (w + 7) // 8)
    co = zlib.compressobj(9)
    body = b"".join(co.compress(row) for _ in range(h if rows is None else rows)) + co.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", body) + chunk(b"IEND", b""))
