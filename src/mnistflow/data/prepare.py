"""``mnistflow prep``: raw data -> a record set, once; and ``open_data``, the one place that
turns "a records directory or any raw input" into opened records.

    mnistflow prep mnist --out data/mnist            # known dataset (local files or download)
    mnistflow prep --data ./my_digits --out data/mine # folder / IDX / CSV / npz / TFRecord

    rec = open_data("data/mnist")            # a records directory: opened (checksums verified)
    rec = open_data("./my_digits.csv")       # raw input: prepared into the cache once, then opened
    rec = open_data("fashion-mnist")         # a known dataset's name
    rec = open_data(None, fallback=info.records)  # a model's own training records
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from mnistflow.data import datasets
from mnistflow.data.records import FORMAT_VERSION, Records, open_records, read_meta
from mnistflow.data.write_records import check_replaceable, write_records
from mnistflow.data.formats.raw import RawDataset, summarize_values
from mnistflow.data.sources import detect_format, known_files, locate_known, read_known, read_source
from mnistflow.core.paths import home
from mnistflow.core.progress import stages, write
from mnistflow.core.fsutil import regular_file, sha256_file
from mnistflow.core.errors import MnistflowError

MAX_VARIANTS = 100  # augmented copies of train (prep --variants); each is a full copy
MAX_SEED = 2**32 - 1  # of the train/val split (as train's --seed)
MAX_SIDE = 4096  # pixels of --resize (as the CLI's MAX_SIDE)


def _source_files(dataset: str | None, data: Path | None) -> tuple[str, list[Path]]:
    """(name, the files whose content defines the dataset), without parsing them."""
    if dataset is not None:
        ds = datasets.lookup(dataset)
        if ds is None:
            known = ", ".join(sorted(datasets.KNOWN))
            raise MnistflowError(f"unknown dataset '{dataset}' (known: {known}; or pass --data PATH)")
        folder = locate_known(ds, data)
        return ds.name, known_files(ds, folder)
    assert data is not None
    if data.is_dir():
        files = sorted(p for p in data.rglob("*") if p.is_file() and not p.name.startswith("."))
        if detect_format(data) == "idx":
            from mnistflow.data.sources import find_idx_files

            files = sorted(find_idx_files(data).values())
        return _input_name(data), files
    files = [data]
    if detect_format(data) == "csv":  # a sibling *test*.csv is part of the dataset
        from mnistflow.data.formats.csv import companion_files

        files += companion_files(data)
    return _input_name(data), files


def _input_name(data: Path) -> str:
    """The name a raw input is known by (its records' cache folder, a known dataset's policy)."""
    return data.resolve().name if data.is_dir() else data.name.split(".")[0]


def known_name(dataset: str | None, data: str | Path | None) -> str | None:
    """The known dataset that ``--dataset`` / ``--data`` name (a records directory by its meta,
    raw input by its name), told before any image is read; None when it is not a known dataset
    or cannot be told yet (the run reports a bad input itself)."""
    try:
        dataset, path = _resolve_input(dataset, Path(data) if data is not None else None)
        name = dataset
        if name is None and path is not None and path.exists():
            name = read_meta(path)["name"] if detect_format(path) == "records" else _input_name(path)
    except (MnistflowError, OSError, KeyError, TypeError):
        return None
    return name if name and datasets.lookup(name) is not None else None


def policy_of(dataset: str | None, data: str | Path | None) -> str | None:
    """The augmentation policy of the known dataset that ``--dataset`` / ``--data`` name."""
    name = known_name(dataset, data)
    return datasets.lookup(name).augment if name else None


def _resolve_input(dataset: str | None, data: Path | None) -> tuple[str | None, Path | None]:
    """A bare known name given as --data (and no such path), or no input at all
    ($MNISTFLOW_DATA, else MNIST), means a known dataset."""
    if dataset is None and data is None:
        env = os.environ.get("MNISTFLOW_DATA")
        if env:
            return None, Path(env)
        return "mnist", None
    if (dataset is None and data is not None and not data.exists() and len(data.parts) == 1
            and datasets.lookup(str(data)) is not None):
        return str(data), None
    return dataset, data


def prepare(dataset: str | None = None, data: str | Path | None = None,
            out: str | Path | None = None, *, val_size: int | None = None, seed: int = 0,
            variants: int = 0, resize: tuple[int, int] | None = None, force: bool = False,
            tfrecord_keys: tuple[str, str] = ("image", "label"), quiet: bool = False,
            max_pixels: int | None = None) -> Path:
    """Prepare records from a known dataset name and/or a raw path; return the records dir.

    Re-running with the same inputs and options is a no-op unless ``force``. An existing
    ``out`` is replaced only when it is a record set: of the same dataset, or of another with
    ``force``; a file or a folder of other files never is. ``max_pixels``
    caps each encoded picture before it is decoded (default ``picture.MAX_PIXELS``); it does
    not change what a successful prep writes, so it is not part of the cache key.
    ``val_size`` (images held out of train) defaults to 5000, or a tenth of a smaller set.
    """
    data = Path(data) if data is not None else None
    dataset, data = _resolve_input(dataset, data)
    if data is not None and dataset is None and detect_format(data) == "records":
        return data
    _check_options(val_size, seed, variants, resize, max_pixels)
    name, files = _source_files(dataset, data)
    if not files:
        raise MnistflowError("is empty: no files to read", data)
    options = {"val_size": val_size, "seed": seed, "variants": variants,
               "resize": list(resize) if resize else None, "tfrecord_keys": list(tfrecord_keys)}
    base = data if data is not None and data.is_dir() else (files[0].parent)
    with stages(["checksums", "read", "write"], "prep", enabled=not quiet) as stage:
        stage("checksums")
        sums = {}
        for f in files:
            regular_file(f)  # a FIFO would block the hash (and the reader) forever
            try:
                rel = str(f.relative_to(base))
            except ValueError:
                rel = f.name
            sums[rel] = sha256_file(f)
        key = hashlib.sha256(json.dumps([name, sums, options], sort_keys=True).encode()).hexdigest()
        out = Path(out) if out is not None else home() / "records" / f"{name}-{key[:12]}"
        if out.is_dir() and (out / "meta.json").is_file() and not force:
            try:  # an older record format is rebuilt (e.g. format 1 gave labels 1..26 27 classes)
                had = read_meta(out)
                if had.get("key") == key and had["format_version"] == FORMAT_VERSION:
                    if not quiet:
                        write(f"{out}: up to date (same inputs and options; --force to rebuild)")
                    return out
            except MnistflowError:
                pass
        replace = force or _is_our_cache(out)
        check_replaceable(out, name if dataset is not None else None, replace)  # before reading
        stage("read")
        raw: RawDataset = (read_known(dataset, data) if dataset is not None
                           else read_source(data, resize=resize, tfrecord_keys=tfrecord_keys,
                                            max_pixels=max_pixels))
        if val_size is None:  # 5000 for the MNIST family; a tenth of a small set
            val_size = min(5000, len(raw.train.y) // 10)
        stage("write")
        _check_room(out, raw, variants)
        write_records(raw, out, key=key, options=options, source_checksums=sums, val_size=val_size,
                      seed=seed, variants=variants, force=replace)
    if not quiet:
        print(f"{out}: wrote {raw.name}: {len(raw.train.y) - val_size:,} train / {val_size:,} val"
              f" / {len(raw.test.y) if raw.test is not None else 0:,} test"
              + (f" + {variants} augmented copies" if variants else "")
              + f"; {raw.num_classes} classes, labels {summarize_values(raw.values)}")
    return out


def _whole(name: str, value: object, low: int, high: int, why: str = "") -> None:
    """``value`` a whole number in [low, high] (not a bool, not 1.5), else the error line."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise MnistflowError(f"{name} must be an integer from {low} to {high}{why}, got {value!r}")


def _check_options(val_size: object, seed: object, variants: object, resize: object,
                   max_pixels: object) -> None:
    """prepare()'s options, checked as the CLI's flags are (the Python API gets the same lines)."""
    if val_size is not None:
        _whole("--val-size", val_size, 0, 2**63 - 1)
    _whole("--seed", seed, 0, MAX_SEED)
    _whole("--variants", variants, 0, MAX_VARIANTS, " (each is a full augmented copy of the training images)")
    if resize is not None:
        if not isinstance(resize, (tuple, list)) or len(resize) != 2:
            raise MnistflowError(f"--resize must be (height, width), got {resize!r}")
        for side in resize:
            _whole("--resize", side, 1, MAX_SIDE)
    if max_pixels is not None:
        _whole("max_pixels", max_pixels, 1, 2**63 - 1)


def _check_room(out: Path, raw: RawDataset, variants: int) -> None:
    """Refuse, before writing, records that would not fit in the free space where they go
    (each augmented variant a full copy of the training images): not a disk filled to the
    last byte by an error that comes hours later."""
    need = sum(part.x.nbytes + part.y.nbytes for part in (raw.train, raw.test) if part is not None)
    need += variants * raw.train.x.nbytes
    where = next((p for p in (out, *out.parents) if p.exists()), Path.cwd())
    free = shutil.disk_usage(where).free
    if need > free:
        raise MnistflowError(f"the records need ~{need / 2**30:.2f} GiB ({variants} augmented copies of "
                             f"train); {free / 2**30:.2f} GiB are free there", out)


_NONE = object()  # open_data's "no fallback given" (None is a model that recorded no records)


def open_data(data: str | Path | Records | None = None, *, dataset: str | None = None,
              fallback: str | Path | None = _NONE, verify: bool = True,  # type: ignore[assignment]
              quiet: bool = True, **options) -> Records:
    """Records from anything a user may pass as ``--data``: a records directory (opened as it
    is; an opened ``Records`` comes back unchanged), raw input (an IDX folder, an image
    folder, CSV, npz, TFRecord, CIFAR-10: prepared into the cache once, see :func:`prepare`)
    or a known dataset's name; ``dataset`` names a known dataset whose files ``data`` holds.

    With neither ``data`` nor ``dataset``: ``$MNISTFLOW_DATA``, else MNIST; or, when a
    ``fallback`` is given (the records a model was trained on, ``ModelInfo.records``), that
    records directory, and an error asking for ``--data`` when it is unknown or gone.
    ``options`` go to :func:`prepare` (``val_size``, ``seed``, ``variants``, ``resize``,
    ``tfrecord_keys``, ``force``, ``max_pixels``); ``verify=False`` skips the records' checksums.
    """
    if isinstance(data, Records):
        return data
    if data is None and dataset is None and fallback is not _NONE:
        if not fallback or not Path(fallback).is_dir():
            raise MnistflowError("the model's training records are gone; pass --data RECORDS_OR_RAW",
                                 fallback or None)
        return open_records(fallback, verify_checksums=verify)
    return open_records(prepare(dataset, data, quiet=quiet, **options), verify_checksums=verify)


def _is_our_cache(out: Path) -> bool:
    try:
        out.resolve().relative_to((home() / "records").resolve())
        return True
    except ValueError:
        return False
