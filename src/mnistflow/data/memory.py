"""Data a Python user holds in memory, as a record set: an ``(x, y)`` pair of numpy arrays or
torch tensors, a torch ``Dataset`` yielding ``(image, label)``, or a ``DataLoader`` yielding
``(images, labels)`` batches. ``open.training_data`` (``mnistflow.train``'s ``data``,
``val_data``, ``test_data``) and ``open.open_data`` (``mnistflow.evaluate(data=...)``) bring it here.

It is read once into uint8 images and written into the cache as records named by a hash of
their content (``$MNISTFLOW_HOME/records/in-memory-HASH``), then opened like any records:
training, resume, the run's ``config.toml`` (``data = <that directory>``), and ``eval`` or
``report`` of the run later all see ordinary records, and the same data given again is the same
record set, not written again. Memory stays bounded: images are held as uint8 whatever the
input's dtype, a Dataset is converted a chunk at a time, and the images of one argument take at
most ``core.limits.MAX_DATASET_BYTES`` (checked from ``len()`` before the rest is read, and as
it is read).

The rules (``docs/api.md`` says them to users):

* layout: ``x`` is N x H x W, N x H x W x C or N x C x H x W with C 1 or 3 (a Dataset's image:
  H x W, H x W x C or C x H x W, or a PIL image). The channel axis is the one of size 1 or 3,
  last or right after N; where both are (N x 3 x 5 x 3), torch tensors are channels-first
  (torch's layout) and numpy arrays channels-last (Keras' and PIL's).
* pixels: uint8 as they are; other integers must be 0..255; floats are on the 0..1 scale
  (torchvision's ``ToTensor``) when their largest value is at most 1, else on the 0..255 scale,
  and are rounded to the nearest level. The scale is told once for each argument: from a whole
  array, from a Dataset's first ``CHUNK`` images or a DataLoader's first batch (a later value
  above 1 on the 0..1 scale is an error). Negative values (normalized images), NaN, infinity or
  values above 255 are refused: mnistflow normalizes with the training images' mean and std itself.
* labels: integers >= 0, one per image (N or N x 1); the classes are the label values used, as
  for every raw input (``raw.from_original_labels``), named by the digits or by the Dataset's
  ``classes`` attribute (also found through a ``Subset`` or a ``DataLoader``).
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import torch

from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError, fail
from mnistflow.core.log import note
from mnistflow.core.paths import home
from mnistflow.data.formats.raw import (
    RawDataset,
    RawSplit,
    check_dataset_bytes,
    from_original_labels,
    summarize_values,
)
from mnistflow.data.prepare import check_room, default_val_size, up_to_date
from mnistflow.data.records import Records
from mnistflow.data.write_records import write_records

NAME = "in-memory"  # the records' dataset name, and the prefix of their folder in the cache
ACCEPTED = "a path, an (x, y) pair of numpy arrays or torch tensors, a torch Dataset, or a DataLoader"
CHUNK = 1024  # a Dataset's images converted at a time; its first chunk tells a float scale
FORMAT = 1  # of the cache key: how in-memory data becomes records (a change makes new records)
SEED = 0  # of the validation split carved from in-memory training data: prep's default
_VALUES_AT_A_TIME = 1 << 22  # pixel values converted at a time: temporaries of a few MB


@dataclass
class Part:
    """One data argument read: the images and labels a split of the record set is made of."""

    x: np.ndarray  # (N, H, W, C) uint8, C-contiguous
    y: np.ndarray  # (N,) int64 label values
    names: dict[int, str] | None = None  # class names by label value, where the data has them


def read(data: object, what: str, *, quiet: bool = False) -> Part:
    """``data`` (an (x, y) pair, a Dataset or a DataLoader) read into a ``Part``; ``what`` is
    the argument's name, which every error line starts with. ``quiet``: no notes."""
    from torch.utils.data import DataLoader, Dataset

    if isinstance(data, (tuple, list)):
        if len(data) != 2:
            fail(what, f"a {type(data).__name__} of {len(data)} items; expected (x, y): the images "
                       "and their labels")
        return _pair(data[0], data[1], what)
    if isinstance(data, DataLoader):
        if not quiet:
            _say_shuffled(data, what)
        return _collect(_loader_batches(data, what), what, None, _class_names(data, what))
    if isinstance(data, Dataset) or (hasattr(data, "__getitem__") and hasattr(data, "__len__")
                                     and not isinstance(data, (str, bytes, dict, np.ndarray, torch.Tensor))):
        n = _length(data, what)
        return _collect(_dataset_chunks(data, n, what), what, n, _class_names(data, what))
    hint = " (x alone? pass (x, y): the images and their labels)" if isinstance(
        data, (np.ndarray, torch.Tensor)) else ""
    raise MnistflowError(f"{what} must be {ACCEPTED}; got {type(data).__name__}{hint}")


def records_part(rec: Records, split: str) -> Part:
    """Split ``split`` of opened records as a ``Part`` (a path given beside data in memory)."""
    x, idx = rec.split(split)
    return Part(x, np.asarray(rec.label_values, np.int64)[idx], dict(zip(rec.label_values, rec.class_names)))


# --- reading ------------------------------------------------------------------------------

def _numpy(a: np.ndarray | torch.Tensor) -> np.ndarray:
    """A tensor as a numpy array on the CPU (bfloat16, which numpy lacks, as float32)."""
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu()
        return (a.float() if a.dtype == torch.bfloat16 else a).numpy()
    return a


def _pair(x: object, y: object, what: str) -> Part:
    """An ``(x, y)`` pair: the images as one batch, the labels one per image."""
    arr, dims = _batch(x, what, "x")
    labels = _labels(y, what, "y")
    if len(labels) != len(arr):
        fail(what, f"x has {np.ndim(x)} dimensions ({dims}) but y has {len(labels)} labels for "
                   f"{len(arr)} images")
    _check_images(arr, len(arr), what, "x")
    return Part(_Pixels(what, "x")(arr), labels)


def images(x: np.ndarray | torch.Tensor, what: str = "images") -> np.ndarray:
    """A batch of images in memory (``x`` of a pair, by the same rules) as uint8 N x H x W x C:
    for a verb that takes arrays of images without labels."""
    arr, _ = _batch(x, what, "x")
    _check_images(arr, len(arr), what, "x")
    return _Pixels(what, "x")(arr)


def _batch(x: object, what: str, label: str) -> tuple[np.ndarray, str]:
    """(``x``, a numpy array or tensor of images, as an N x H x W x C view; how its dimensions
    were read); one error line when it is not one, or holds no images."""
    if not isinstance(x, (np.ndarray, torch.Tensor)):
        fail(what, f"{label} is a {type(x).__name__}; expected a numpy array or a torch tensor of images")
    arr, dims = _layout(_numpy(x), isinstance(x, torch.Tensor))
    if arr is None:
        fail(what, f"{label} has shape {tuple(x.shape)}; expected {LAYOUTS}{_flat_hint(tuple(x.shape))}")
    if not len(arr):
        fail(what, f"{label} holds no images")
    return arr, dims


LAYOUTS = "N x H x W, N x H x W x C or N x C x H x W with C 1 or 3"


def _layout(x: np.ndarray, channels_first: bool) -> tuple[np.ndarray | None, str]:
    """(a batch ``x`` as N x H x W x C, a view, or None when it is none of the layouts; how its
    dimensions were read), by the rule of the module's docstring."""
    if x.ndim == 3:
        return x[..., None], "N x H x W"
    if x.ndim == 4:
        last, second = x.shape[3] in (1, 3), x.shape[1] in (1, 3)
        if second and (channels_first or not last):
            return x.transpose(0, 2, 3, 1), "N x C x H x W"
        if last:
            return x, "N x H x W x C"
    return None, ""


def _flat_hint(shape: tuple[int, ...]) -> str:
    """For flat images (N x 784): how to give them."""
    if len(shape) == 2 and shape[1] and math.isqrt(shape[1]) ** 2 == shape[1]:
        side = math.isqrt(shape[1])
        return f" (flat images? reshape them: x.reshape(-1, {side}, {side}))"
    return ""


def _check_images(x: np.ndarray, n: int | None, what: str, label: str) -> None:
    """Images the records can hold: some pixels each, an image within ``MAX_RECORD_VALUES``,
    and ``n`` of them (all there will be, where known) within ``MAX_DATASET_BYTES`` as uint8."""
    h, w, c = x.shape[1:]
    if not h or not w:
        fail(what, f"{label} holds images of {h} x {w} pixels")
    if h * w * c > limits.MAX_RECORD_VALUES:
        fail(what, f"{label}: an image of {h} x {w} x {c} values is larger than one image may be "
                   f"({limits.MAX_RECORD_VALUES:,} values)")
    if n is not None:
        check_dataset_bytes(what, n * h * w * c)


def _labels(y: object, what: str, label: str) -> np.ndarray:
    """``y`` as int64 labels, one per image: integers (or whole floats) from 0, N or N x 1."""
    if not isinstance(y, (np.ndarray, torch.Tensor, list, tuple)):
        fail(what, f"{label} is a {type(y).__name__}; expected integer labels (a numpy array, a "
                   "torch tensor or a list)")
    try:
        y = np.asarray(_numpy(y))  # type: ignore[arg-type]
    except ValueError as e:  # a ragged list
        fail(what, f"{label} is not an array of labels ({e})")
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim == 2:
        fail(what, f"{label} has shape {y.shape}: one-hot labels? pass class numbers ({label}.argmax(1))")
    if y.ndim != 1:
        fail(what, f"{label} has shape {y.shape}; expected one integer label per image")
    if y.dtype.kind == "f":
        if not np.isfinite(y).all() or (y != np.round(y)).any():
            fail(what, f"{label} ({y.dtype}) holds labels that are not whole numbers")
    elif y.dtype.kind not in "iu":
        fail(what, f"{label} has dtype {y.dtype}; expected integer labels")
    if len(y) and (y.min() < 0 or y.max() >= limits.MAX_CLASSES):
        i = int(np.flatnonzero((y < 0) | (y >= limits.MAX_CLASSES))[0])
        fail(what, f"{label}[{i}] is {y[i]:g}: a label is a class number from 0 to "
                   f"{limits.MAX_CLASSES - 1:,}")
    return y.astype(np.int64)


class _Pixels:
    """One argument's images as uint8, by one scale for all of them (the module's rules); called
    on the whole array, or on each chunk of a Dataset or batch of a DataLoader in turn."""

    def __init__(self, what: str, label: str):
        self.what, self.label = what, label
        self.scale: float | None = None  # 255 (0..1 floats) or 1, told by the first call
        self.seen = 0  # images converted so far: the index of an image an error names

    def __call__(self, x: np.ndarray) -> np.ndarray:
        kind = x.dtype.kind
        if x.dtype == np.uint8:
            out = np.ascontiguousarray(x)
        elif kind in "iuf":
            step = max(1, _VALUES_AT_A_TIME // max(1, math.prod(x.shape[1:])))
            lo, hi = self._range(x, step)
            out = np.empty(x.shape, np.uint8)
            for i in range(0, len(x), step):
                c = np.asarray(x[i:i + step], dtype=np.float32 if kind == "f" else None)
                out[i:i + step] = np.rint(c * self.scale) if kind == "f" else c
        else:
            fail(self.what, f"{self.label} has dtype {x.dtype}; expected uint8 pixels, integers "
                            "0..255, or floats (0..1 or 0..255)")
        self.seen += len(x)
        return out

    def _range(self, x: np.ndarray, step: int) -> tuple[float, float]:
        """The smallest and largest value of ``x`` once they are checked (and, for the first
        floats, the scale told), a chunk at a time."""
        lo, hi = math.inf, -math.inf
        for i in range(0, len(x), step):
            c = x[i:i + step]
            if c.dtype.kind == "f" and not np.isfinite(c).all():
                fail(self.what, f"{self.label} ({x.dtype}) holds NaN or infinite values, not pixels")
            lo, hi = min(lo, float(c.min())), max(hi, float(c.max()))
        dtype = f"{self.label} ({x.dtype}) holds values {lo:g}..{hi:g}"
        if lo < 0:
            fail(self.what, f"{dtype}: negative values are not pixels (normalized images? give them "
                            "before Normalize: mnistflow normalizes with the training images' mean "
                            "and std itself)")
        if hi > 255:
            fail(self.what, f"{dtype}, above 255: pixels are 0..255 (or 0..1 floats)")
        if x.dtype.kind == "f":
            if self.scale is None:
                self.scale = 255.0 if hi <= 1 else 1.0
            elif self.scale == 255.0 and hi > 1:
                i = int(np.flatnonzero((x > 1).reshape(len(x), -1).any(1))[0])
                fail(self.what, f"image {self.seen + i} holds a value of {float(x[i].max()):g}, but "
                                "the images before it are on the 0..1 scale (none above 1): give "
                                "every image on one scale")
        return lo, hi


def _collect(chunks: Iterator[tuple[np.ndarray, np.ndarray]], what: str, n: int | None,
             names: dict[int, str] | None) -> Part:
    """The chunks of a Dataset or the batches of a DataLoader (N x H x W x C views, labels)
    converted one at a time: the images of one size, and within the bounds as they come."""
    pixels = _Pixels(what, "images")
    xs, ys, count = [], [], 0
    for x, y in chunks:
        if xs and x.shape[1:] != xs[0].shape[1:]:
            fail(what, f"image {count} is {_size(x)} but image 0 is {_size(xs[0])}: every image "
                       "must be the same size")
        _check_images(x, n if not xs and n is not None else count + len(x), what, "images")
        xs.append(pixels(x))
        ys.append(y)
        count += len(x)
    if not xs:
        fail(what, "holds no images")
    return Part(xs[0] if len(xs) == 1 else np.concatenate(xs), np.concatenate(ys), names)


def _size(x: np.ndarray) -> str:
    h, w, c = x.shape[1:]
    return f"{h} x {w} x {c}"


def _length(ds: object, what: str) -> int | None:
    """A Dataset's length; None for an IterableDataset without one."""
    from torch.utils.data import IterableDataset

    try:
        return len(ds)  # type: ignore[arg-type]
    except TypeError:
        if isinstance(ds, IterableDataset):
            return None
        fail(what, f"a {type(ds).__name__} without len(): a map-style Dataset needs one")


def _dataset_chunks(ds: object, n: int | None, what: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """A Dataset's ``(image, label)`` items, ``CHUNK`` at a time, as (N x H x W x C, labels)."""
    from torch.utils.data import IterableDataset

    items = iter(ds) if isinstance(ds, IterableDataset) else (ds[i] for i in range(n))  # type: ignore
    start, first = 0, None
    while True:
        group = list(islice(items, CHUNK))
        if not group:
            return
        images, labels = zip(*(_item(it, start + i, what) for i, it in enumerate(group)))
        for i, im in enumerate(images):
            first = first or (im.shape, isinstance(group[0][0], torch.Tensor))
            if im.shape != first[0]:
                fail(what, f"image {start + i} has shape {im.shape} but image 0 has {first[0]}: "
                           "every image must be the same size")
        x, _ = _layout(np.stack(images), first[1])
        if x is None:
            fail(what, f"image 0 has shape {first[0]}; expected H x W, H x W x C or C x H x W "
                       "with C 1 or 3")
        yield x, _labels(np.asarray(labels), what, "labels")
        start += len(group)


def _item(item: object, i: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """One Dataset item as (the image as an array, the label as a 0-d array)."""
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        fail(what, f"item {i} is a {type(item).__name__}"
                   f"{f' of {len(item)} values' if isinstance(item, (tuple, list)) else ''}; a "
                   "Dataset must yield (image, label) pairs")
    image, label = item
    if isinstance(image, (np.ndarray, torch.Tensor)):
        image = _numpy(image)
    elif hasattr(image, "__array_interface__"):  # a PIL image
        image = np.asarray(image)
    else:
        fail(what, f"item {i}'s image is a {type(image).__name__}; expected a torch tensor, a numpy "
                   "array or a PIL image")
    label = np.asarray(_numpy(label) if isinstance(label, torch.Tensor) else label)
    if label.size != 1:
        fail(what, f"item {i}'s label has shape {label.shape}; expected one integer")
    return image, label.reshape(())


def _loader_batches(loader: object, what: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """A DataLoader's ``(images, labels)`` batches as (N x H x W x C, labels)."""
    for b, batch in enumerate(loader):  # type: ignore[attr-defined]
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            fail(what, f"batch {b} is a {type(batch).__name__}; a DataLoader must yield (images, "
                       "labels) batches")
        x, y = batch
        if not isinstance(x, (np.ndarray, torch.Tensor)):
            fail(what, f"batch {b}'s images are a {type(x).__name__}; expected a tensor")
        arr, _ = _layout(_numpy(x), isinstance(x, torch.Tensor))
        if arr is None:
            fail(what, f"batch {b}'s images have shape {tuple(x.shape)}; expected {LAYOUTS}")
        labels = _labels(y, what, f"batch {b}'s labels")
        if len(labels) != len(arr):
            fail(what, f"batch {b} has {len(arr)} images but {len(labels)} labels")
        yield arr, labels


def _say_shuffled(loader: object, what: str) -> None:
    """A shuffling DataLoader gives its images in another order each time: other records."""
    from torch.utils.data import RandomSampler

    if isinstance(getattr(loader, "sampler", None), RandomSampler):
        note(f"{what}: the DataLoader shuffles, so each call reads its images in another order and "
             "writes other records (a validation split carved from it differs too); give "
             "shuffle=False, or its dataset, for a run you can repeat")


def _class_names(data: object, what: str) -> dict[int, str] | None:
    """Class names by label value from a ``classes`` attribute (torchvision's datasets), found
    on ``data`` or the datasets it wraps (``.dataset``: a DataLoader's, a Subset's)."""
    for _ in range(8):
        classes = getattr(data, "classes", None)
        if isinstance(classes, (list, tuple)) and classes and all(isinstance(c, str) for c in classes):
            if len(classes) > limits.MAX_CLASSES:
                fail(what, f"classes names {len(classes):,} classes, more than {limits.MAX_CLASSES:,}")
            long = next((c for c in classes if len(c) > limits.MAX_CLASS_NAME), None)
            if long is not None:
                fail(what, f"a class name of {len(long):,} characters (at most {limits.MAX_CLASS_NAME:,})")
            return dict(enumerate(classes))
        data = getattr(data, "dataset", None)
        if data is None:
            return None
    return None


# --- writing ------------------------------------------------------------------------------

def write(train: Part, val: Part | None = None, test: Part | None = None, *, carve: bool = True,
          quiet: bool = False, what: tuple[str, str, str] = ("data", "val_data", "test_data")) -> Path:
    """The record set of these splits in the cache (written once; the same content again is the
    same directory): ``train`` trained on; ``val`` validated on, or when None and ``carve``, a
    validation split carved from ``train`` as ``prep`` carves it; ``test``, or none. The classes
    are ``train``'s label values; a val or test label that no training image has is an error."""
    tr_idx, _, values, class_names = from_original_labels(train.y, None, train.names,
                                                          where=f"{what[0]}: labels")
    have = np.bincount(tr_idx, minlength=len(values)) > 0
    splits = [(_index(p, train, values, have, w) if p is not None else None)
              for p, w in ((val, what[1]), (test, what[2]))]
    val_size = len(val.y) if val is not None else default_val_size(len(train.y)) if carve else 0
    raw = RawDataset(NAME, list(class_names), RawSplit(train.x, tr_idx), splits[1],
                     label_values=values, val=splits[0])
    key = _key(raw, val_size)
    out = home() / "records" / f"{NAME}-{key[:12]}"
    if up_to_date(out, key):
        return out
    check_room(out, raw, 0)
    sums = {name: _digest(s) for name, s in (("train", raw.train), ("val", raw.val), ("test", raw.test))
            if s is not None}
    write_records(raw, out, key=key, options={"source": "memory", "val_size": val_size, "seed": SEED},
                  source_checksums=sums, val_size=val_size, seed=SEED, force=True)
    if not quiet:
        note(f"{out}: wrote the data in memory: {len(train.y) - (0 if val is not None else val_size):,} train / "
             f"{val_size:,} val / {len(test.y) if test is not None else 0:,} test; {len(values)} "
             f"classes, labels {summarize_values(values)}")
    return out


def _index(part: Part, train: Part, values: tuple[int, ...], have: np.ndarray, what: str) -> RawSplit:
    """A val or test ``part`` as class indices into the training data's classes ``values``."""
    if part.x.shape[1:] != train.x.shape[1:]:
        fail(what, f"images are {_size(part.x)} but the training data's are {_size(train.x)}")
    if part.names and train.names:
        differ = next((v for v in part.names if v in train.names and part.names[v] != train.names[v]), None)
        if differ is not None:
            fail(what, f"class {differ} is named '{part.names[differ]}' here but "
                       f"'{train.names[differ]}' in the training data")
    lut = np.full(max(int(part.y.max(initial=0)), values[-1]) + 1, -1, np.int64)
    lut[np.asarray(values)] = np.arange(len(values))
    idx = lut[part.y]
    bad = np.flatnonzero((idx < 0) | ~have[np.maximum(idx, 0)])
    if len(bad):
        i = int(bad[0])
        fail(what, f"image {i} has label {int(part.y[i])}, which no training image has (the "
                   f"training data's labels: {summarize_values(values)})")
    return RawSplit(part.x, idx)


def _digest(split: RawSplit) -> str:
    """sha256 of a split's images (shape and bytes) and class indices."""
    h = hashlib.sha256(json.dumps(list(split.x.shape)).encode())
    h.update(np.ascontiguousarray(split.x).data)
    h.update(split.y.astype("<i8").tobytes())
    return h.hexdigest()


def _key(raw: RawDataset, val_size: int) -> str:
    """The records' cache key: the content of every split, the classes, how val is made."""
    parts = [FORMAT, raw.class_names, list(raw.values), val_size, SEED,
             [_digest(s) if s is not None else None for s in (raw.train, raw.val, raw.test)]]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()
