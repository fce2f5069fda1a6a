"""Data layer: source files -> prep -> records -> loader.

    from mnistflow.data import open_data, make_loader
    rec = open_data("data/mnist")        # records, or any raw input prepared into the cache once
    loader = make_loader(rec, "train", batch_size=512, augment=True)

``open_data`` (in data.prepare) is the one resolver of "a records directory or raw input";
``data.normalize.normalize`` the one input normalization; ``make_loader`` (in data.loader)
the one loader (resident or streamed, one batch transform). Imported on first use (the
submodules ``prepare`` and ``normalize`` keep their names: no function shadows them here).
"""
from __future__ import annotations

_LAZY = {
    "open_data": "mnistflow.data.prepare",
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
