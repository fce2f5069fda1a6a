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
import os
from typing import Any, Callable, Iterable

import torch
import torch.nn as nn

from mnistflow.core.errors import MnistflowError
from mnistflow.core.log import warn
from mnistflow.training.callbacks import check_callbacks
from mnistflow.training.user_model import build_user_model, cannot_rebuild, import_path


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
    if data is not None or val_data is not None or test_data is not None:
        from mnistflow.data.open import training_data

        settings["data"], settings["dataset"] = training_data(
            data, val_data, test_data, dataset=settings.get("dataset"),
            quiet=bool(settings.get("quiet") or settings.get("json")))
    from mnistflow.models.registry import check_trainable
    from mnistflow.training.configure import configure
    from mnistflow.training.loop import fit

    if model is None or isinstance(model, (str, os.PathLike)):  # a name, spec or import path
        if model is not None:
            settings["model"] = str(model)
        cfg, resume = configure(config, **settings, model_kwargs=model_kwargs)
        return fit(cfg, callbacks=cbs, loss_fn=loss, resume=resume)
    # A module, class or factory: named by its import path, built here (an instance is used as
    # it is), and recorded with its keyword arguments so that the run can be replayed.
    cfg, resume = configure(config, **settings, model=import_path(model if callable(model) and
                                                                   not isinstance(model, nn.Module)
                                                                   else type(model)))
    module, record = build_user_model(model, model_kwargs, cfg)
    check_trainable(module, type(module).__name__)  # before the run directory is made
    why = cannot_rebuild(record, module)
    if why:  # said once the run has started: quiet=True and summary["warnings"] apply to it
        cbs.insert(0, _WarnAtStart(
            f"later verbs (eval, predict, export, serve, train --config of this run) cannot rebuild "
            f"model {record['factory']}: {why}. To fix: define the class or factory at module level "
            "in a module they can import, and pass its arguments as model_kwargs (or keep them in "
            "the instance as init_kwargs / return them from get_config())"))
    cfg = dataclasses.replace(cfg, model=record["factory"], model_kwargs=record["kwargs"] or None)
    return fit(cfg, model=module, callbacks=cbs, loss_fn=loss, resume=resume)


class _WarnAtStart:
    """A warning emitted when training starts (inside the run's own logging scope)."""

    def __init__(self, message: str):
        self.message = message

    def on_train_start(self, logs: dict) -> None:
        warn(self.message)
