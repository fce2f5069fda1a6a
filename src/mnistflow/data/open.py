"""What a user's ``--data`` / ``--dataset`` name: opened records (:func:`open_data`, the one
resolver of "a records directory or any raw input"), or the known dataset they are, told
before any image is read (:func:`known_name`, :func:`policy_of`).

    rec = open_data("data/mnist")            # a records directory: opened (checksums verified)
    rec = open_data("./my_digits.csv")       # raw input: prepared into the cache once, then opened
    rec = open_data("fashion-mnist")         # a known dataset's name
    rec = open_data(None, fallback=info.records)  # a model's own training records
"""
from __future__ import annotations

from pathlib import Path

from mnistflow.core.errors import MnistflowError
from mnistflow.data import known
from mnistflow.data.formats import detect_format
from mnistflow.data.prepare import input_name, prepare
from mnistflow.data.records import Records, open_records, read_meta

_NONE = object()  # open_data's "no fallback given" (None is a model that recorded no records)


def open_data(data: str | Path | Records | None = None, *, dataset: str | None = None,
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
    """
    if isinstance(data, Records):
        return data
    if data is None and dataset is None and fallback is not _NONE:
        if not fallback or not Path(fallback).is_dir():
            raise MnistflowError("the model's training records are gone; pass --data RECORDS_OR_RAW",
                                 fallback or None)
        return open_records(fallback, verify_checksums=verify)
    return open_records(prepare(dataset, data, quiet=quiet, **options), verify_checksums=verify)


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
