"""Request bodies -> the uint8 image the model sees, or a ``BadInput`` with an HTTP status.

What a body may hold:
* an image file (PNG, JPEG; also WebP, GIF, BMP): a photo, a scan, the page's canvas; as the
  body itself, or as the file part of a multipart/form-data upload (``curl -F file=@x.png``);
* JSON ``{"pixels": [[...]]}``: an H x W (grey) or H x W x C (C = 1, 3 or 4) array of
  numbers in 0..255 (floats are rounded).

Which preparation (``preprocess`` in the JSON, a form field, or ``?preprocess=`` in the URL):
* ``auto`` (default): ``data.picture.prepare``'s rule, the one ``mnistflow predict`` follows
  for a picture file: a picture that already is one of the dataset's images (the model's size
  and channels, and the training data's polarity) is used as it is (``none``); anything else
  is made as the dataset's images were made (``mnist``, ``emnist``, ``fashion`` or ``resize``:
  the dataset's style, see ``data.picture``).
* ``none``: use the picture unchanged; it must have the model's size.
* ``mnist``, ``emnist``, ``fashion``: that style whatever the dataset: the ink's bounding box
  scaled and placed as those datasets' images were made, the polarity turned to the training
  data's (dark or light background, read from the picture's border).
* ``resize``: the whole picture resized to the model's size (polarity as above for grey
  models).
"""
from __future__ import annotations

import io
import json

import numpy as np

from mnistflow.artifacts.model_info import ModelInfo
from mnistflow.core.limits import MAX_JSON_SIDE, MAX_PIXELS
from mnistflow.data.picture import STYLES
from mnistflow.server.guard import BadInput, Limits, body_kind

__all__ = ["decode_image", "parse_json", "to_input", "is_json"]

DEFAULTS = Limits()
MODES = ("auto", "none", *STYLES)


def decode_image(data: bytes, limits: Limits = DEFAULTS) -> np.ndarray:
    """PNG/JPEG/... bytes -> uint8 (H, W) grey, (H, W, 3) colour, or with alpha (H, W, 2|4).

    Bounded before decoding: the size from the header (after choosing a JPEG's reduced decode
    scale) must be at most ``limits.max_pixels`` pixels, the decode cost reasonable
    (``image.decode_cost_problem``: a JPEG's scans) and a progressive JPEG's full size within
    ``core.limits.MAX_PIXELS`` (it keeps every coefficient of that size while decoding,
    whatever the scale), else 413; the decoded picture is
    reduced (box filter: ``data.picture.shrink``, the step ``predict`` takes too) to at most
    ``limits.work_side`` pixels a side before it becomes an array, so what follows costs no
    more than a 1024x1024 picture would."""
    from PIL import Image

    from mnistflow.data.formats.image import PICTURE_FORMATS, decode_cost_problem, working_mode
    from mnistflow.data.picture import shrink

    buf = io.BytesIO(data)
    try:
        im = Image.open(buf, formats=PICTURE_FORMATS)
    except Image.DecompressionBombError:  # over twice Pillow's own limit: far over ours
        raise BadInput(413, f"the image has too many pixels: at most {limits.max_pixels:,}") from None
    except Exception:
        raise BadInput(400, "the body is not a decodable image (PNG or JPEG), nor JSON with "
                            "Content-Type: application/json") from None
    w, h = im.size
    if w == 0 or h == 0:
        raise BadInput(400, f"image of {w}x{h} pixels has no pixels")
    problem = decode_cost_problem(im, buf)
    if problem:
        raise BadInput(413, f"refusing to decode {problem}")
    if im.format in ("JPEG", "MPO") and im.info.get("progressive") and w * h > max(MAX_PIXELS, limits.max_pixels):
        raise BadInput(413, f"a progressive JPEG of {w}x{h} pixels: at most {max(MAX_PIXELS, limits.max_pixels):,} "
                            "(it is decoded whole, whatever the scale)")
    side = limits.work_side
    if im.format == "JPEG" and max(w, h) > side:  # decode at 1/2, 1/4 or 1/8 scale: far cheaper
        im.draft(im.mode if im.mode in ("L", "RGB") else None, (side * w // max(w, h), side * h // max(w, h)))
    dw, dh = im.size
    if dw * dh > limits.max_pixels:
        raise BadInput(413, f"image of {w}x{h} pixels: at most {limits.max_pixels:,} pixels")
    try:
        im.load()
        a = np.asarray(shrink(working_mode(im), side))
    except Exception as e:  # truncated or corrupt data
        raise BadInput(400, f"the image could not be decoded ({e.__class__.__name__}: {str(e)[:160]})") from None
    return a


def parse_json(data: bytes) -> tuple[np.ndarray, str | None]:
    """JSON body -> (uint8 pixels, the body's ``preprocess`` or None)."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as e:  # (UnicodeDecodeError, JSONDecodeError, an int past 4300 digits)
        raise BadInput(400, f"the body is not valid JSON ({e.__class__.__name__})") from None
    if not isinstance(obj, dict) or "pixels" not in obj:
        raise BadInput(422, 'expected a JSON object {"pixels": [[...], ...]}')
    mode = obj.get("preprocess")
    if mode is not None and mode not in MODES:
        raise BadInput(422, f"preprocess must be one of {', '.join(MODES)}, got {mode!r}")
    return parse_pixels(obj["pixels"]), mode


def parse_pixels(pixels: object) -> np.ndarray:
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
    if max(arr.shape[:2]) > MAX_JSON_SIDE:
        raise BadInput(422, f"pixels of {arr.shape[0]}x{arr.shape[1]}: at most {MAX_JSON_SIDE} per side")
    arr = arr.astype(np.float64)
    if not np.isfinite(arr).all():
        raise BadInput(422, "pixels contains NaN or infinite values")
    lo, hi = float(arr.min()), float(arr.max())
    if lo < 0 or hi > 255:
        raise BadInput(422, f"pixel values must be in 0..255, got {lo:g}..{hi:g}")
    return np.rint(arr).astype(np.uint8)


def pick_mode(img: np.ndarray, info: ModelInfo, mode: str | None) -> str:
    """``mode`` checked: one of ``MODES`` (None is ``auto``), and ``none`` only for a picture
    at the model's input size."""
    c, h, w = info.in_shape
    mode = mode or "auto"
    if mode not in MODES:
        raise BadInput(422, f"preprocess must be one of {', '.join(MODES)}, got {mode!r}")
    chans = 1 if img.ndim == 2 else img.shape[2]
    exact = img.shape[:2] == (h, w) and chans in ((1,) if c == 1 else (c,))
    if mode == "none" and not exact:
        raise BadInput(422, f"preprocess 'none' needs a {h}x{w}x{c} picture, got "
                            f"{'x'.join(map(str, img.shape))}")
    return mode


def to_input(img: np.ndarray, info: ModelInfo, mode: str | None = None,
             min_side: int = DEFAULTS.min_side) -> tuple[np.ndarray, str]:
    """A decoded picture -> ((H, W, C) uint8 at the model's size, the preparation used: none
    or a style). ``auto`` is ``data.picture.prepare``'s rule, the one ``predict`` follows for
    a picture file. A picture under ``min_side`` pixels a side (unless at the model's size)
    is a 400."""
    from mnistflow.data.picture import Target, prepare

    mode = pick_mode(img, info, mode)
    c, h, w = info.in_shape
    if mode == "none":
        return np.array(img.reshape(h, w, c), dtype=np.uint8, order="C"), mode
    if img.shape[:2] != (h, w) and min(img.shape[:2]) < min(min_side, h, w):
        raise BadInput(400, f"image of {img.shape[1]}x{img.shape[0]} pixels is too small to "
                            f"classify: at least {min(min_side, h, w)} pixels a side")
    x, used = prepare(img, Target.of(info.in_shape, info.mean, info.dataset), mode)
    return np.array(x, dtype=np.uint8, order="C"), used  # a writable copy for torch


def is_json(content_type: str, data: bytes) -> bool:
    """Whether the body is JSON pixels (else an image); a ``Content-Type`` the server does not
    accept is a 415 (``guard.body_kind``)."""
    kind = body_kind(content_type)
    return kind == "json" or (kind == "sniff" and data.lstrip()[:1] in (b"{", b"["))
