"""Writing a record set (the format: ``records``): once, atomically.

The directory is built under a temporary name next to DIR (``.DIR.tmp-HOST-PID-*``:
``fsutil.temp_name``) and renamed into place, so a crash never leaves a half-written record
set behind; what a killed writer left in that folder (its owner is gone, or it is over a day
old) is removed by the next one (``fsutil.sweep_stale``).
While it writes, SIGTERM unwinds like Ctrl-C so that the temporary directory goes too. A
write that fails (disk full, read-only) is one line naming DIR, with nothing left behind.
Only a record set is ever replaced: a file or a folder of other files at DIR is refused,
``--force`` or not, and another dataset's record set needs ``--force``.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Iterator

import numpy as np

from mnistflow.core.errors import MnistflowError, fail, os_error
from mnistflow.core.fsutil import fsync_dir, make_dirs, remove_empty, sha256_file, sweep_stale, temp_name
from mnistflow.data.formats.raw import RawDataset, check_labels
from mnistflow.data.records import FORMAT_VERSION, is_record_set, meta_checksum, read_meta

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
    """Write ``raw`` as a record set at ``out`` atomically; returns ``out``. Its validation
    split: ``raw.val`` when given (``val_size`` is then its size), else ``val_size`` training
    images picked by ``seed``."""
    out = Path(out)
    if raw.val is None:
        tr_idx, va_idx = split_train_val(len(raw.train.y), val_size, seed, raw.train.y)
    else:  # its own validation split: every training image stays in train
        tr_idx, va_idx = np.arange(len(raw.train.y)), None
    check_replaceable(out, raw.name, force)
    created = make_dirs(out.parent)
    with _sigterm_as_exit():
        tmp = None
        try:
            sweep_stale(out.parent, out.name)  # what killed writers left here, of any name
            # Named before it exists: a SIGTERM landing just after the mkdir still finds it bound
            # for the cleanup below (mkdtemp's return value would be lost, the folder left).
            tmp = temp_name(out)
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


def _write(raw: RawDataset, out: Path, tmp: Path, tr_idx: np.ndarray, va_idx: np.ndarray | None, *,
           key: str, options: dict, source_checksums: dict[str, str], val_size: int, seed: int,
           variants: int, force: bool) -> None:
    """Write the record set into ``tmp``, then move it to ``out``."""
    checksums: dict[str, str] = {}
    xtr, ytr = raw.train.x[tr_idx], raw.train.y[tr_idx]
    val = (raw.val.x, raw.val.y) if va_idx is None else (raw.train.x[va_idx], raw.train.y[va_idx])
    parts = {"train": (xtr, ytr), "val": val}
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
        old = temp_name(out, "old")
        os.rename(out, old)
        os.rename(tmp, out)
        if old.is_symlink():
            old.unlink()
        else:
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)
    fsync_dir(out.parent)  # make the rename itself durable
