"""Checking a record set before anything is used: ``meta.json`` against its own checksum
and every field's type, the payload files against their checksums, and the files against
what ``meta.json`` declares (names, shapes, dtypes, counts, the label range). Nothing is
loaded before its header is checked. ``records`` opens and writes record sets; this module
only reads and judges them.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from mnistflow.core.errors import MnistflowError, fail
from mnistflow.core.fsutil import sha256_file
from mnistflow.core.fsutil import open_regular, regular_file
from mnistflow.data.formats.raw import MAX_CLASSES

FORMAT_VERSION = 2  # 2: label_values (format 1 is read as label_values 0..K-1)
SPLITS = ("train", "val", "test")
_REPREP = "re-run 'mnistflow prep --force'"


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
            text = f.read(1 << 24)  # names and checksums: kilobytes, not megabytes
        meta = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        fail(mp, f"unreadable metadata ({e})")
    if not isinstance(meta, dict) or "format_version" not in meta:
        fail(mp, "not mnistflow record metadata")
    v = meta["format_version"]
    if not isinstance(v, int) or v > FORMAT_VERSION:
        fail(path, f"written by a newer mnistflow (record format {v}; this version reads up to "
                   f"{FORMAT_VERSION}): upgrade mnistflow or {_REPREP}")
    for k in ("name", "class_names", "shape", "splits", "mean", "std", "files"):
        if k not in meta:
            fail(mp, f"metadata lacks '{k}'")
    if "meta_sha256" in meta and meta["meta_sha256"] != meta_checksum(meta):
        fail(mp, f"checksum does not match its content: the record set is corrupt or was "
                 f"edited; {_REPREP}")
    _check_meta(mp, meta)
    return meta


def _is_int(v, lo: int = 0) -> bool:
    return type(v) is int and v >= lo


def _check_meta(mp: Path, meta: dict) -> None:
    """Every field has the type and range the loaders rely on (a hand-edited or damaged
    meta.json is an error here, not an IndexError in training)."""
    def bad(what: str) -> "NoReturn":  # noqa: F821
        fail(mp, f"{what}: the record set is inconsistent; {_REPREP}")

    names, shape, splits = meta["class_names"], meta["shape"], meta["splits"]
    if not isinstance(meta["name"], str):
        bad("'name' is not a string")
    if (not isinstance(names, list) or not 1 <= len(names) <= MAX_CLASSES
            or not all(isinstance(n, str) for n in names)):
        bad(f"'class_names' should be 1..{MAX_CLASSES:,} strings")
    if (not isinstance(shape, list) or len(shape) != 3 or not all(_is_int(n, 1) for n in shape)
            or math.prod(shape) > 1 << 28):
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
    if not _is_int(meta.get("variants", 0)):
        bad("'variants' should be a count")
    values = meta.get("label_values")
    if values is None and meta["format_version"] >= 2:
        bad("'label_values' is missing")
    if values is not None and (not isinstance(values, list) or len(values) != len(names)
                               or not all(_is_int(v) for v in values)
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
    for k in range(1, int(meta.get("variants", 0)) + 1):
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
            shape, fortran, dtype = reader(f, max_header_size=1 << 16)
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
            fail(p, "checksum does not match meta.json: the record set is corrupt; "
                    "re-run 'mnistflow prep --force'")
