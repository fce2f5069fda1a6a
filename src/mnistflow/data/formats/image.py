"""Opening one picture safely: its size is read from the header and checked before anything
is decoded (a 17 KB PNG can declare 12000x12000 pixels), its decode cost is checked too (a 2 MB
JPEG can hold 93,000 scans, each a pass over the picture), and only regular files of the picture
formats are read.

``core.limits.MAX_PIXELS`` (16.7 Mpx: a 4096x4096 picture or a 16 Mpx photo) is the default cap for every
picture mnistflow decodes from a file (``prep`` of image folders and TFRecords, ``predict``);
``max_pixels`` (the CLI's ``--max-pixels``) raises or lowers it. ``decode_cost_problem`` is the
one check of what a picture costs beyond its pixels; the server's uploads go through it too.
"""
from __future__ import annotations

import contextlib
import io
import math
import os
import warnings
from typing import TYPE_CHECKING, BinaryIO, Iterator

from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError, fail
from mnistflow.core.fsutil import open_regular

if TYPE_CHECKING:  # Pillow is imported where it is used
    from PIL import Image


# what a picture may be: Pillow's other readers are never used (EPS runs Ghostscript, and each
# format is a decoder with its own costs); PNG and JPEG are what pictures are, the rest is for uploads
PICTURE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
_SOS = b"\xff\xda"  # a JPEG's start-of-scan marker


def jpeg_scans(fh: BinaryIO, stop: int = limits.MAX_JPEG_SCANS) -> int:
    """Start-of-scan markers in the JPEG stream ``fh`` (read from its start; its position is
    kept), counted without decoding; reading stops once the count is past ``stop``.
    Entropy-coded data never holds the bytes FF DA (an FF there is followed by 00 or a restart
    marker), so this counts every scan the decoder would run, plus any inside metadata (an
    embedded thumbnail's)."""
    pos = fh.tell()
    fh.seek(0)
    count, tail = 0, b""
    try:
        while count <= stop and (chunk := fh.read(1 << 20)):
            count += (tail + chunk[:1]).count(_SOS) + chunk.count(_SOS)
            tail = chunk[-1:]
    finally:
        fh.seek(pos)
    return count


def decode_cost_problem(img: Image.Image, fh: BinaryIO) -> str | None:
    """Why decoding ``img`` (opened lazily from ``fh``) would cost far more than its pixels, or
    None: a JPEG of more than ``core.limits.MAX_JPEG_SCANS`` scans (each scan is a pass over
    the whole picture; libjpeg writes 6 to 10 for a progressive one). Pillow's PNG reader, by
    contrast, costs what the file's bytes do, even when they are all empty or unknown chunks
    (tests/unit/test_hostile_pictures.py), and caps its text chunks itself."""
    if img.format in ("JPEG", "MPO") and jpeg_scans(fh) > limits.MAX_JPEG_SCANS:
        return (f"a JPEG of more than {limits.MAX_JPEG_SCANS} scans (a progressive picture has 6 to "
                "10; each scan costs a pass over the whole picture)")
    return None


@contextlib.contextmanager
def open_picture(src: bytes | os.PathLike | str, where: str | os.PathLike,
                 max_pixels: int | None = None) -> Iterator["PIL.Image.Image"]:  # noqa: F821
    """A Pillow image opened lazily (nothing decoded yet) from a file or encoded bytes of one of
    ``PICTURE_FORMATS``, its width x height checked against ``max_pixels`` (default
    ``limits.MAX_PIXELS``) and its decode cost (``decode_cost_problem``) first: a decompression
    or scan bomb is refused before it is decoded. Errors name ``where``."""
    from PIL import Image

    limit = limits.MAX_PIXELS if max_pixels is None else int(max_pixels)
    if limit <= 0:
        raise MnistflowError(f"--max-pixels must be positive, got {limit}")
    with contextlib.ExitStack() as stack:
        fh = (io.BytesIO(src) if isinstance(src, (bytes, bytearray, memoryview))
              else stack.enter_context(open_regular(src)))
        try:
            with warnings.catch_warnings():  # Pillow's bomb warning is a raw line on stderr
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                img = stack.enter_context(Image.open(fh, formats=PICTURE_FORMATS))
        except Image.DecompressionBombError as e:
            fail(where, f"refusing to decode an image of more than {limit:,} pixels ({e})")
        except Exception as e:  # Pillow raises many kinds (OSError, SyntaxError, ValueError, ...)
            fail(where, f"not a readable PNG/JPEG image ({type(e).__name__}: {e})")
        w, h = img.size
        if w * h > limit:
            fail(where, f"image is {w}x{h} = {w * h:,} pixels, more than the limit of {limit:,} "
                        "(--max-pixels raises it)")
        problem = decode_cost_problem(img, fh)
        if problem:
            fail(where, f"refusing to decode {problem}")
        yield img


# the picture files mnistflow looks for in a folder (prep's image folders, predict's folders)
PICTURE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
WORK_SIDE = 1024  # the most pixels a side a picture keeps before it is resized (``shrink``)


def shrink(im: Image.Image, side: int = WORK_SIDE) -> Image.Image:
    """``im`` box-reduced by a whole factor to at most ``side`` pixels a side (``im`` itself
    when it is no larger), so that every later step costs what a ``side``-pixel picture does
    whatever the picture's size or aspect ratio. A box filter's cost does not grow with the
    factor, unlike LANCZOS's tables; what is lost is detail a 28x28 input cannot show anyway."""
    longest = max(im.size)
    return im if longest <= side else im.reduce(math.ceil(longest / side))


def working_mode(im: Image.Image) -> Image.Image:
    """A decoded picture in the mode a picture is prepared from (``data.picture``): ``L`` for
    grey, ``RGBA`` where it has transparency (a drawing on a transparent canvas keeps its
    strokes: ``picture.flatten_alpha``), else ``RGB``. ``predict``'s files and the server's
    uploads both go through it."""
    if im.mode in ("1", "L", "I", "I;16", "F"):
        return im.convert("L")
    if im.mode in ("LA", "La", "RGBA", "RGBa", "PA") or (im.mode == "P" and "transparency" in im.info):
        return im.convert("RGBA")
    return im.convert("RGB")
