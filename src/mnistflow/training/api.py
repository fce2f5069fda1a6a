"""``mnistflow.train``: train a registered model, a spec, or your own ``nn.Module``.

    import mnistflow
    mnistflow.train("fast", data="data/mnist")                      # a registered name
    mnistflow.train("conv3x3x16-bn-relu,maxpool2,fc10", epochs=1)    # a layer spec
    mnistflow.train(MyNet, model_kwargs={"width": 64}, recipe="fast")  # a class or factory
    mnistflow.train(MyNet(64), callbacks=[mnistflow.EarlyStopping()], loss=my_loss)  # an instance

Settings are the ``TrainConfig`` fields (``recipe=``, ``epochs=``, ``lr=``, ...), resolved
exactly as ``mnistflow train`` resolves its flags; the result is the run's summary.

A user's model must map a batch (N, C, H, W) of normalized images to (N, num_classes) logits.
The run records how to rebuild it (its import path "pkg.module:qualname" and keyword
arguments), so ``mnistflow eval/predict/export/serve/report RUN`` work on it later. That needs
a class or factory defined at module level in a module those commands can import, with its
arguments given as ``model_kwargs`` (or kept by the instance as ``init_kwargs`` or returned by
``get_config()``). Otherwise the run still trains, with a warning that later verbs cannot
rebuild it. An instance is trained in place.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import os
from typing import Any, Callable, Iterable

import torch
import torch.nn as nn

from mnistflow.core.errors import MnistflowError
from mnistflow.core.log import warn
from mnistflow.training.callbacks import check_callbacks
from mnistflow.training.config import TrainConfig

# The arguments mnistflow's own factories take (models.registry); filled in from the data.
DATA_ARGS = ("in_shape", "num_classes")
STAND_IN = "softmax"  # a registered name, for resolving the settings of a user's model


def train(model: str | nn.Module | Callable[..., nn.Module] | None = None,
          data: str | os.PathLike | Any = None, *, val_data: Any = None, test_data: Any = None,
          callbacks: Iterable | None = None,
          loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
          model_kwargs: dict | None = None, config: str | os.PathLike | None = None,
          **settings) -> dict:
    """Train ``model`` on ``data``; returns the run summary (``mnistflow train --json``).

    ``model``: a registered name, a layer spec, an ``nn.Module``, or a class / function that
    returns one (called with ``model_kwargs``, plus ``in_shape`` and ``num_classes`` from the
    data when it takes them); None: the recipe's or the default model. ``data``: a records
    directory, raw input, ``open_records(...)``, or data in memory: an ``(x, y)`` pair of numpy
    arrays or tensors, a torch ``Dataset`` or ``DataLoader`` (written once into the cache as
    records: ``data.memory``). ``val_data`` / ``test_data``: the splits validated and tested on
    (without ``val_data``, one is carved from data in memory as ``prep`` does; see
    ``data.open.training_data``). ``callbacks``: see
    ``mnistflow.training.callbacks``. ``loss(logits, targets)``: replaces cross-entropy.
    ``config``: a TOML file (``RUN/config.toml``); ``settings`` override it.
    """
    cbs = check_callbacks(callbacks)
    if loss is not None and not callable(loss):
        raise MnistflowError(f"loss must be a function (logits, targets) -> loss; got {type(loss).__name__}")
    named = model is None or isinstance(model, (str, os.PathLike))
    if named and model_kwargs:
        raise MnistflowError("model_kwargs are the arguments of a model class or factory; "
                             f"'{model}' is a registered name or spec")
    if data is not None or val_data is not None or test_data is not None:
        from mnistflow.data.open import training_data

        settings["data"], settings["dataset"] = training_data(
            data, val_data, test_data, dataset=settings.get("dataset"),
            quiet=bool(settings.get("quiet") or settings.get("json")))
    from mnistflow.models.registry import check_trainable
    from mnistflow.training.configure import configure
    from mnistflow.training.loop import fit

    if named:
        if model is not None:
            settings["model"] = str(model)
        cfg, resume = configure(config, **settings)
        return fit(cfg, callbacks=cbs, loss_fn=loss, resume=resume)
    # Resolved with a registered stand-in: a user's model is named by its import path, which the
    # registry does not know (a resumed run's checkpoint holds that name too).
    cfg, resume = configure(config, **settings, model=STAND_IN)
    module, record = build_user_model(model, model_kwargs, cfg)
    check_trainable(module, type(module).__name__)  # before the run directory is made
    why = cannot_rebuild(record, module)
    if why:  # said once the run has started: quiet=True and summary["warnings"] apply to it
        cbs.insert(0, _WarnAtStart(
            f"later verbs (eval, predict, export, serve of this run) cannot rebuild model "
            f"{record['factory']}: {why}. To fix: define the class or factory at module level in "
            "a module they can import, and pass its arguments as model_kwargs (or keep them in "
            "the instance as init_kwargs / return them from get_config())"))
    cfg = dataclasses.replace(cfg, model=record["factory"])
    return fit(cfg, model=module, model_factory={"factory": record["factory"], "kwargs": record["kwargs"]},
               callbacks=cbs, loss_fn=loss, resume=resume)


class _WarnAtStart:
    """A warning emitted when training starts (inside the run's own logging scope)."""

    def __init__(self, message: str):
        self.message = message

    def on_train_start(self, logs: dict) -> None:
        warn(self.message)


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
                     cfg: TrainConfig) -> tuple[nn.Module, dict]:
    """(the module to train, its factory record ``{"factory": "pkg.mod:name", "kwargs": {...}}``).

    A factory is called with ``model_kwargs`` (plus ``in_shape`` / ``num_classes`` from the data
    when its signature takes them and they are not given), its parameters initialized from
    ``cfg.seed``. An instance is used as it is."""
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
            in_shape, num_classes = data_shape(cfg)
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


def data_shape(cfg: TrainConfig) -> tuple[list[int], int]:
    """((C, H, W), number of classes) of the records ``cfg`` trains on (prepared once)."""
    from mnistflow.data.open import open_data

    rec = open_data(cfg.data, dataset=cfg.dataset, verify=False)  # fit verifies the checksums
    return list(rec.in_shape), rec.num_classes


def _record(factory: Any, kwargs: dict) -> dict:
    """The factory record: its import path, and ``kwargs`` as plain JSON (what the model file
    holds: tuples become lists). A value JSON cannot hold is left out, and named under
    ``unrecorded`` for :func:`cannot_rebuild` to report."""
    plain, unrecorded = {}, []
    for k, v in kwargs.items():
        try:
            plain[k] = json.loads(json.dumps(v))
        except (TypeError, ValueError):
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
        return f"its argument(s) {', '.join(bad)} cannot be recorded (not plain JSON values)"
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

