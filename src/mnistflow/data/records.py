"""The prepared record format (version 1), and reading it: one directory per dataset.

    DIR/meta.json            format_version, name, class names and label values, shape,
                             splits, mean/std, checksums (of every file and of meta.json
                             itself: meta_sha256), options
    DIR/{split}_x.npy        (N, H, W, C) uint8, opened by memory map (no copy)
    DIR/{split}_y.npy        (N,) int64 class indices 0..K-1
    DIR/train_x.aug{k}.npy   K augmented copies of the training images (same labels)

Labels: ``{split}_y.npy`` holds class indices 0..K-1 (what a model's outputs are) and
``meta.json``'s ``label_values`` the original label of each class (labels 1..26 are classes
0..25 with ``label_values`` 1..26), what users see.

Opening checks everything before anything is used: ``meta.json`` against its own checksum
and every field's type, every payload file against its checksum, and the files against what
``meta.json`` says (names, shapes, dtypes, counts, the label range); nothing is loaded before
its header is checked. A record set of another format version, or one whose files disagree,
is a one-line error that says to re-run ``mnistflow prep --force``. Writing: ``write_records``.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np

from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError, fail
from mnistflow.core.fsutil import open_regular, regular_file, sha256_file
from mnistflow.data.formats.raw import summarize_values

FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")
_REPREP = "re-run 'mnistflow prep --force'"
_RECORD_FILE = re.compile(r"^(?:meta\.json|(?:train|val|test)_[xy]\.npy|train_x\.aug\d+\.npy)$")


@dataclass
class Records:
    """An opened record set. Arrays are read-only memory maps."""

    path: Path
    meta: dict

    @property
    def name(self) -> str:
        return self.meta["name"]

    @property
    def class_names(self) -> list[str]:
        return list(self.meta["class_names"])

    @property
    def num_classes(self) -> int:
        return len(self.meta["class_names"])

    @property
    def label_values(self) -> tuple[int, ...]:
        """The original label value of each class (class index i -> ``label_values[i]``)."""
        return tuple(self.meta["label_values"])

    def class_counts(self, split: str) -> np.ndarray:
        """Images per class (by class index) in ``split``; zeros for a split it lacks."""
        if not self.has(split):
            return np.zeros(self.num_classes, np.int64)
        return np.bincount(self.split(split)[1], minlength=self.num_classes)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(H, W, C) of one image, as the arrays hold it."""
        return tuple(self.meta["shape"])  # type: ignore[return-value]

    @property
    def in_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image, as a model takes it (``ModelInfo.in_shape``)."""
        h, w, c = self.shape
        return c, h, w

    @property
    def mean(self) -> list[float]:
        return self.meta["mean"]

    @property
    def std(self) -> list[float]:
        return self.meta["std"]

    @property
    def variants(self) -> int:
        return int(self.meta["variants"])

    def has(self, split: str) -> bool:
        return self.size(split) > 0

    def size(self, split: str) -> int:
        """Images in ``split``; ``"train+val"`` counts both."""
        return sum(self.meta["splits"].get(s, 0) for s in split.split("+"))

    def split(self, split: str, variant: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(images, labels) of ``split``; ``variant`` k > 0 picks augmented copy k of train.

        ``"train+val"``: all labelled images, train's then val's, copied into memory once
        (the validation images are never augmented copies)."""
        if "+" in split:
            parts = [self.split(s, variant if s == "train" else 0) for s in split.split("+") if self.has(s)]
            if not parts:
                raise MnistflowError(f"has no '{split}' split", self.path)
            return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])
        if not self.has(split):
            raise MnistflowError(f"has no '{split}' split", self.path)
        xname = f"{split}_x.npy" if variant == 0 else f"{split}_x.aug{variant}.npy"
        x = np.load(self.path / xname, mmap_mode="r", allow_pickle=False)
        y = np.load(self.path / f"{split}_y.npy", allow_pickle=False)
        return x, y


def meta_checksum(meta: dict) -> str:
    """sha256 of ``meta`` without its own ``meta_sha256``, in a canonical JSON form."""
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_meta(path: Path) -> dict:
    """``meta.json`` of a record set, its checksum and every field's type checked."""
    path = Path(path)
    mp = path / "meta.json"
    if not mp.is_file():
        fail(path, "not a records directory (no meta.json); run 'mnistflow prep' first")
    try:
        with open_regular(mp) as f:
            text = f.read(limits.MAX_RECORDS_META_BYTES)
        meta = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        fail(mp, f"unreadable metadata ({e})")
    if not isinstance(meta, dict) or "format_version" not in meta:
        fail(mp, "not mnistflow record metadata")
    v = meta["format_version"]
    if type(v) is not int or v != FORMAT_VERSION:
        fail(path, f"holds record format {str(v)[:20]}; this mnistflow reads format "
                   f"{FORMAT_VERSION}: {_REPREP}")
    for k in ("name", "class_names", "label_values", "shape", "splits", "mean", "std",
              "variants", "files", "meta_sha256"):
        if k not in meta:
            fail(mp, f"metadata lacks '{k}'; {_REPREP}")
    if meta["meta_sha256"] != meta_checksum(meta):
        fail(mp, f"checksum does not match its content: the record set is corrupt or was "
                 f"edited; {_REPREP}")
    _check_meta(mp, meta)
    return meta


def _is_int(v, lo: int = 0) -> bool:
    return type(v) is int and v >= lo


def _check_meta(mp: Path, meta: dict) -> None:
    """Every field has the type and range the loaders rely on (a hand-edited or damaged
    meta.json is an error here, not an IndexError in training)."""
    def bad(what: str) -> NoReturn:
        fail(mp, f"{what}: the record set is inconsistent; {_REPREP}")

    names, shape, splits = meta["class_names"], meta["shape"], meta["splits"]
    if not isinstance(meta["name"], str):
        bad("'name' is not a string")
    if (not isinstance(names, list) or not 1 <= len(names) <= limits.MAX_CLASSES
            or not all(isinstance(n, str) for n in names)):
        bad(f"'class_names' should be 1..{limits.MAX_CLASSES:,} strings")
    if (not isinstance(shape, list) or len(shape) != 3 or not all(_is_int(n, 1) for n in shape)
            or math.prod(shape) > limits.MAX_RECORD_VALUES):
        bad(f"'shape' should be [H, W, C] of positive sizes, got {str(shape)[:60]}")
    if (not isinstance(splits, dict) or not set(splits) <= set(SPLITS)
            or not all(_is_int(n) for n in splits.values())):
        bad(f"'splits' should map {', '.join(SPLITS)} to image counts")
    c = shape[2]
    for k in ("mean", "std"):
        vals = meta[k]
        if (not isinstance(vals, list) or len(vals) != c
                or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in vals)):
            bad(f"'{k}' should be {c} finite numbers (one per channel)")
    if not all(x > 0 for x in meta["std"]):
        bad("'std' should be positive")
    if not _is_int(meta["variants"]):
        bad("'variants' should be a count")
    values = meta["label_values"]
    if (not isinstance(values, list) or len(values) != len(names) or not all(_is_int(v) for v in values)
            or any(a >= b for a, b in zip(values, values[1:]))):
        bad(f"'label_values' should be {len(names)} increasing label values (one per class name)")
    files = meta["files"]
    if not isinstance(files, dict) or not all(
            isinstance(n, str) and isinstance(d, str) for n, d in files.items()):
        bad("'files' should map file names to checksums")
    expected = payload_files(meta)
    for n in files:  # only the set's own files: never a path out of the directory
        if n not in expected:
            bad(f"'files' names '{n[:60]}', which is not a file of this record set")
    missing = [n for n in expected if n not in files]
    if missing:
        bad(f"'files' lacks {', '.join(missing)} (not covered by a checksum)")


def payload_files(meta: dict) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{file name: (dtype, shape)} of every payload file ``meta`` says the set holds."""
    shape = tuple(meta["shape"])
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for split in SPLITS:
        n = meta["splits"].get(split, 0)
        if n:
            out[f"{split}_x.npy"] = ("|u1", (n, *shape))
            out[f"{split}_y.npy"] = ("<i8", (n,))
    for k in range(1, int(meta["variants"]) + 1):
        out[f"train_x.aug{k}.npy"] = ("|u1", (meta["splits"].get("train", 0), *shape))
    return out


def _npy_header(p: Path) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """(dtype, shape, fortran order, data offset) of a .npy file, read without loading it."""
    fmt = np.lib.format
    try:
        with open_regular(p) as f:
            major, _ = fmt.read_magic(f)
            if major not in (1, 2, 3):
                raise ValueError(f"unknown .npy format version {major}")
            reader = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
            shape, fortran, dtype = reader(f, max_header_size=limits.MAX_NPY_HEADER_BYTES)
            return dtype, shape, fortran, f.tell()
    except MnistflowError:
        raise
    except Exception as e:  # header errors come in many kinds
        fail(p, f"not a readable .npy array ({type(e).__name__}: {e}); {_REPREP}")


def check_consistent(path: Path, meta: dict) -> None:
    """The payload files hold what ``meta`` says: dtype, shape and size from each header
    (nothing is loaded), then the labels' range. One line naming the file otherwise."""
    path = Path(path)
    for name, (dtype, shape) in payload_files(meta).items():
        p = path / name
        if not p.exists():
            fail(p, "missing from the record set")
        dt, sh, fortran, offset = _npy_header(p)
        if dt.str != dtype or dt.hasobject or fortran or tuple(sh) != shape:
            fail(p, f"holds {dt} {tuple(sh)}, but meta.json says {np.dtype(dtype)} {shape}: "
                    f"the record set is inconsistent; {_REPREP}")
        size = p.stat().st_size
        if size != offset + math.prod(shape) * dt.itemsize:
            fail(p, f"is {size:,} bytes, not the {offset + math.prod(shape) * dt.itemsize:,} its "
                    f"{shape} array takes: the record set is truncated or corrupt; {_REPREP}")
    k = len(meta["class_names"])
    for split in SPLITS:
        if meta["splits"].get(split, 0):
            p = path / f"{split}_y.npy"
            y = np.load(p, mmap_mode="r", allow_pickle=False)
            lo, hi = int(y.min()), int(y.max())
            if lo < 0 or hi >= k:
                bad = lo if lo < 0 else hi
                fail(p, f"label {bad} is outside 0..{k - 1} ({k} classes in meta.json): the "
                        f"record set is inconsistent; {_REPREP}")


def verify(path: Path, meta: dict | None = None) -> None:
    """Check every payload file against the checksum recorded in meta.json."""
    path = Path(path)
    meta = meta or read_meta(path)
    for name, digest in meta["files"].items():
        p = path / name
        if not p.exists():
            fail(p, "missing from the record set")
        regular_file(p)
        if sha256_file(p) != digest:
            fail(p, f"checksum does not match meta.json: the record set is corrupt; {_REPREP}")


def open_records(path: Path | str, verify_checksums: bool = True) -> Records:
    """Open a record set: meta.json checked, the files' checksums verified (unless told
    not to), then the files checked against meta.json (headers, sizes, label range)."""
    path = Path(path)
    meta = read_meta(path)
    if verify_checksums:
        verify(path, meta)
    check_consistent(path, meta)
    return Records(path, meta)


def is_record_set(path: Path, *, among_others: bool = False) -> bool:
    """A directory holding a ``meta.json`` and nothing but record files: what ``prep``
    wrote, even if damaged, and so what it may replace (never a folder of anything else).
    ``among_others``: with record data beside other files too (no place for a run's files)."""
    try:
        names = {p.name for p in Path(path).iterdir()}
    except OSError:
        return False
    records = {n for n in names if _RECORD_FILE.match(n)}
    return "meta.json" in names and (len(records) > 1 if among_others else records == names)


def describe(rec: Records) -> str:
    """What a record set holds, as a few aligned lines."""
    m = rec.meta
    h, w, c = rec.shape
    lines = [
        f"records   {rec.path}",
        f"dataset   {m['name']}  (format {m['format_version']})",
        f"images    {h}x{w}x{c} uint8",
        f"classes   {rec.num_classes}: labels {summarize_values(rec.label_values)}",
    ]
    for s in SPLITS:
        lines.append(f"{s:<9} {m['splits'].get(s, 0):,}")
    lines.append(f"variants  {m['variants']} augmented copies of train")
    lines.append("mean/std  " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(m["mean"], m["std"])))
    size = sum((rec.path / f).stat().st_size for f in m["files"])
    lines.append(f"size      {size / 2**20:.1f} MiB in {len(m['files'])} files")
    return "\n".join(lines) + "\n\n" + class_table(rec)


def class_table(rec: Records) -> str:
    """One row per class: its label value, name and images in each split, and the totals."""
    counts = {s: rec.class_counts(s) for s in SPLITS}
    rows = [(str(v), n, *(f"{int(counts[s][i]):,}" for s in SPLITS))
            for i, (v, n) in enumerate(zip(rec.label_values, rec.class_names))]
    rows.append(("", "total", *(f"{int(counts[s].sum()):,}" for s in SPLITS)))
    head = ("label", "name", *SPLITS)
    wv = max(len(head[0]), *(len(r[0]) for r in rows))
    wn = min(max(len(head[1]), *(len(r[1]) for r in rows)), 24)
    wc = [max(len(head[2 + j]), *(len(r[2 + j]) for r in rows)) for j in range(len(SPLITS))]

    def line(r) -> str:
        return (f"{r[0]:>{wv}}  {r[1][:wn]:<{wn}}" + "".join(f"  {c:>{w}}" for c, w in zip(r[2:], wc))).rstrip()

    return "\n".join([line(head)] + [line(r) for r in rows])
