"""Images for tests: real MNIST test digits, and any array as PNG/JPEG bytes."""
from __future__ import annotations

import io

import numpy as np

from helpers.cli import MNIST_DIR


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
