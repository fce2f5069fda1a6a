"""A user's own model: the class or factory a run builds it from, and how the run records it.

A model given to ``mnistflow.train`` as a class or factory (or named ``package.module:name`` by
``--model``) is built with ``model_kwargs`` plus ``in_shape`` / ``num_classes`` from the data
when its signature takes them, its parameters initialized from ``--seed``. The run records the
import path and the keyword arguments (config.toml's ``model`` and ``model_kwargs``, and the
model file), so ``mnistflow train --config RUN/config.toml`` and the later verbs rebuild it
wherever its module is importable.
"""
from __future__ import annotations

import inspect
import json
from typing import Any, Callable

import torch
import torch.nn as nn

from mnistflow.core.errors import MnistflowError
from mnistflow.training.config import TrainConfig, tomlable

# The arguments mnistflow's own factories take (models.registry); filled in from the data.
DATA_ARGS = ("in_shape", "num_classes")


def import_path(obj: Any) -> str:
    """``pkg.module:qualname`` of a class or function (as ``importlib`` would find it)."""
    return f"{getattr(obj, '__module__', None) or '?'}:{getattr(obj, '__qualname__', None) or type(obj).__name__}"


def own_config(model: nn.Module) -> dict:
    """The constructor arguments an instance records: ``init_kwargs`` or ``get_config()``."""
    kwargs = getattr(model, "init_kwargs", None)
    if kwargs is None and callable(getattr(model, "get_config", None)):
        kwargs = model.get_config()
    if kwargs is not None and not isinstance(kwargs, dict):
        raise MnistflowError(f"{type(model).__name__}'s init_kwargs / get_config() must be a dict of "
                             f"constructor arguments; got {type(kwargs).__name__}")
    return dict(kwargs or {})


def build_user_model(model: nn.Module | Callable[..., nn.Module], model_kwargs: dict | None,
                     cfg: TrainConfig, shapes: tuple[list[int], int] | None = None) -> tuple[nn.Module, dict]:
    """(the module to train, its factory record ``{"factory": "pkg.mod:name", "kwargs": {...}}``).

    A factory is called with ``model_kwargs`` (plus ``in_shape`` / ``num_classes`` from the data,
    ``shapes`` or else ``cfg``'s records, when its signature takes them and they are not given),
    its parameters initialized from ``cfg.seed``. An instance is used as it is."""
    if isinstance(model, nn.Module):
        if model_kwargs:
            raise MnistflowError("model_kwargs are the arguments of a model class or factory; "
                                 f"got an instance of {type(model).__name__} (set init_kwargs on it, "
                                 "or pass the class)")
        return model, _record(type(model), own_config(model))
    if not callable(model):
        raise MnistflowError("model must be a registered name, a layer spec, a torch.nn.Module, or a "
                             f"class or function returning one; got {type(model).__name__}")
    if model_kwargs is not None and not isinstance(model_kwargs, dict):
        raise MnistflowError(f"model_kwargs must be a dict; got {type(model_kwargs).__name__}")
    kwargs = dict(model_kwargs or {})
    name = getattr(model, "__qualname__", None) or type(model).__name__
    try:
        sig = inspect.signature(model)
    except (TypeError, ValueError):  # a builtin without a signature: call it as it is
        sig = None
    if sig is not None:
        wanted = [a for a in DATA_ARGS if a in sig.parameters and a not in kwargs]
        if wanted:
            in_shape, num_classes = shapes or data_shape(cfg)
            kwargs.update({k: v for k, v in (("in_shape", in_shape), ("num_classes", num_classes))
                           if k in wanted})
        try:
            sig.bind(**kwargs)
        except TypeError as e:
            raise MnistflowError(f"model_kwargs do not fit {name}{sig}: {e}") from None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)  # like a registered model: the same seed, the same start
        module = model(**kwargs)
    if not isinstance(module, nn.Module):
        raise MnistflowError(f"model {name}(...) returned a {type(module).__name__}, not a torch.nn.Module")
    return module, _record(model, kwargs)


def build_from_path(cfg: TrainConfig, in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """The model ``--model package.module:name`` names, built with ``cfg.model_kwargs`` (a run's
    config.toml replayed: the very model, the very initial weights)."""
    from mnistflow.artifacts.model_file import import_factory

    factory = import_factory(cfg.model, None)
    return build_user_model(factory, cfg.model_kwargs, cfg, shapes=(list(in_shape), num_classes))[0]


def data_shape(cfg: TrainConfig) -> tuple[list[int], int]:
    """((C, H, W), number of classes) of the records ``cfg`` trains on (prepared once)."""
    from mnistflow.data.open import open_data

    rec = open_data(cfg.data, dataset=cfg.dataset, verify=False)  # fit verifies the checksums
    return list(rec.in_shape), rec.num_classes


def _record(factory: Any, kwargs: dict) -> dict:
    """The factory record: its import path, and ``kwargs`` as plain values (what config.toml and
    the model file hold: tuples become lists). A value they cannot hold (an object, None) is left
    out, and named under ``unrecorded`` for :func:`cannot_rebuild` to report."""
    plain, unrecorded = {}, []
    for k, v in kwargs.items():
        try:
            value = json.loads(json.dumps(v))
        except (TypeError, ValueError):
            value = None
        if value is not None and tomlable(value):
            plain[k] = value
        else:
            unrecorded.append(k)
    return {"factory": import_path(factory), "kwargs": plain, "unrecorded": unrecorded}


def cannot_rebuild(record: dict, model: nn.Module) -> str | None:
    """Why the recorded factory would NOT rebuild ``model`` in another process (None: it
    would): rebuilt here the way ``eval``/``serve`` rebuild it, its state_dict must have the
    same names and shapes."""
    from mnistflow.artifacts.model_file import build_model, check_fit
    from mnistflow.artifacts.model_info import ModelInfo

    factory, kwargs = record["factory"], dict(record["kwargs"])
    module, _, qualname = factory.partition(":")
    if module == "__main__":
        return "it is defined in the script being run (__main__), which another process cannot import"
    if "<locals>" in qualname or "<lambda>" in qualname:
        return "it is defined inside a function (or is a lambda), which cannot be imported"
    bad = record.get("unrecorded")
    if bad:
        return (f"its argument(s) {', '.join(bad)} cannot be recorded (not plain values: text, numbers, "
                "true/false, lists, tables)")
    info = ModelInfo(model=factory, in_shape=[], class_names=[], mean=[], std=[],
                     factory=factory, factory_kwargs=kwargs)
    try:
        with torch.random.fork_rng(devices=[]):
            rebuilt = build_model(info)
    except MnistflowError as e:
        return e.detail
    fit = check_fit(model.state_dict(), rebuilt.state_dict())
    if not fit.ok:
        return (f"{factory}(**{kwargs}) builds a different model ({fit.describe('not rebuilt')}); "
                "record the constructor arguments")
    return None

