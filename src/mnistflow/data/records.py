"""The prepared record format: one directory per dataset, written once, atomically.

    DIR/meta.json            name, class names and label values, shape, splits, mean/std,
                             checksums, options
    DIR/{split}_x.npy        (N, H, W, C) uint8, opened by memory map (no copy)
    DIR/{split}_y.npy        (N,) int64 class indices 0..K-1
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

Labels: ``{split}_y.npy`` holds class indices 0..K-1 (what a model's outputs are) and
``meta.json``'s ``label_values`` the original label of each class (labels 1..26 are classes
0..25 with ``label_values`` 1..26), what users see. Format 1 (before ``label_values``) is still
read: its classes are their own values 0..K-1.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from mnistflow.core.errors import MnistflowError, fail, os_error
from mnistflow.core.fsutil import make_dirs, remove_empty, sha256_file
from mnistflow.data.record_check import (  # noqa: F401 -- the checks, re-exported
    _REPREP,
    FORMAT_VERSION,
    SPLITS,
    check_consistent,
    meta_checksum,
    payload_files,
    read_meta,
    verify,
)
from mnistflow.data.formats.raw import (
    RawDataset,
    check_labels,
    summarize_values,
)

STALE_AFTER_S = 24 * 3600  # a temporary record set this old is left over whoever made it


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
        """The original label value of each class (class index i -> ``label_values[i]``);
        0..K-1 for a record set written before label values were recorded."""
        values = self.meta.get("label_values")
        return tuple(values) if values is not None else tuple(range(self.num_classes))

    def class_counts(self, split: str) -> np.ndarray:
        """Images per class (by class index) in ``split``; zeros for a split it lacks."""
        if not self.has(split):
            return np.zeros(self.num_classes, np.int64)
        return np.bincount(self.split(split)[1], minlength=self.num_classes)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(H, W, C) of one image."""
        return tuple(self.meta["shape"])  # type: ignore[return-value]

    @property
    def in_shape(self) -> tuple[int, int, int]:
        """(C, H, W): one image as a model takes it."""
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


def split_train_val(n: int, val_size: int, seed: int,
                    y: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic (train_idx, val_idx), both sorted, from a seeded permutation.

    With the labels ``y`` (class indices), every class keeps at least one training image
    where it can: an image the permutation put in val is swapped with a training image of a
    class that has more than one (a rare class would otherwise be one the model could never
    learn). Where no class needs it (any sizeable dataset), the split is the permutation's."""
    if val_size < 0 or val_size >= n:
        raise MnistflowError(f"--val-size {val_size} must be in 0..{n - 1} for {n} training images")
    perm = np.random.default_rng(seed).permutation(n)
    val, train = perm[:val_size], perm[val_size:]
    if y is not None and val_size:
        y = np.asarray(y)
        k = int(y.max()) + 1
        have = np.bincount(y[train], minlength=k)
        for c in np.flatnonzero((np.bincount(y, minlength=k) > 0) & (have == 0)):
            donors = np.flatnonzero(have[y[train]] > 1)
            if not len(donors):
                break  # too few training images for every class: check_classes says which
            j = int(np.flatnonzero(y[val] == c)[0])
            i = int(donors[-1])
            have[y[train[i]]] -= 1
            have[c] += 1
            val[j], train[i] = train[i], val[j]
    return np.sort(train), np.sort(val)


def write_records(raw: RawDataset, out: Path, *, key: str, options: dict,
                  source_checksums: dict[str, str], val_size: int = 5000, seed: int = 0,
                  variants: int = 0, force: bool = False) -> Path:
    """Write ``raw`` as a record set at ``out`` atomically; returns ``out``."""
    out = Path(out)
    tr_idx, va_idx = split_train_val(len(raw.train.y), val_size, seed, raw.train.y)
    check_replaceable(out, raw.name, force)
    created = make_dirs(out.parent)
    with _sigterm_as_exit():
        tmp = None
        try:
            sweep_stale(out)
            # Named before it exists: a SIGTERM landing just after the mkdir still finds it bound
            # for the cleanup below (mkdtemp's return value would be lost, the folder left).
            tmp = out.parent / f".{out.name}.tmp-{_owner()}-{secrets.token_hex(4)}"
            os.mkdir(tmp)  # the mode mkdir gives: 0777 less the umask
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
    values = check_classes(raw, {s: y for s, (_, y) in parts.items()}, val_size)
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
        "label_values": list(values),
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
    _replace_dir(tmp, out, force, raw.name)


def check_classes(raw: RawDataset, labels: dict[str, np.ndarray], val_size: int) -> tuple[int, ...]:
    """The label values of ``raw``'s classes, once its splits' class indices (``labels``:
    split -> y) are checked: each in 0..K-1, one value per class, and no class in val or test
    that the training split never has (an error naming it). A class no split has an image of
    (one that only the class names define) is a warning."""
    k = raw.num_classes
    values = raw.values
    if len(values) != k or len(set(values)) != k:
        raise ValueError(f"{raw.name}: {len(values)} label values for {k} class names (or repeated values)")
    counts = {}
    for split, y in labels.items():
        check_labels(y, k, f"{raw.name} ({split})")
        counts[split] = np.bincount(y, minlength=k) if len(y) else np.zeros(k, np.int64)

    def cls(i: int) -> str:
        v, n = values[i], raw.class_names[i]
        return f"{v}" if n == str(v) else f"{v} ('{n}')"

    train = counts["train"]
    for split in ("val", "test"):
        lost = np.flatnonzero((counts.get(split, train) > 0) & (train == 0))
        if len(lost):
            i = int(lost[0])
            why = (f"--val-size {val_size} leaves {int(sum(train))} training images for "
                   f"{int(np.count_nonzero(sum(counts.values())))} classes: pass a smaller --val-size"
                   if split == "val" else "the model could never learn it")
            raise MnistflowError(f"class {cls(i)} has {split} images but no training image; {why}")
    empty = np.flatnonzero(sum(counts.values()) == 0)
    if len(empty):
        from mnistflow.core.log import warn

        warn(f"{raw.name}: {len(empty)} class(es) named but without any image: "
             + ", ".join(cls(int(i)) for i in empty[:5]) + (", ..." if len(empty) > 5 else ""))
    return values


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


def _replace_dir(tmp: Path, out: Path, force: bool, name: str) -> None:
    """Rename ``tmp`` (records of dataset ``name``) to ``out``; an existing ``out`` is swapped
    away only after success."""
    if os.path.lexists(out):
        check_replaceable(out, name, force)  # again: another prep may have written it meanwhile
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
        f"classes   {rec.num_classes}: labels {summarize_values(rec.label_values)}",
    ]
    for s in SPLITS:
        lines.append(f"{s:<9} {m['splits'].get(s, 0):,}")
    lines.append(f"variants  {m.get('variants', 0)} augmented copies of train")
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
