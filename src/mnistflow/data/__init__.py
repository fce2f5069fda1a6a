"""Data layer: source files -> prep -> records -> loader.

    from mnistflow.data import open_data, make_loader
    rec = open_data("data/mnist")        # records, or any raw input prepared into the cache once
    loader = make_loader(rec, "train", batch_size=512, augment="auto")

Where the data comes from: ``known`` (the known datasets: table, locate, verify, download),
``formats`` (every raw input format, told apart and read), ``prepare`` (raw -> records),
``records`` / ``write_records`` (the record format, read / written), ``open`` (``open_data``,
the one resolver of "a records directory or raw input"). Then ``loader`` (the one loader,
resident or streamed, one batch transform), ``augment`` and ``normalize`` (the one input
normalization); ``picture`` turns a user's drawing into model input. The names below are
imported on first use (no function here shadows a submodule's name).
"""
from __future__ import annotations

_LAZY = {
    "open_data": "mnistflow.data.open",
    "open_records": "mnistflow.data.records",
    "Records": "mnistflow.data.records",
    "make_loader": "mnistflow.data.loader",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mnistflow.data' has no attribute {name!r}")
