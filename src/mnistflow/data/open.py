"""What a user's ``--data`` / ``--dataset`` name: opened records (:func:`open_data`, the one
resolver of "a records directory, any raw input, or data in memory"), the one ``data`` setting
that ``mnistflow.train``'s data arguments make (:func:`training_data`), or the known dataset
they are, told before any image is read (:func:`known_name`, :func:`policy_of`).

    rec = open_data("data/mnist")            # a records directory: opened (checksums verified)
    rec = open_data("./my_digits.csv")       # raw input: prepared into the cache once, then opened
    rec = open_data("fashion-mnist")         # a known dataset's name
    rec = open_data((x, y))                  # data in memory, to evaluate: records in the cache
    rec = open_data(None, fallback=info.records)  # a model's own training records
"""
from __future__ import annotations

import os
from pathlib import Path

from mnistflow.core.errors import MnistflowError
from mnistflow.data import known
from mnistflow.data.formats import detect_format
from mnistflow.data.prepare import input_name, prepare
from mnistflow.data.records import Records, open_records, read_meta

_NONE = object()  # open_data's "no fallback given" (None is a model that recorded no records)


def in_memory(data: object) -> bool:
    """Whether ``data`` is data in memory (arrays, a Dataset, a DataLoader, ...: ``memory``),
    not a path, a known dataset's name or opened records."""
    return data is not None and not isinstance(data, (str, os.PathLike, Records))


def open_data(data: str | Path | Records | object | None = None, *, dataset: str | None = None,
              fallback: str | Path | None = _NONE, verify: bool = True,  # type: ignore[assignment]
              quiet: bool = True, **options) -> Records:
    """Records from anything a user may pass as ``--data``: a records directory (opened as it
    is; an opened ``Records`` comes back unchanged), raw input (an IDX folder, an image
    folder, CSV, npz, TFRecord, CIFAR-10: prepared into the cache once, see
    :func:`~mnistflow.data.prepare.prepare`) or a known dataset's name; ``dataset`` names a
    known dataset whose files ``data`` holds.

    With neither ``data`` nor ``dataset``: ``$MNISTFLOW_DATA``, else MNIST; or, when a
    ``fallback`` is given (the records a model was trained on, ``ModelInfo.records``), that
    records directory, and an error asking for ``--data`` when it is unknown or gone.
    ``options`` go to ``prepare`` (``val_size``, ``seed``, ``variants``, ``resize``,
    ``tfrecord_keys``, ``force``, ``max_pixels``); ``verify=False`` skips the records' checksums.

    Data in memory (an ``(x, y)`` pair, a torch Dataset or DataLoader: ``memory``) is data to
    evaluate: its record set holds it as the test split, and as the train split too (a record
    set has one), with no validation split.
    """
    if isinstance(data, Records):
        return data
    if in_memory(data):
        from mnistflow.data import memory

        part = memory.read(data, "data", quiet=quiet)
        return open_records(memory.write(part, None, part, carve=False, quiet=quiet),
                            verify_checksums=verify)
    if data is None and dataset is None and fallback is not _NONE:
        if not fallback or not Path(fallback).is_dir():
            raise MnistflowError("the model's training records are gone; pass --data RECORDS_OR_RAW",
                                 fallback or None)
        return open_records(fallback, verify_checksums=verify)
    return open_records(prepare(dataset, data, quiet=quiet, **options), verify_checksums=verify)


def training_data(data: object = None, val_data: object = None, test_data: object = None, *,
                  dataset: str | None = None, quiet: bool = False) -> tuple[str | None, str | None]:
    """``mnistflow.train``'s data arguments as its ``data`` and ``dataset`` settings.

    ``data`` alone and not in memory: as it is (``Records``: their directory). Otherwise the
    record set the three make in the cache (``memory.write``; ``dataset`` then goes): ``data``
    trained on; ``val_data`` validated on, else a split carved from ``data`` in memory as
    ``prep`` carves it, or a path's own val split; ``test_data`` tested on, else a path's own
    test split, or none. A path as ``val_data`` or ``test_data`` stands for its test split (what
    ``evaluate(data=path)`` reads). ``quiet``: no notes."""
    if val_data is None and test_data is None and not in_memory(data):
        return (None if data is None else str(getattr(data, "path", data))), dataset
    if data is None:
        raise MnistflowError("val_data and test_data need the training data as data= too")
    if in_memory(data) and dataset is not None:
        raise MnistflowError(f"dataset={dataset!r} names the files of a known dataset; data in "
                             "memory needs none: leave dataset out")
    from mnistflow.data import memory

    rec = None if in_memory(data) else open_data(data, dataset=dataset)
    train = memory.read(data, "data", quiet=quiet) if rec is None else memory.records_part(rec, "train")

    def part(given: object, split: str, what: str) -> memory.Part | None:
        if given is None:  # a path's own split, where it has one
            return memory.records_part(rec, split) if rec is not None and rec.has(split) else None
        if in_memory(given):
            return memory.read(given, what, quiet=quiet)
        other = open_data(given)
        if not other.has("test"):
            raise MnistflowError(f"{what}: has no test split, which a path given as {what} "
                                 "stands for", other.path)
        return memory.records_part(other, "test")

    out = memory.write(train, part(val_data, "val", "val_data"), part(test_data, "test", "test_data"),
                       carve=rec is None, quiet=quiet)
    return str(out), None


def known_name(dataset: str | None, data: str | Path | None) -> str | None:
    """The known dataset that ``--dataset`` / ``--data`` name (a records directory by its meta,
    raw input by its name), told before any image is read; None when it is not a known dataset
    or cannot be told yet (the run reports a bad input itself)."""
    try:
        dataset, path = known.resolve_input(dataset, Path(data) if data is not None else None)
        name = dataset
        if name is None and path is not None and path.exists():
            name = read_meta(path)["name"] if detect_format(path) == "records" else input_name(path)
    except (MnistflowError, OSError, KeyError, TypeError):
        return None
    return name if name and known.lookup(name) is not None else None


def policy_of(dataset: str | None, data: str | Path | None) -> str | None:
    """The augmentation policy of the known dataset that ``--dataset`` / ``--data`` name."""
    name = known_name(dataset, data)
    return known.lookup(name).augment if name else None
