"""mnistflow: train MNIST-family image classifiers fast, and see why they are fast or slow.

The public API mirrors the CLI verbs (each verb calls one of these)::

    import mnistflow
    rec = mnistflow.prepare("mnist", out="data/mnist")
    result = mnistflow.train(recipe="seed-cnn", data=rec)
    result = mnistflow.train(MyNet, data=rec, callbacks=[mnistflow.EarlyStopping(patience=2)])

Names are resolved lazily so that ``import mnistflow`` stays cheap, and importing it changes
nothing in the process (no environment variable, no thread setting).
"""
from __future__ import annotations

__version__ = "0.1.0"

_API = {
    "prepare": ("mnistflow.data.prepare", "prepare"),
    "open_records": ("mnistflow.data.records", "open_records"),
    "MnistflowError": ("mnistflow.core.errors", "MnistflowError"),
    "train": ("mnistflow.training.api", "train"),
    "EarlyStopping": ("mnistflow.training.callbacks", "EarlyStopping"),
    "CSVLogger": ("mnistflow.training.callbacks", "CSVLogger"),
    "MLflowLogger": ("mnistflow.training.observe.mlflow_tracker", "MLflowLogger"),
    "StopTraining": ("mnistflow.training.hooks", "StopTraining"),
    "diagnose": ("mnistflow.doctor", "diagnose"),
    "fit": ("mnistflow.training.loop", "fit"),
    "TrainConfig": ("mnistflow.training.config", "TrainConfig"),
    "evaluate": ("mnistflow.inference", "evaluate"),
    "predict": ("mnistflow.inference", "predict"),
    "predict_batches": ("mnistflow.inference", "predict_batches"),
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

__all__ = sorted(_API) + ["__version__", "tune_openmp"]


def tune_openmp() -> str | None:
    """Choose OpenMP's wait policy as the ``mnistflow`` command does: threads sleep at once
    (``OMP_WAIT_POLICY=PASSIVE``) when other processes are running, spin a while when the machine
    is idle. Call it before importing torch (libgomp reads the policy once); it does nothing when
    torch is loaded or the policy is set already. Returns "spin", "passive" or None (not chosen)."""
    from mnistflow.core import openmp

    return openmp.choose_at_start()


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str):
    if name in _API:
        import importlib

        mod, attr = _API[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'mnistflow' has no attribute '{name}'")
