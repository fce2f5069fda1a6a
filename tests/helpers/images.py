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



@functools.lru_cache(maxsize=None)
def scan_bomb_jpeg(side: int, scans: int, *, fill: bool = False, progressive: bool = True,
                   mode: str = "L") -> bytes:
    """A JPEG of random ``side`` x ``side`` pixels followed by copies of its first scan header
    with no data, ``scans`` scans in all (HOSTILE-INPUTS.md R2: each scan costs the decoder a
    pass over the whole picture). ``fill``: an FF fill byte before each extra marker (which
    decoders skip)."""
    from PIL import Image

    shape = (side, side) if mode == "L" else (side, side, 3)
    a = np.random.default_rng(0).integers(0, 255, shape).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="JPEG", progressive=progressive, quality=5)
    base = buf.getvalue()
    i = base.find(b"\xff\xda")
    sos = base[i:i + 2 + int.from_bytes(base[i + 2:i + 4], "big")] + b"\0" * 8
    eoi = base.rfind(b"\xff\xd9")
    extra = scans - base.count(b"\xff\xda")
    return base[:eoi] + ((b"\xff" if fill else b"") + sos) * extra + b"\xff\xd9"

# Strokes of each digit in a unit box (x right, y down), as a person draws them: ("line",
# points) or ("arc", (cx, cy, rx, ry), start, end) in Pillow's degrees (0 = east, clockwise).
_STROKES = {
    0: [("arc", (0.5, 0.5, 0.38, 0.5), 0, 360)],
    1: [("line", [(0.3, 0.2), (0.55, 0.0), (0.55, 1.0)])],
    2: [("arc", (0.5, 0.28, 0.38, 0.28), 165, 15),
        ("line", [(0.86, 0.36), (0.1, 1.0), (0.94, 1.0)])],
    3: [("arc", (0.48, 0.26, 0.36, 0.26), 200, 90), ("arc", (0.48, 0.74, 0.4, 0.26), 270, 160)],
    4: [("line", [(0.68, 1.0), (0.68, 0.0), (0.05, 0.68), (0.95, 0.68)])],
    5: [("line", [(0.88, 0.0), (0.22, 0.0), (0.16, 0.42)]), ("arc", (0.46, 0.68, 0.4, 0.32), 245, 150)],
    6: [("arc", (0.75, 0.62, 0.6, 0.62), 180, 275), ("arc", (0.5, 0.7, 0.35, 0.3), 0, 360)],
    7: [("line", [(0.05, 0.0), (0.95, 0.0), (0.4, 1.0)])],
    8: [("arc", (0.5, 0.25, 0.3, 0.25), 0, 360), ("arc", (0.5, 0.73, 0.38, 0.27), 0, 360)],
    9: [("arc", (0.48, 0.3, 0.36, 0.3), 0, 360), ("line", [(0.84, 0.3), (0.76, 1.0)])],
}


def drawn_digit(digit: int, *, canvas: tuple[int, int] = (480, 360), box: tuple[int, int, int, int] = (60, 40, 240, 300),
                width: int = 22, ink: int = 0, paper: int = 255) -> np.ndarray:
    """``digit`` drawn with Pillow as a user draws one: thick strokes of ``ink`` on ``paper``
    (black on white by default), on a large ``canvas`` (W, H), inside ``box`` (x0, y0, x1, y1),
    off-centre. uint8 (H, W)."""
    from PIL import Image, ImageDraw

    im = Image.new("L", canvas, paper)
    d = ImageDraw.Draw(im)
    x0, y0, x1, y1 = box
    sx, sy = x1 - x0, y1 - y0
    for kind, *args in _STROKES[digit]:
        if kind == "line":
            d.line([(x0 + x * sx, y0 + y * sy) for x, y in args[0]], fill=ink, width=width, joint="curve")
        else:
            (cx, cy, rx, ry), start, end = args
            d.arc([x0 + (cx - rx) * sx, y0 + (cy - ry) * sy, x0 + (cx + rx) * sx, y0 + (cy + ry) * sy],
                  start, end, fill=ink, width=width)
    return np.asarray(im)
