"""The prepared record format: one directory per dataset, written once, atomically.

    DIR/meta.json            name, class names, shape, splits, mean/std, checksums, options
    DIR/{split}_x.npy        (N, H, W, C) uint8, opened by memory map (no copy)
    DIR/{split}_y.npy        (N,) int64
    DIR/train_x.aug{k}.npy   K augmented copies of the training images (same labels)

The directory is built under a temporary name next to DIR (``.DIR.tmp-HOST-PID-*``) and
renamed into place, so a crash never leaves a half-written record set behind; what a killed
``prep`` left there (its owner is gone, or it is over a day old) is removed by the next one.
A write that fails (disk full, read-only) is one line naming DIR, with nothing left behind.
Only a record set is ever replaced: a file or a folder of other files at DIR is refused,
``--force`` or not, and another dataset's record set needs ``--force``.

Opening checks everything before anything is used: ``meta.json`` against its own checksum
(``meta_sha256``; record sets written before it existed are still read), every payload file
against its checksum, and the files against what ``meta.json`` says (names, shapes, dtypes,
counts, the label range): a record set whose files disagree is a one-line error.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from mnistflow.core.errors import MnistflowError, fail, os_error
from mnistflow.core.fsutil import dir_mode, make_dirs, remove_empty, sha256_file
from mnistflow.data.formats.raw import MAX_CLASSES, RawDataset, check_regular, open_regular

FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")
STALE_AFTER_S = 24 * 3600  # a temporary record set this old is left over whoever made it
_REPREP = "re-run 'mnistflow prep --force'"


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
    def shape(self) -> tuple[int, int, int]:
        """(H, W, C) of one image."""
        return tuple(self.meta["shape"])  # type: ignore[return-value]

    @property
    def mean(self) -> list[float]:
        return self.meta["mean"]

    @property
    def std(self) -> list[float]:
        return self.meta["std"]

    @property
    def variants(self) -> int:
        return int(self.meta.get("variants", 0))

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


def _save_npy(folder: Path, name: str, arr: np.ndarray, checksums: dict[str, str]) -> None:
    """``np.save``'s bytes, written by Python so that a full disk is ENOSPC (numpy's own
    writer reports only "N requested and M written")."""
    p = folder / name
    arr = np.ascontiguousarray(arr)
    fmt = np.lib.format
    with open(p, "wb") as f:
        try:
            fmt.write_array_header_1_0(f, fmt.header_data_from_array_1_0(arr))
        except ValueError:  # a header too long for format 1.0, as np.save would do
            fmt.write_array_header_2_0(f, fmt.header_data_from_array_1_0(arr))
        f.write(arr.reshape(-1).view(np.uint8).data)
        f.flush()
        os.fsync(f.fileno())
    checksums[name] = sha256_file(p)


def _channel_stats(x: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of uint8 images in 0..255 units (float64 accumulation)."""
    c = x.shape[-1]
    flat = x.reshape(-1, c)
    # Chunked to bound memory on large sets.
    s = np.zeros(c)
    s2 = np.zeros(c)
    for i in range(0, len(flat), 1 << 22):
        part = flat[i:i + (1 << 22)].astype(np.float64)
        s += part.sum(0)
        s2 += (part * part).sum(0)
    n = max(len(flat), 1)
    mean = s / n
    std = np.sqrt(np.maximum(s2 / n - mean**2, 1e-12))
    return mean.tolist(), std.tolist()


def split_train_val(n: int, val_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic (train_idx, val_idx), both sorted, from a seeded permutation."""
    if val_size < 0 or val_size >= n:
        raise MnistflowError(f"--val-size {val_size} must be in 0..{n - 1} for {n} training images")
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[val_size:]), np.sort(perm[:val_size])


def write_records(raw: RawDataset, out: Path, *, key: str, options: dict,
                  source_checksums: dict[str, str], val_size: int = 5000, seed: int = 0,
                  variants: int = 0, force: bool = False) -> Path:
    """Write ``raw`` as a record set at ``out`` atomically; returns ``out``."""
    out = Path(out)
    tr_idx, va_idx = split_train_val(len(raw.train.y), val_size, seed)
    check_replaceable(out, raw.name, force)
    created = make_dirs(out.parent)
    with _sigterm_as_exit():
        tmp = None
        try:
            sweep_stale(out)
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{_owner()}-", dir=out.parent))
            os.chmod(tmp, dir_mode())  # mkdtemp's 0700 -> what mkdir would give
            _write(raw, out, tmp, tr_idx, va_idx, key=key, options=options,
                   source_checksums=source_checksums, val_size=val_size, seed=seed,
                   variants=variants, force=force)
        except BaseException as e:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            remove_empty(created)
            if isinstance(e, OSError):
                raise os_error(e, out) from e
            raise
    return out


_RECORD_FILE = re.compile(r"^(?:meta\.json|(?:train|val|test)_[xy]\.npy|train_x\.aug\d+\.npy)$")


def is_record_set(path: Path) -> bool:
    """A directory holding a ``meta.json`` and nothing but record files: what ``prep``
    wrote, even if damaged, and so what it may replace (never a folder of anything else)."""
    try:
        names = [p.name for p in Path(path).iterdir()]
    except OSError:
        return False
    return "meta.json" in names and all(_RECORD_FILE.match(n) for n in names)


def check_replaceable(out: Path, name: str | None, force: bool) -> None:
    """Refuse to write records at ``out`` where that would lose something: a file or a folder
    of other files (never replaced, even with ``force``), or, unless ``force``, the record
    set of another dataset than ``name`` (None: not known yet) or one whose metadata is
    unreadable. Nothing there, an empty folder, or this dataset's records are fine."""
    out = Path(out)
    if not os.path.lexists(out):
        return
    if not out.is_dir():
        fail(out, "exists and is not a directory; pick another --out for the records")
    try:
        empty = not any(out.iterdir())
    except OSError as e:
        raise os_error(e, out) from e
    if empty:
        return
    if not is_record_set(out):
        fail(out, "exists and is not a record set (it holds other files); prep replaces only "
                  "a record set: pick another --out or empty it yourself")
    if force or name is None:
        return
    try:
        had = read_meta(out)["name"]
    except MnistflowError as e:
        fail(out, f"holds a record set that cannot be read ({e.detail}); --force to replace it")
    if had != name:
        fail(out, f"holds the records of another dataset ('{had}', not '{name}'); "
                  f"--force to replace them, or pick another --out")


def _write(raw: RawDataset, out: Path, tmp: Path, tr_idx: np.ndarray, va_idx: np.ndarray, *,
           key: str, options: dict, source_checksums: dict[str, str], val_size: int, seed: int,
           variants: int, force: bool) -> None:
    """Write the record set into ``tmp``, then move it to ``out``."""
    checksums: dict[str, str] = {}
    xtr, ytr = raw.train.x[tr_idx], raw.train.y[tr_idx]
    parts = {"train": (xtr, ytr), "val": (raw.train.x[va_idx], raw.train.y[va_idx])}
    if raw.test is not None:
        parts["test"] = (raw.test.x, raw.test.y)
    counts = {}
    for split, (x, y) in parts.items():
        counts[split] = int(len(y))
        if len(y):
            _save_npy(tmp, f"{split}_x.npy", x, checksums)
            _save_npy(tmp, f"{split}_y.npy", y.astype(np.int64), checksums)
    if variants:
        from mnistflow.data.augment import make_variant

        for k in range(1, variants + 1):
            _save_npy(tmp, f"train_x.aug{k}.npy", make_variant(xtr, seed * 1000 + k), checksums)
    mean, std = _channel_stats(xtr)
    meta = {
        "format_version": FORMAT_VERSION,
        "name": raw.name,
        "class_names": list(raw.class_names),
        "shape": list(raw.train.x.shape[1:]),
        "splits": counts,
        "mean": mean,
        "std": std,
        "variants": variants,
        "val_size": val_size,
        "seed": seed,
        "options": options,
        "key": key,
        "sources": source_checksums,
        "files": checksums,
    }
    meta["meta_sha256"] = meta_checksum(meta)
    with open(tmp / "meta.json", "w") as f:
        json.dump(meta, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _replace_dir(tmp, out, force)


def meta_checksum(meta: dict) -> str:
    """sha256 of ``meta`` without its own ``meta_sha256``, in a canonical JSON form."""
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _owner() -> str:
    """HOST-PID of this process, as it appears in its temporary names."""
    host = re.sub(r"[^A-Za-z0-9.]", "", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}"


_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?:(?P<host>[A-Za-z0-9.]+)-(?P<pid>\d+)(?:-[^-]*)?|[^-]*)$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def sweep_stale(out: Path, max_age_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove what killed writers of ``out`` left next to it: ``.OUT.tmp-*`` (half-written
    record sets) and ``.OUT.old-*`` (a replaced set, put back when OUT itself is missing),
    when their owner process on this host is gone, or they are older than ``max_age_s``
    (another host's, or an older mnistflow's unnamed ones after a day). Returns what went."""
    out = Path(out)
    here = _owner().rsplit("-", 1)[0]
    gone = []
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return gone
    for p in entries:
        m = _LEFTOVER.match(p.name)
        if not m or m["name"] != out.name or p.is_symlink() or not p.is_dir():
            continue
        if m["pid"] is not None and m["host"] == here:
            stale = int(m["pid"]) != os.getpid() and not _alive(int(m["pid"]))
        else:
            try:
                stale = time.time() - p.stat().st_mtime > max_age_s
            except OSError:
                continue
        if not stale:
            continue
        if m["kind"] == "old" and not out.exists() and (p / "meta.json").is_file():
            os.replace(p, out)  # killed between the two renames: the old set is the live one
        else:
            shutil.rmtree(p, ignore_errors=True)
        gone.append(p)
    return gone


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """While records are written, SIGTERM (``kill``, a closing terminal, a job scheduler)
    unwinds like Ctrl-C so the temporary directory is removed; only where nobody else has
    claimed SIGTERM, and only in the main thread (where Python runs signal handlers)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def _exit(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _replace_dir(tmp: Path, out: Path, force: bool) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` is swapped away only after success."""
    if os.path.lexists(out):
        check_replaceable(out, None, force)  # again: something may have appeared meanwhile
        old = out.with_name(f".{out.name}.old-{_owner()}")
        os.rename(out, old)
        os.rename(tmp, out)
        if old.is_symlink():
            old.unlink()
        else:
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)
    fd = os.open(out.parent, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        check_regular(p)
        if sha256_file(p) != digest:
            fail(p, "checksum does not match meta.json: the record set is corrupt; "
                    "re-run 'mnistflow prep --force'")


def open_records(path: Path | str, verify_checksums: bool = True) -> Records:
    """Open a record set: meta.json checked, the files' checksums verified (unless told
    not to), then the files checked against meta.json (headers, sizes, label range)."""
    path = Path(path)
    meta = read_meta(path)
    if verify_checksums:
        verify(path, meta)
    check_consistent(path, meta)
    return Records(path, meta)


def describe(rec: Records) -> str:
    """What a record set holds, as a few aligned lines."""
    m = rec.meta
    h, w, c = rec.shape
    lines = [
        f"records   {rec.path}",
        f"dataset   {m['name']}  (format {m['format_version']})",
        f"images    {h}x{w}x{c} uint8",
        f"classes   {rec.num_classes}: {', '.join(rec.class_names)}",
    ]
    for s in SPLITS:
        lines.append(f"{s:<9} {m['splits'].get(s, 0):,}")
    lines.append(f"variants  {m.get('variants', 0)} augmented copies of train")
    lines.append("mean/std  " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(m["mean"], m["std"])))
    size = sum((rec.path / f).stat().st_size for f in m["files"])
    lines.append(f"size      {size / 2**20:.1f} MiB in {len(m['files'])} files")
    return "\n".join(lines)
