"""Opening one picture safely: its size is read from the header and checked before anything
is decoded (a 17 KB PNG can declare 12000x12000 pixels), and only regular files are read.

``core.limits.MAX_PIXELS`` (16.7 Mpx: a 4096x4096 picture or a 16 Mpx photo) is the default cap for every
picture mnistflow decodes from a file (``prep`` of image folders and TFRecords, ``predict``);
``max_pixels`` (the CLI's ``--max-pixels``) raises or lowers it.
"""
from __future__ import annotations

import contextlib
import io
import math
import os
import warnings
from typing import TYPE_CHECKING, Iterator

from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError, fail
from mnistflow.core.fsutil import open_regular

if TYPE_CHECKING:  # Pillow is imported where it is used
    from PIL import Image


@contextlib.contextmanager
def open_picture(src: bytes | os.PathLike | str, where: str | os.PathLike,
                 max_pixels: int | None = None) -> Iterator["PIL.Image.Image"]:  # noqa: F821
    """A Pillow image opened lazily (nothing decoded yet) from a file or encoded bytes, its
    width x height checked against ``max_pixels`` (default ``limits.MAX_PIXELS``) first: a
    decompression bomb is refused before it is decoded. Errors name ``where``."""
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
                img = stack.enter_context(Image.open(fh))
        except Image.DecompressionBombError as e:
            fail(where, f"refusing to decode an image of more than {limit:,} pixels ({e})")
        except Exception as e:  # Pillow raises many kinds (OSError, SyntaxError, ValueError, ...)
            fail(where, f"not a readable PNG/JPEG image ({type(e).__name__}: {e})")
        w, h = img.size
        if w * h > limit:
            fail(where, f"image is {w}x{h} = {w * h:,} pixels, more than the limit of {limit:,} "
                        "(--max-pixels raises it)")
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
