"""``mnistflow prep``: raw data -> a record set, once.

    mnistflow prep mnist --out data/mnist            # known dataset (local files or download)
    mnistflow prep --data ./my_digits --out data/mine # folder / IDX / CSV / npz / TFRecord

Where a known dataset's files are: ``known``; reading each format: ``formats``; the record
format: ``records`` / ``write_records``; "records or raw input" opened in one call: ``open``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError
from mnistflow.core.fsutil import regular_file, sha256_file
from mnistflow.core.paths import home
from mnistflow.core.progress import stages, write
from mnistflow.data import known
from mnistflow.data.formats import detect_format, read_known, read_source
from mnistflow.data.formats.raw import RawDataset, summarize_values
from mnistflow.data.records import read_meta
from mnistflow.data.write_records import check_replaceable, write_records



def prepare(dataset: str | None = None, data: str | Path | None = None,
            out: str | Path | None = None, *, val_size: int | None = None, seed: int = 0,
            variants: int = 0, resize: tuple[int, int] | None = None, force: bool = False,
            tfrecord_keys: tuple[str, str] = ("image", "label"), quiet: bool = False,
            max_pixels: int | None = None) -> Path:
    """Prepare records from a known dataset name and/or a raw path; return the records dir.

    Re-running with the same inputs and options is a no-op unless ``force``. An existing
    ``out`` is replaced only when it is a record set: of the same dataset, or of another with
    ``force``; a file or a folder of other files never is. ``max_pixels``
    caps each encoded picture before it is decoded (default ``core.limits.MAX_PIXELS``); it does
    not change what a successful prep writes, so it is not part of the cache key.
    ``val_size`` (images held out of train) defaults to 5000, or a tenth of a smaller set.
    """
    dataset, data = known.resolve_input(dataset, Path(data) if data is not None else None)
    if data is not None and dataset is None and detect_format(data) == "records":
        return data
    _check_options(val_size, seed, variants, resize, max_pixels)
    ds = known.require(dataset) if dataset is not None else None
    folder = known.locate(ds, data) if ds is not None else None
    name, files = (ds.name, known.files_in(ds, folder)) if ds is not None else _input_files(data)
    if not files:
        raise MnistflowError("is empty: no files to read", data)
    options = {"val_size": val_size, "seed": seed, "variants": variants,
               "resize": list(resize) if resize else None, "tfrecord_keys": list(tfrecord_keys)}
    with stages(["checksums", "read", "write"], "prep", enabled=not quiet) as stage:
        stage("checksums")
        sums = _checksums(files, data if data is not None and data.is_dir() else files[0].parent)
        key = hashlib.sha256(json.dumps([name, sums, options], sort_keys=True).encode()).hexdigest()
        out = Path(out) if out is not None else home() / "records" / f"{name}-{key[:12]}"
        if not force and up_to_date(out, key):
            if not quiet:
                write(f"{out}: up to date (same inputs and options; --force to rebuild)")
            return out
        replace = force or _is_our_cache(out)
        check_replaceable(out, name if ds is not None else None, replace)  # before reading
        stage("read")
        raw: RawDataset = (read_known(ds, folder) if ds is not None
                           else read_source(data, resize=resize, tfrecord_keys=tfrecord_keys,
                                            max_pixels=max_pixels))
        if val_size is None:
            val_size = default_val_size(len(raw.train.y))
        stage("write")
        check_room(out, raw, variants)
        write_records(raw, out, key=key, options=options, source_checksums=sums, val_size=val_size,
                      seed=seed, variants=variants, force=replace)
    if not quiet:
        print(f"{out}: wrote {raw.name}: {len(raw.train.y) - val_size:,} train / {val_size:,} val"
              f" / {len(raw.test.y) if raw.test is not None else 0:,} test"
              + (f" + {variants} augmented copies" if variants else "")
              + f"; {raw.num_classes} classes, labels {summarize_values(raw.values)}")
    return out


def input_name(data: Path) -> str:
    """The name a raw input is known by (its records' cache folder, a known dataset's policy)."""
    return data.resolve().name if data.is_dir() else data.name.split(".")[0]


def _input_files(data: Path) -> tuple[str, list[Path]]:
    """(name, the files whose content defines the raw input ``data``), without parsing them."""
    if data.is_dir():
        files = sorted(p for p in data.rglob("*") if p.is_file() and not p.name.startswith("."))
        if detect_format(data) == "idx":
            from mnistflow.data.formats.idx import find_idx_files

            files = sorted(find_idx_files(data).values())
        return input_name(data), files
    files = [data]
    if detect_format(data) == "csv":  # a sibling *test*.csv is part of the dataset
        from mnistflow.data.formats.csv import companion_files

        files += companion_files(data)
    return input_name(data), files


def _checksums(files: list[Path], base: Path) -> dict[str, str]:
    """{path relative to ``base`` (else the name): sha256} of the input files: the cache key."""
    sums = {}
    for f in files:
        regular_file(f)  # a FIFO would block the hash (and the reader) forever
        try:
            rel = str(f.relative_to(base))
        except ValueError:
            rel = f.name
        sums[rel] = sha256_file(f)
    return sums


def default_val_size(n: int) -> int:
    """The images held out of ``n`` training images for validation when no size is given:
    5000 for the MNIST family, a tenth of a smaller set."""
    return min(5000, n // 10)


def up_to_date(out: Path, key: str) -> bool:
    """Whether ``out`` holds readable records of the same inputs and options (``key``)."""
    if not (out.is_dir() and (out / "meta.json").is_file()):
        return False
    try:
        return read_meta(out).get("key") == key
    except MnistflowError:  # unreadable, or another record format: rebuilt
        return False


def _whole(name: str, value: object, low: int, high: int, why: str = "") -> None:
    """``value`` a whole number in [low, high] (not a bool, not 1.5), else the error line."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise MnistflowError(f"{name} must be an integer from {low} to {high}{why}, got {value!r}")


def _check_options(val_size: object, seed: object, variants: object, resize: object,
                   max_pixels: object) -> None:
    """prepare()'s options, checked as the CLI's flags are (the Python API gets the same lines)."""
    if val_size is not None:
        _whole("--val-size", val_size, 0, limits.MAX_INT)
    _whole("--seed", seed, 0, limits.MAX_SEED)
    _whole("--variants", variants, 0, limits.MAX_VARIANTS, " (each is a full augmented copy of the training images)")
    if resize is not None:
        if not isinstance(resize, (tuple, list)) or len(resize) != 2:
            raise MnistflowError(f"--resize must be (height, width), got {resize!r}")
        for side in resize:
            _whole("--resize", side, 1, limits.MAX_SIDE)
    if max_pixels is not None:
        _whole("max_pixels", max_pixels, 1, limits.MAX_INT)


def check_room(out: Path, raw: RawDataset, variants: int) -> None:
    """Refuse, before writing, records that would not fit in the free space where they go
    (each augmented variant a full copy of the training images): not a disk filled to the
    last byte by an error that comes hours later."""
    need = sum(part.x.nbytes + part.y.nbytes for part in (raw.train, raw.val, raw.test) if part is not None)
    need += variants * raw.train.x.nbytes
    where = next((p for p in (out, *out.parents) if p.exists()), Path.cwd())
    if not where.is_dir():
        raise MnistflowError("not a directory (the records go in a folder)", where)
    usage = shutil.disk_usage(where)
    if usage.total == 0 or not os.access(where, os.W_OK | os.X_OK):  # /proc, a read-only mount...
        why = ("is on a file system that holds no files (like /proc)" if usage.total == 0 else
               "cannot be written (a read-only file system, or no permission)")
        raise MnistflowError(f"the records cannot go here: {where} {why}"
                             + ("; set $MNISTFLOW_HOME to a writable folder" if _is_our_cache(out) else ""), out)
    free = usage.free
    if need > free:
        raise MnistflowError(f"the records need ~{need / 2**30:.2f} GiB ({variants} augmented copies of "
                             f"train); {free / 2**30:.2f} GiB are free there", out)


def _is_our_cache(out: Path) -> bool:
    try:
        out.resolve().relative_to((home() / "records").resolve())
        return True
    except ValueError:
        return False
