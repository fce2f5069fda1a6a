"""Request bodies -> the uint8 image the model sees, or a ``BadInput`` with an HTTP status.

Two kinds of body:
* an image file (PNG, JPEG; also WebP, GIF, BMP): a photo, a scan, the page's canvas;
* JSON ``{"pixels": [[...]]}``: an H x W (grey) or H x W x C (C = 1, 3 or 4) array of
  numbers in 0..255 (floats are rounded).

Which preprocessing (``preprocess`` in the JSON, or ``?preprocess=`` in the URL):
* ``auto`` (default): a picture that already has the model's size (H x W, and its channel
  count or grey) is used as it is; anything else gets ``mnist`` (grey models) or ``resize``
  (colour models).
* ``none``: use the picture unchanged; it must have the model's size.
* ``mnist``: as the MNIST digits were made: the ink's bounding box scaled to 20x20
  (anti-aliased), placed by its centre of mass in 28x28, polarity turned to the training
  data's (dark or light background, read from the picture's border).
* ``resize``: the whole picture resized to the model's size (polarity as for ``mnist`` for
  grey models).
"""
from __future__ import annotations

import io
import json

import numpy as np

from mnistflow.artifacts.model_file import ModelInfo

MAX_BODY = 2 * 1024 * 1024  # bytes
MAX_IMAGE_PIXELS = 4096 * 4096  # a 2 MB PNG can claim far more; refuse before decoding
MAX_SIDE = 1024  # JSON pixel arrays
FORMATS = ["PNG", "JPEG", "WEBP", "GIF", "BMP"]
MODES = ("auto", "none", "mnist", "resize")


class BadInput(Exception):
    """A request the server refuses: ``status`` (4xx) and a message for the JSON error."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def decode_image(data: bytes) -> np.ndarray:
    """PNG/JPEG/... bytes -> uint8 (H, W) grey, (H, W, 3) colour, or with alpha (H, W, 2|4)."""
    from PIL import Image

    try:
        im = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError:
        raise BadInput(413, f"the image has too many pixels: at most {MAX_IMAGE_PIXELS:,}") from None
    except Exception:
        raise BadInput(400, "the body is not a decodable image (PNG or JPEG), nor JSON with "
                            "Content-Type: application/json") from None
    w, h = im.size
    if w * h > MAX_IMAGE_PIXELS or w == 0 or h == 0:
        raise BadInput(413, f"image of {w}x{h} pixels: at most {MAX_IMAGE_PIXELS:,} pixels")
    try:
        im.load()
        if im.mode in ("1", "L", "I", "I;16", "F"):
            im = im.convert("L")
        elif im.mode in ("LA", "La", "RGBA", "RGBa", "PA") or (im.mode == "P" and "transparency" in im.info):
            im = im.convert("RGBA")
        else:
            im = im.convert("RGB")
        a = np.asarray(im)
    except Exception as e:  # truncated or corrupt data
        raise BadInput(400, f"the image could not be decoded ({e.__class__.__name__}: {e})") from None
    return a


def parse_json(data: bytes) -> tuple[np.ndarray, str | None]:
    """JSON body -> (uint8 pixels, the body's ``preprocess`` or None)."""
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise BadInput(400, f"the body is not valid JSON ({e.__class__.__name__})") from None
    if not isinstance(obj, dict) or "pixels" not in obj:
        raise BadInput(422, 'expected a JSON object {"pixels": [[...], ...]}')
    mode = obj.get("preprocess")
    if mode is not None and mode not in MODES:
        raise BadInput(422, f"preprocess must be one of {', '.join(MODES)}, got {mode!r}")
    return parse_pixels(obj["pixels"]), mode


def parse_pixels(pixels) -> np.ndarray:
    """A nested list of numbers 0..255, H x W or H x W x C -> uint8 array; strict."""
    if not isinstance(pixels, list) or not pixels:
        raise BadInput(422, "pixels must be a non-empty H x W (or H x W x C) array of numbers")
    try:
        arr = np.array(pixels)
    except (ValueError, RecursionError):
        raise BadInput(422, "pixels is ragged: every row must have the same length") from None
    if arr.dtype == object:
        raise BadInput(422, "pixels must be a rectangular array of numbers (no nulls, no rows "
                            "of different lengths)")
    if arr.dtype.kind not in "iuf":
        raise BadInput(422, f"pixels must be numbers, got {arr.dtype.kind == 'b' and 'booleans' or 'text'}")
    if arr.ndim not in (2, 3) or arr.size == 0:
        raise BadInput(422, f"pixels must be H x W or H x W x C, got shape {list(arr.shape)}")
    if arr.ndim == 3 and arr.shape[2] not in (1, 3, 4):
        raise BadInput(422, f"pixels has {arr.shape[2]} channels; expected 1, 3 or 4")
    if max(arr.shape[:2]) > MAX_SIDE:
        raise BadInput(422, f"pixels of {arr.shape[0]}x{arr.shape[1]}: at most {MAX_SIDE} per side")
    arr = arr.astype(np.float64)
    if not np.isfinite(arr).all():
        raise BadInput(422, "pixels contains NaN or infinite values")
    lo, hi = float(arr.min()), float(arr.max())
    if lo < 0 or hi > 255:
        raise BadInput(422, f"pixel values must be in 0..255, got {lo:g}..{hi:g}")
    return np.rint(arr).astype(np.uint8)


def pick_mode(img: np.ndarray, info: ModelInfo, mode: str | None) -> str:
    """Resolve ``auto`` and check ``none`` against the model's input size."""
    c, h, w = info.in_shape
    mode = mode or "auto"
    if mode not in MODES:
        raise BadInput(422, f"preprocess must be one of {', '.join(MODES)}, got {mode!r}")
    chans = 1 if img.ndim == 2 else img.shape[2]
    exact = img.shape[:2] == (h, w) and chans in ((1,) if c == 1 else (c,))
    if mode == "none" and not exact:
        raise BadInput(422, f"preprocess 'none' needs a {h}x{w}x{c} picture, got "
                            f"{'x'.join(map(str, img.shape))}")
    if mode == "auto":
        return "none" if exact else ("mnist" if c == 1 else "resize")
    return mode


def dark_background(info: ModelInfo) -> bool:
    """The training data's polarity, from its mean (MNIST: mean ~33 of 255, a dark background)."""
    return sum(info.mean) / max(len(info.mean), 1) < 127


def to_input(img: np.ndarray, info: ModelInfo, mode: str | None = None) -> tuple[np.ndarray, str]:
    """A decoded picture -> ((H, W, C) uint8 at the model's size, the preprocessing used)."""
    from mnistflow.data.picture import to_model_input

    mode = pick_mode(img, info, mode)
    c, h, w = info.in_shape
    if mode == "none":
        x = img.reshape(h, w, c)
    else:
        x = to_model_input(img, (c, h, w), invert=None, mnist=mode == "mnist",
                           dark_background=dark_background(info))
    return np.array(x, dtype=np.uint8, order="C"), mode  # a writable copy for torch


def is_json(content_type: str, data: bytes) -> bool:
    ct = content_type.split(";")[0].strip().lower()
    if ct == "application/json" or ct.endswith("+json"):
        return True
    return not ct.startswith("image/") and data.lstrip()[:1] in (b"{", b"[")
