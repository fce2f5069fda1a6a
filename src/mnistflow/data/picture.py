"""Turn a user's picture into what the model saw in training.

``mnist_style`` follows how the MNIST digits were made: the digit's bounding box is scaled
to fit 20x20 (aspect kept, anti-aliased), then placed in 28x28 so that its centre of mass
is at the centre. Polarity: MNIST digits are white on black; ``invert_for`` matches a
picture to the polarity of any training set (dark or light background).

Reading pictures: ``open_picture`` / ``read_picture`` check the image's size from its header
before decoding anything: at most ``core.limits.MAX_PIXELS`` pixels (16.7 Mpx, a 4096x4096 picture or a
16 Mpx photo) unless the caller passes ``max_pixels`` (the CLI's ``--max-pixels``); a FIFO or
other non-regular file is refused, never opened for reading.

A picture larger than ``WORK_SIDE`` pixels a side is first box-reduced to it (:func:`shrink`,
the first step of ``to_model_input``, which the server takes as it decodes an upload): a LANCZOS
resize straight from a huge or extremely narrow picture to 28x28 builds filter tables that grow
with the reduction ratio (gigabytes for a picture of 16,000,000x1 pixels).
"""
from __future__ import annotations

import os

import numpy as np

from mnistflow.core.errors import fail
from mnistflow.data.formats.image import WORK_SIDE, open_picture, shrink

__all__ = ["WORK_SIDE", "open_picture", "read_picture", "shrink", "to_model_input",
           "mnist_style", "flatten_alpha", "invert_for", "needs_invert"]


def read_picture(path: str | os.PathLike, max_pixels: int | None = None) -> np.ndarray:
    """A picture file as uint8 (H, W) grey or (H, W, 3) colour, its size checked before
    decoding (see ``open_picture``); every failure is a ``MnistflowError`` naming the file."""
    with open_picture(path, path, max_pixels) as im:
        try:
            im.load()
            grey = im.mode in ("L", "1", "P", "I;16", "LA")
            return np.asarray(im.convert("L") if grey else im.convert("RGB"))
        except Exception as e:  # truncated or corrupt image data
            fail(path, f"not a readable image ({type(e).__name__}: {e})")


def needs_invert(img: np.ndarray) -> bool:
    """True for dark-on-light pictures (the border is bright), e.g. a photo of ink on paper."""
    g = img if img.ndim == 2 else img.mean(-1)
    border = np.concatenate([g[0], g[-1], g[:, 0], g[:, -1]])
    return float(border.mean()) > 127


def invert_for(img: np.ndarray, dark_background: bool = True) -> bool:
    """Whether ``img`` must be inverted to match training data with a dark (MNIST) or light
    background; the picture's own background is read from its border."""
    return needs_invert(img) == dark_background


def flatten_alpha(a: np.ndarray) -> np.ndarray:
    """(H, W, 2) grey+alpha or (H, W, 4) RGBA -> (H, W) or (H, W, 3) uint8.

    Transparent parts become a background that contrasts with the ink (the opaque pixels):
    white behind dark ink, black behind light ink. A drawing on a transparent canvas keeps
    its strokes whatever their colour.
    """
    a = np.asarray(a)
    colour = a[..., :-1].astype(np.float32)
    alpha = a[..., -1:].astype(np.float32) / 255
    opaque = alpha[..., 0] > 0.5
    ink_dark = float(colour[opaque].mean()) < 128 if opaque.any() else True
    out = colour * alpha + (255.0 if ink_dark else 0.0) * (1 - alpha)
    out = np.clip(out + 0.5, 0, 255).astype(np.uint8)
    return out[..., 0] if out.shape[-1] == 1 else out


def mnist_style(gray: np.ndarray, size: int = 28, box: int = 20) -> np.ndarray:
    """(H, W) grey image, white digit on black, any size -> (size, size) uint8, MNIST-like."""
    from PIL import Image

    g = np.asarray(gray, dtype=np.float32)
    ink = g > 0.1 * max(float(g.max()), 1.0)
    rows, cols = np.flatnonzero(ink.any(1)), np.flatnonzero(ink.any(0))
    del ink  # the bounding box from per-row/column flags: no index arrays of every ink pixel
    if len(rows) == 0:
        return np.zeros((size, size), np.uint8)
    crop = g[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
    h, w = crop.shape
    scale = box / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    img = Image.fromarray(np.clip(crop, 0, 255).astype(np.uint8)).resize((nw, nh), Image.LANCZOS)
    small = np.asarray(img, dtype=np.float32)
    out = np.zeros((size, size), np.float32)
    total = small.sum()
    cy, cx = ((np.indices(small.shape) * small).reshape(2, -1).sum(1) / total) if total else (nh / 2, nw / 2)
    top = int(round(size / 2 - cy))
    left = int(round(size / 2 - cx))
    top = min(max(top, 0), size - nh)
    left = min(max(left, 0), size - nw)
    out[top:top + nh, left:left + nw] = small
    return np.clip(out, 0, 255).astype(np.uint8)


def to_model_input(img: np.ndarray, in_shape: tuple[int, int, int], *, invert: bool | None = None,
                   mnist: bool = False, dark_background: bool = True) -> np.ndarray:
    """Any (H, W) or (H, W, C) uint8 image -> (H', W', C') uint8 for a model of ``in_shape``.

    ``invert``: True/False, or None to decide from the picture (only for grey models): the
    picture is inverted when its background differs from the training data's
    (``dark_background``: True for MNIST's white on black).
    ``mnist``: bounding-box + centre-of-mass placement (grey 28x28 models).
    An alpha channel is flattened onto a background that contrasts with the ink. An image
    over ``WORK_SIDE`` pixels a side (a picture file, an IDX item, a caller's array) is
    ``shrink``-ed first: memory stays bounded whatever its size or aspect ratio.
    """
    from PIL import Image

    c, h, w = in_shape
    a = np.asarray(img)
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[..., 0]
    if a.dtype == np.uint8 and (a.ndim == 2 or (a.ndim == 3 and a.shape[2] in (2, 3, 4))) \
            and max(a.shape[:2]) > WORK_SIDE:
        a = np.asarray(shrink(Image.fromarray(np.ascontiguousarray(a))))
    if a.ndim == 3 and a.shape[2] in (2, 4):
        a = flatten_alpha(a)
    if c == 1:  # float32 (never float64) and inverted in place: a few bytes per pixel
        g = a.astype(np.float32) if a.ndim == 2 else a.mean(-1, dtype=np.float32)
        if invert is None:
            invert = invert_for(g, dark_background)
        if invert:
            np.subtract(255, g, out=g)
        if mnist:
            out = mnist_style(g, size=h)
            if (h, w) != out.shape:
                out = np.asarray(Image.fromarray(out).resize((w, h), Image.LANCZOS))
        else:
            out = np.asarray(Image.fromarray(np.clip(g, 0, 255).astype(np.uint8)).resize((w, h), Image.LANCZOS))
        return out[..., None]
    rgb = np.stack([a] * 3, -1) if a.ndim == 2 else a
    if invert:
        rgb = 255 - rgb
    return np.asarray(Image.fromarray(rgb.astype(np.uint8)).resize((w, h), Image.LANCZOS))
