"""Turn a user's picture into one of the images a model was trained on.

:func:`prepare` is the one preparation that ``predict`` gives a picture file and ``serve`` an
upload, by default, for the model's dataset (:class:`Target`):

* polarity (grey models): the picture is inverted when its background, read from its border,
  differs from the training data's (MNIST is white on black: ink on paper is inverted);
* geometry (``FITS``): the ink's bounding box is scaled and placed as the dataset's images
  were made; the known-dataset table names each dataset's way (``KnownDataset.picture``):

  - ``mnist`` (MNIST, QMNIST, KMNIST, and a grey dataset mnistflow does not know): the box
    scaled to 20x20 (aspect kept), placed so that its centre of mass is at the centre of
    28x28, as LeCun describes MNIST (its test digits: long side 20, mass centred to 0.3 px);
  - ``emnist``: the box centred in the square with a 2-pixel border, as the EMNIST paper
    (Cohen et al., 2017) describes its conversion;
  - ``fashion`` (Fashion-MNIST): the box's long side scaled to the full side and the box
    centred, as Xiao et al. (2017) describe it (its test images: long side 28 in 99%);
  - ``resize`` (CIFAR-10, any colour model): the whole picture resized. A photo has no ink to
    crop, and colours are never inverted.

* a picture that already is one of the dataset's images (the model's size and channels and,
  for grey models, the data's polarity: a test image saved as a PNG) is used as it is.

:func:`as_is` is the other way (``predict --as-is``, IDX files, arrays): the picture unchanged,
only resized when its size is not the model's.

Reading pictures: ``open_picture`` / ``read_picture`` check the image's size from its header
before decoding anything: at most ``core.limits.MAX_PIXELS`` pixels unless the caller passes
``max_pixels`` (the CLI's ``--max-pixels``); a FIFO or other non-regular file is refused. A
picture larger than ``WORK_SIDE`` pixels a side is first box-reduced to it (:func:`shrink`): a
LANCZOS resize straight from a huge or extremely narrow picture to 28x28 builds filter tables
that grow with the reduction ratio (gigabytes for a picture of 16,000,000x1 pixels).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mnistflow.core.errors import MnistflowError, fail
from mnistflow.data.formats.image import WORK_SIDE, open_picture, shrink, working_mode

__all__ = ["WORK_SIDE", "FITS", "STYLES", "Fit", "Target", "open_picture", "read_picture", "shrink",
           "prepare", "as_is", "flatten_alpha", "invert_for", "needs_invert"]


@dataclass(frozen=True)
class Fit:
    """Where the ink's bounding box goes: its long side scaled to ``box`` of the image's side,
    then placed by its centre of mass (``by_mass``) or by its own centre."""

    box: float
    by_mass: bool


FITS = {"mnist": Fit(20 / 28, True), "emnist": Fit(24 / 28, False), "fashion": Fit(1.0, False)}
STYLES = (*FITS, "resize")  # the ways a picture becomes a dataset's image (``KnownDataset.picture``)


@dataclass(frozen=True)
class Target:
    """The images a model was trained on, as a picture must be made to match them: the model's
    input ``shape`` (C, H, W), the dataset's ``style`` (one of ``STYLES``) and its polarity."""

    shape: tuple[int, int, int]
    style: str
    dark_background: bool

    @classmethod
    def of(cls, in_shape: Sequence[int], mean: Sequence[float], dataset: str | None) -> Target:
        """The target of a model: its input shape, its data's mean (a dark background: MNIST's
        mean is 33 of 255) and its dataset's name (its style from the known-dataset table; a
        dataset mnistflow does not know: ``mnist`` for a grey model, ``resize`` for colour)."""
        from mnistflow.data import known

        c, h, w = (int(v) for v in in_shape)
        try:
            ds = known.lookup(dataset) if isinstance(dataset, str) else None
        except MnistflowError:  # "emnist" alone names no split: a user's own folder name
            ds = None
        style = ds.picture if ds is not None else ("mnist" if c == 1 else "resize")
        return cls((c, h, w), style, sum(mean) / max(len(mean), 1) < 127)


def read_picture(path: str | os.PathLike, max_pixels: int | None = None) -> np.ndarray:
    """A picture file as uint8 (H, W) grey, (H, W, 3) colour or (H, W, 4) with transparency
    (``image.working_mode``, as the server decodes an upload), its size checked before
    decoding (see ``open_picture``); every failure is a ``MnistflowError`` naming the file."""
    with open_picture(path, path, max_pixels) as im:
        try:
            im.load()
            return np.asarray(working_mode(im))
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


def fit_ink(gray: np.ndarray, size: int, fit: Fit) -> np.ndarray:
    """(H, W) grey image, light ink on black, any size -> (size, size) uint8 with the ink's
    bounding box scaled and placed by ``fit``."""
    from PIL import Image

    g = np.asarray(gray, dtype=np.float32)
    ink = g > 0.1 * max(float(g.max()), 1.0)
    rows, cols = np.flatnonzero(ink.any(1)), np.flatnonzero(ink.any(0))
    del ink  # the bounding box from per-row/column flags: no index arrays of every ink pixel
    if len(rows) == 0:
        return np.zeros((size, size), np.uint8)
    crop = g[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
    h, w = crop.shape
    box = max(1, round(fit.box * size))
    scale = box / max(h, w)
    nh, nw = min(size, max(1, round(h * scale))), min(size, max(1, round(w * scale)))
    img = Image.fromarray(np.clip(crop, 0, 255).astype(np.uint8)).resize((nw, nh), Image.LANCZOS)
    small = np.asarray(img, dtype=np.float32)
    total = small.sum()
    if fit.by_mass and total:
        cy, cx = (np.indices(small.shape) * small).reshape(2, -1).sum(1) / total
        top, left = int(round(size / 2 - cy)), int(round(size / 2 - cx))
    else:
        top, left = (size - nh) // 2, (size - nw) // 2
    top, left = min(max(top, 0), size - nh), min(max(left, 0), size - nw)
    out = np.zeros((size, size), np.float32)
    out[top:top + nh, left:left + nw] = small
    return np.clip(out, 0, 255).astype(np.uint8)


def _decoded(img: np.ndarray) -> np.ndarray:
    """Any (H, W) or (H, W, C) uint8 image as (H, W) grey or (H, W, 3) colour: a single
    channel dropped, an alpha channel flattened onto a background that contrasts with the
    ink, and an image over ``WORK_SIDE`` pixels a side (a picture file, an IDX item, a
    caller's array) ``shrink``-ed first: memory stays bounded whatever its size or shape."""
    from PIL import Image

    a = np.asarray(img)
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[..., 0]
    if a.dtype == np.uint8 and (a.ndim == 2 or (a.ndim == 3 and a.shape[2] in (2, 3, 4))) \
            and max(a.shape[:2]) > WORK_SIDE:
        a = np.asarray(shrink(Image.fromarray(np.ascontiguousarray(a))))
    if a.ndim == 3 and a.shape[2] in (2, 4):
        a = flatten_alpha(a)
    return a


def _resized(a: np.ndarray, h: int, w: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(a).resize((w, h), Image.LANCZOS))


def _grey(a: np.ndarray) -> np.ndarray:
    """float32 (never float64: a few bytes per pixel) grey values of (H, W) or (H, W, 3)."""
    return a.astype(np.float32) if a.ndim == 2 else a.mean(-1, dtype=np.float32)


def as_is(img: np.ndarray, in_shape: Sequence[int]) -> np.ndarray:
    """The picture unchanged, as the model's input (H, W, C) uint8: only resized when its size
    is not the model's, made grey or colour as the model takes it."""
    c, h, w = in_shape
    a = _decoded(img)
    if c == 1:
        return _resized(np.clip(_grey(a), 0, 255).astype(np.uint8), h, w)[..., None]
    return _resized((np.stack([a] * 3, -1) if a.ndim == 2 else a).astype(np.uint8), h, w)


def is_dataset_image(a: np.ndarray, target: Target) -> bool:
    """Whether a decoded picture already is one of the dataset's images: the model's size and
    channels and, for a grey model, the training data's polarity."""
    c, h, w = target.shape
    if a.shape[:2] != (h, w) or (a.ndim == 2) != (c == 1) or (a.ndim == 3 and a.shape[2] != c):
        return False
    return c != 1 or not invert_for(a, target.dark_background)


def prepare(img: np.ndarray, target: Target, style: str = "auto") -> tuple[np.ndarray, str]:
    """A picture (uint8 (H, W) or (H, W, C), any size) as the model's input (H, W, C) uint8,
    made as ``target``'s dataset images were (see the module docstring), and the way used:
    ``none`` (already one of them) or a style. ``style``: ``auto`` (that rule) or one of
    ``STYLES`` to force it."""
    a = _decoded(img)
    if style == "auto":
        if is_dataset_image(a, target):
            return np.array(a, np.uint8).reshape(target.shape[1], target.shape[2], -1), "none"
        style = target.style
    c, h, w = target.shape
    if c != 1:  # colour: the whole picture resized, never inverted
        return as_is(a, target.shape), "resize"
    g = _grey(a)
    if invert_for(g, target.dark_background):
        np.subtract(255, g, out=g)
    if style in FITS:
        out = fit_ink(g, h, FITS[style])
        if (h, w) != out.shape:
            out = _resized(out, h, w)
    else:
        out = _resized(np.clip(g, 0, 255).astype(np.uint8), h, w)
    return out[..., None], style
