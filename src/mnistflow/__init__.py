"""mnistflow: train MNIST-family image classifiers fast, and see why they are fast or slow.

The public API mirrors the CLI verbs (each verb calls one of these)::

    import mnistflow
    rec = mnistflow.prepare("mnist", out="data/mnist")
    result = mnistflow.train(recipe="seed-cnn", data=rec)
    result = mnistflow.train(MyNet, data=rec, callbacks=[mnistflow.EarlyStopping(patience=2)])

Names are resolved lazily so that ``import mnistflow`` stays cheap.

OpenMP threads wait passively (``OMP_WAIT_POLICY=PASSIVE``, set here unless ``OMP_WAIT_POLICY``
or ``GOMP_SPINCOUNT`` is already in the environment) when mnistflow is imported before torch, as
the ``mnistflow`` command does; torch imported first keeps libgomp's default.
"""
from __future__ import annotations

import os as _os
import sys as _sys

# libgomp, torch's OpenMP runtime, reads its wait policy once, when torch is imported, so this
# comes before anything imports torch. Its default spins idle threads for ~300k rounds at every
# barrier: next to one busy process a 2-thread `fast` run took 2.5x its idle time, passive 1.35x,
# at about no idle cost (benchmarks/busy_neighbour.py). True when mnistflow chose the policy.
_omp_passive_by_mnistflow = ("torch" not in _sys.modules and "GOMP_SPINCOUNT" not in _os.environ
                             and not _os.environ.get("OMP_WAIT_POLICY", "").strip())
if _omp_passive_by_mnistflow:
    _os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

__version__ = "0.1.0"

_API = {
    "prepare": ("mnistflow.data.prepare", "prepare"),
    "open_records": ("mnistflow.data.records", "open_records"),
    "MnistflowError": ("mnistflow.core.errors", "MnistflowError"),
    "train": ("mnistflow.training.api", "train"),
    "EarlyStopping": ("mnistflow.training.callbacks", "EarlyStopping"),
    "CSVLogger": ("mnistflow.training.callbacks", "CSVLogger"),
    "StopTraining": ("mnistflow.training.hooks", "StopTraining"),
    "diagnose": ("mnistflow.doctor", "diagnose"),
    "fit": ("mnistflow.training.loop", "fit"),
    "TrainConfig": ("mnistflow.training.config", "TrainConfig"),
    "evaluate": ("mnistflow.inference", "evaluate"),
    "predict": ("mnistflow.inference", "predict"),
    "load_model": ("mnistflow.artifacts.model_file", "load_model"),
    "load_any": ("mnistflow.artifacts.load", "load_any"),
    "export": ("mnistflow.exporting", "export"),
    "load_npz_into": ("mnistflow.artifacts.npz", "load_npz_into"),
    "summarize": ("mnistflow.summary", "summarize"),
    "create_model": ("mnistflow.models", "create_model"),
    "list_models": ("mnistflow.models", "list_models"),
    "register_model": ("mnistflow.models", "register_model"),
    "serve": ("mnistflow.server", "serve"),
    "report": ("mnistflow.reporting", "report"),
}

__all__ = sorted(_API) + ["__version__"]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str):
    if name in _API:
        import importlib

        mod, attr = _API[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'mnistflow' has no attribute '{name}'")
