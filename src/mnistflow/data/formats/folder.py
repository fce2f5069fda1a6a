"""A folder of class folders of images -> ``RawDataset``.

    DIR/<class>/*.png|jpg           one sub-folder per class; class names = sorted folder names
                                    (class i is the i-th name: the names are what users see)
    DIR/train/<class>/ + DIR/test/<class>/   (or training/ + testing/): with a test split

Images are decoded with Pillow. Grey images give C=1; if any image has colour, every
image is converted to RGB (C=3). All images must have one size unless ``resize=(H, W)``.
The helpers ``decode_image`` and ``stack_images`` are shared with the TFRecord reader.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np

from mnistflow.core.errors import MnistflowError, fail
from mnistflow.data.formats.image import PICTURE_SUFFIXES, WORK_SIDE, open_picture, shrink
from mnistflow.data.formats.raw import (
    RawDataset,
    RawSplit,
    check_dataset_bytes,
    dataset_from_labels,
)

_GREY_MODES = {"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"}
_TRAIN_NAMES = ("train", "training")
_TEST_NAMES = ("test", "testing")


def _resample():
    from PIL import Image

    return getattr(Image, "Resampling", Image).BILINEAR


def decode_image(src: bytes | Path, where: str | os.PathLike,
                 resize: tuple[int, int] | None = None, max_pixels: int | None = None) -> np.ndarray:
    """Decode one image (a file or encoded bytes) to uint8 (H, W, 1) or (H, W, 3); its size
    is checked against ``max_pixels`` (default ``core.limits.MAX_PIXELS``) before decoding.

    ``where`` names the image in errors ("<file>" or "<file>: record 7").
    """
    from PIL import Image

    try:
        with open_picture(src, where, max_pixels) as img:
            img.load()
            palette = img.mode == "P"
            if img.mode.startswith("I;16"):  # 16-bit grey: keep the high byte, do not clip
                img = Image.fromarray((np.asarray(img).astype(np.uint16) >> 8).astype(np.uint8))
            mode = "L" if img.mode in _GREY_MODES else "RGB"
            if img.mode != mode:
                img = img.convert(mode)
            if resize is not None:  # box-reduced first: the resize's filter tables stay small
                img = shrink(img, max(WORK_SIDE, *resize)).resize((resize[1], resize[0]), _resample())
            arr = np.asarray(img, dtype=np.uint8)
    except MnistflowError:
        raise
    except Exception as e:  # Pillow raises many kinds (OSError, SyntaxError, ValueError, ...)
        fail(where, f"not a readable PNG/JPEG image ({type(e).__name__}: {e})")
    if arr.ndim == 2:
        arr = arr[..., None]
    elif palette and (arr[..., 0] == arr[..., 1]).all() and (arr[..., 1] == arr[..., 2]).all():
        arr = arr[..., :1]  # a grey palette is grey, not colour
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        fail(where, "image has no pixels")
    return np.ascontiguousarray(arr)


def check_size(arr: np.ndarray, where: str, ref: tuple[tuple[int, int], str] | None) -> None:
    """An image whose (H, W) differs from the first one's is an error naming both."""
    if ref is not None and arr.shape[:2] != ref[0]:
        (h, w), first = ref
        fail(where, f"image is {arr.shape[0]}x{arr.shape[1]} (HxW) but {first} is {h}x{w}; "
                    "images must share one size (or pass --resize HxW)")


def stack_images(arrays: list[np.ndarray]) -> np.ndarray:
    """Stack (H, W, C) images to (N, H, W, C); grey ones become RGB if any image is RGB."""
    if any(a.shape[-1] == 3 for a in arrays):
        arrays = [np.repeat(a, 3, axis=-1) if a.shape[-1] == 1 else a for a in arrays]
    return np.stack(arrays)


def _subdirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def _class_files(folder: Path) -> list[Path]:
    files = []
    for p in sorted(folder.iterdir()):
        if p.name.startswith("."):
            continue
        mode = p.stat().st_mode
        if stat.S_ISDIR(mode):
            fail(p, "unexpected folder inside a class folder (expected only images)")
        if not stat.S_ISREG(mode):
            fail(p, "is not a regular file (a FIFO, socket or device?); refusing to read it")
        if p.suffix.lower() not in PICTURE_SUFFIXES:
            fail(p, f"not an image file (expected {', '.join(sorted(PICTURE_SUFFIXES))})")
        files.append(p)
    if not files:
        fail(folder, "class folder has no images")
    return files


def _read_split(root: Path, classes: list[str], resize: tuple[int, int] | None,
                ref: tuple[tuple[int, int], str] | None, max_pixels: int | None, total: list[int]):
    xs, ys = [], []
    for label, cls in enumerate(classes):
        folder = root / cls
        if not folder.is_dir():
            continue
        files = _class_files(folder)
        for f in files:
            arr = decode_image(f, f, resize, max_pixels)
            check_size(arr, str(f), ref)
            if ref is None:  # every image has this size: the whole set's bytes, known now
                ref = (arr.shape[:2], str(f))
            total[0] += arr.nbytes
            check_dataset_bytes(root, total[0])
            xs.append(arr)
            ys.append(label)
    return xs, ys, ref


def _split_roots(path: Path) -> tuple[Path, Path | None]:
    """(train root, test root or None): the train/test layout when that is what is here."""
    subs = {p.name.lower(): p for p in _subdirs(path)}
    train = next((subs[n] for n in _TRAIN_NAMES if n in subs), None)
    if train is not None and set(subs) <= set(_TRAIN_NAMES + _TEST_NAMES) and _subdirs(train):
        test = next((subs[n] for n in _TEST_NAMES if n in subs), None)
        return train, test
    return path, None


def read_image_folder(path: str | os.PathLike, resize: tuple[int, int] | None = None,
                      name: str | None = None, max_pixels: int | None = None) -> RawDataset:
    """Read ``path/<class>/*.png`` (or ``path/{train,test}/<class>/``) into a ``RawDataset``;
    ``max_pixels`` caps each image's size before it is decoded (``core.limits.MAX_PIXELS``)."""
    path = Path(path)
    if not path.is_dir():
        fail(path, "not a folder")
    train_root, test_root = _split_roots(path)
    classes = [p.name for p in _subdirs(train_root)]
    if not classes:
        fail(train_root, "no class folders here (expected one sub-folder of images per class)")
    total = [0]
    xs, ys, ref = _read_split(train_root, classes, resize, None, max_pixels, total)
    all_x, test = xs, None
    if test_root is not None:
        extra = [p for p in _subdirs(test_root) if p.name not in classes]
        if extra:
            fail(extra[0], f"test class '{extra[0].name}' has no training folder in {train_root}")
        txs, tys, _ = _read_split(test_root, classes, resize, ref, max_pixels, total)
        if not txs:
            fail(test_root, "test folder has no class folders with images")
        all_x = xs + txs
    x = stack_images(all_x)
    n = len(xs)
    train = RawSplit(x[:n], np.asarray(ys, np.int64))
    if test_root is not None:
        test = RawSplit(x[n:], np.asarray(tys, np.int64))
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    return dataset_from_labels(name or path.resolve().name, train, test, files, classes,
                               where=train_root, test_where=test_root)
