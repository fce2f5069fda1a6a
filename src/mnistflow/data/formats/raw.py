"""What every reader returns: ``RawDataset`` (uint8 NHWC arrays + labels + class names), the
label check and the pixel rule they share, and the limits every reader applies before it allocates.

Pixels (the one rule, :func:`as_pixels`, for every reader whose file can hold numbers other than
uint8: npz, TFRecord int/float lists, IDX of another type, for ``prep`` and ``predict`` alike):
integers 0..255, whatever the dtype (``12.0`` is 12). NaN or infinity, a fraction (0..1 floats
are not read as a near-black picture: the message says to multiply by 255) or a value outside
0..255 is one error line, never a clipped or wrapped pixel.

Labels (the one place they are turned into classes: :func:`from_original_labels`): a reader
hands over the label values as its files hold them (1..26, 0..9, 3 and 7, ...), and, when it
knows them, the class names. The classes are the values the names define plus the values
training uses, nothing else (no empty class 0 for labels 1..26); ``RawSplit.y`` then holds
contiguous class indices 0..K-1 and ``RawDataset.label_values[i]`` the original value of
class i, the id users see in ``predict``, ``eval``, the report and the server.

Limits (what only a malicious or broken file would exceed; each is checked *before* the
memory is taken; the bounds themselves live in ``core.limits``):

* ``MAX_CLASSES``: a label value is below 100,000, and so are the classes of one dataset.
* ``MAX_DATASET_BYTES``: the decoded images of one dataset take at most 16 GiB.
* inputs are regular files (``core.fsutil.open_regular``): a FIFO, socket or device is refused,
  never read.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mnistflow.core import limits
from mnistflow.core.errors import fail


@dataclass
class RawSplit:
    x: np.ndarray  # (N, H, W, C) uint8
    y: np.ndarray  # (N,) int64 in [0, num_classes): class indices


@dataclass
class RawDataset:
    name: str
    class_names: list[str]
    train: RawSplit
    test: RawSplit | None = None
    source_files: list[Path] = field(default_factory=list)
    # the original label value of each class (index i -> label_values[i]); None: 0..K-1
    label_values: tuple[int, ...] | None = None
    # a validation split given as such (in-memory data's val_data); None: carved from train
    val: RawSplit | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def values(self) -> tuple[int, ...]:
        """The original label value of each class, in class-index order."""
        return tuple(self.label_values) if self.label_values is not None else tuple(range(self.num_classes))


Names = Mapping[int, str] | Sequence[str] | None


def _label_array(y, where: Path | str | None) -> np.ndarray:
    """``y`` as int64 label values, each in 0..MAX_CLASSES-1 (else an error naming the record)."""
    y = np.asarray(y)
    if y.ndim != 1:
        fail(where, f"labels have shape {y.shape}; expected one label per image")
    if not (np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_):
        fail(where, f"labels have dtype {y.dtype}; expected integers")
    if len(y):
        if int(y.min()) < 0:
            i = int(np.flatnonzero(y < 0)[0])
            fail(where, f"record {i}: label {int(y[i])} is negative")
        if int(y.max()) >= limits.MAX_CLASSES:
            i = int(np.flatnonzero(y >= limits.MAX_CLASSES)[0])
            fail(where, f"record {i}: label {int(y[i])} is not a class index (at most {limits.MAX_CLASSES - 1:,})")
    return y.astype(np.int64, copy=False)


def _named(names: Names) -> dict[int, str]:
    """{value: name} from a mapping, or a sequence (values 0..len-1)."""
    if names is None:
        return {}
    if isinstance(names, (str, bytes)):
        raise TypeError("class names must be a mapping or a sequence of names, not one string")
    items = names.items() if isinstance(names, Mapping) else enumerate(names)
    out = {}
    for v, n in items:
        v = int(v)
        if not 0 <= v < limits.MAX_CLASSES:
            raise ValueError(f"class value {v} is outside 0..{limits.MAX_CLASSES - 1}")
        out[v] = str(n)
    return out


def summarize_values(values: Sequence[int], limit: int = 6) -> str:
    """``1..26`` for a run of values, else the first few: ``0, 1, 2, 200``."""
    vals = [int(v) for v in values]
    if not vals:
        return "none"
    if len(vals) > 2 and vals[-1] - vals[0] + 1 == len(vals) and vals == sorted(vals):
        return f"{vals[0]}..{vals[-1]}"
    return ", ".join(map(str, vals[:limit])) + (", ..." if len(vals) > limit else "")


def from_original_labels(train_y: np.ndarray, test_y: np.ndarray | None, names: Names, *,
                         where: Path | str | None = None, test_where: Path | str | None = None,
                         ) -> tuple[np.ndarray, np.ndarray | None, tuple[int, ...], tuple[str, ...]]:
    """The classes of a dataset from its original label values: (train indices, test indices,
    label_values, class_names).

    ``label_values`` is the sorted union of the values ``names`` defines (a mapping value ->
    name, or a sequence: values 0..len-1) and the values ``train_y`` uses; the indices are
    contiguous 0..K-1 into it; a value without a name is named ``str(value)``. A test label
    outside those classes is an error naming it (``test_where``, else ``where``, is the file);
    a negative label or one of ``MAX_CLASSES`` or more is an error naming its record. A
    training label that ``names`` does not define is kept as a class of its own, with a
    warning, as are label values that are not consecutive (a stray label is the usual cause).
    """
    train_y = _label_array(train_y, where)
    twhere = test_where if test_where is not None else where
    test_y = None if test_y is None else _label_array(test_y, twhere)
    named = _named(names)
    counts = np.bincount(train_y) if len(train_y) else np.zeros(0, np.int64)
    used = np.flatnonzero(counts)
    values = np.union1d(used, np.fromiter(named, np.int64, len(named))).astype(np.int64)
    if not len(values):
        fail(where, "no labels and no class names: the dataset has no classes")
    lut = np.full(int(values[-1]) + 1, -1, np.int64)
    lut[values] = np.arange(len(values))
    train_idx = lut[train_y]
    test_idx = None
    if test_y is not None:
        inside = test_y < len(lut)
        test_idx = np.full(len(test_y), -1, np.int64)
        test_idx[inside] = lut[test_y[inside]]
        if (test_idx < 0).any():
            i = int(np.flatnonzero(test_idx < 0)[0])
            v = int(test_y[i])
            fail(twhere, f"record {i}: test label {v} is not a class of this dataset: no training "
                         f"image has it{' and no class name defines it' if named else ''} "
                         f"(classes: {summarize_values(values)})")
    from mnistflow.core.log import warn

    stray = [int(v) for v in used if int(v) not in named]
    if named and stray:
        warn(f"{where or 'labels'}: training label(s) {summarize_values(stray)} are not among the "
             f"{len(named)} named classes ({summarize_values(sorted(named))}); each is kept as a "
             "class of its own: is a label wrong?")
    elif not named and len(values) > 1 and int(values[-1] - values[0]) + 1 != len(values):
        warn(f"{where or 'labels'}: the labels take {len(values)} values that are not consecutive "
             f"({summarize_values(values)}); the model gets one class per value: is a label wrong?")
    class_names = tuple(named.get(int(v), str(int(v))) for v in values)
    return train_idx, test_idx, tuple(int(v) for v in values), class_names


def dataset_from_labels(name: str, train: RawSplit, test: RawSplit | None,
                        source_files: list[Path], names: Names = None, *,
                        where: Path | str | None = None,
                        test_where: Path | str | None = None) -> RawDataset:
    """A ``RawDataset`` from splits whose ``y`` hold original label values (what a reader
    read), its classes made by :func:`from_original_labels`."""
    tr, te, values, class_names = from_original_labels(
        train.y, test.y if test is not None else None, names, where=where, test_where=test_where)
    return RawDataset(name, list(class_names), RawSplit(train.x, tr),
                      RawSplit(test.x, te) if test is not None else None, source_files,
                      label_values=values)


def check_labels(y: np.ndarray, num_classes: int, path: Path | str) -> None:
    """A label outside [0, num_classes) is an error naming the file and the record index."""
    bad = np.flatnonzero((y < 0) | (y >= num_classes))
    if len(bad):
        i = int(bad[0])
        fail(path, f"record {i}: label {int(y[i])} is outside 0..{num_classes - 1}")


def check_dataset_bytes(path: Path | str, nbytes: int, limit: int | None = None) -> None:
    """Refuse a dataset whose decoded images would take more than ``limit`` bytes."""
    limit = limits.MAX_DATASET_BYTES if limit is None else limit
    if nbytes > limit:
        fail(path, f"the images would take {nbytes:,} bytes decoded, more than the "
                   f"{limit:,}-byte limit for one dataset")


_PIXEL_CHUNK = 1 << 22  # values checked at a time: the checks' temporaries stay a few MB


def as_pixels(x: np.ndarray, where: Path | str | None, what: str) -> np.ndarray:
    """``x`` as uint8 pixels by the rule above (uint8 as it is, without a copy); anything else
    is a ``MnistflowError`` naming ``where`` and ``what`` (e.g. "x_train"), without the raw
    numpy warnings that NaN would bring. Checked a chunk at a time."""
    x = np.asarray(x)
    if x.dtype == np.uint8:
        return x
    kind = x.dtype.kind
    if kind not in "biuf":
        fail(where, f"{what} has dtype {x.dtype}; expected uint8 pixels")
    dtype = x.dtype.name
    flat = x.reshape(-1)
    lo, hi, fraction = math.inf, -math.inf, False
    for i in range(0, flat.size, _PIXEL_CHUNK):  # one pass; NaN stops it, a fraction is told after
        c = flat[i:i + _PIXEL_CHUNK]
        if kind == "f":
            if not np.isfinite(c).all():
                fail(where, f"{what} ({dtype}) holds NaN or infinite values, not pixels 0..255")
            fraction = fraction or bool((c != np.round(c)).any())
        lo, hi = min(lo, c.min()), max(hi, c.max())
    if fraction:
        hint = " (0..1 floats? multiply by 255)" if lo >= 0 and hi <= 1 else ""
        fail(where, f"{what} ({dtype}) holds non-integer values, not pixels 0..255{hint}")
    if flat.size and (lo < 0 or hi > 255):
        fail(where, f"{what} ({dtype}) holds values {lo:g}..{hi:g}, outside 0..255")
    return x.astype(np.uint8)
