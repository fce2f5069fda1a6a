"""Faults that tests inject into mnistflow from outside: the package ships no test hooks.

A fault is a function here, registered by ``@fault(module)``, that patches that mnistflow
module: ``fn(module, value, setattr)``. Two ways in:

In this process (a unit test), undone when the test ends::

    inject.apply("slow_save", 0.5, setattr=monkeypatch.setattr)

In a child process and everything it starts (the CLI as a user runs it, torchrun and its
restarted workers, ``--nproc``): add ``env(...)`` to its environment::

    run_cli("train", ..., env=inject.env(slow_save=30))
    subprocess.Popen([sys.executable, "-m", "torch.distributed.run", ..., "-m", "mnistflow", ...],
                     env={**os.environ, **inject.env(slow_save=30)})

``env`` puts ``helpers/inject_site`` first on PYTHONPATH and names the faults (JSON) in
``MNISTFLOW_TEST_FAULTS``; its ``sitecustomize.py`` runs at every interpreter's start and calls
:func:`install_from_env`, which patches each module right after its first import (a hook on
``sys.meta_path``), so a process that never imports it pays nothing.

To add a fault, write one function with ``@fault("mnistflow.x")``.
"""
from __future__ import annotations

import importlib
import importlib.abc
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

SITE = Path(__file__).resolve().parent / "inject_site"  # holds the sitecustomize.py
ENV = "MNISTFLOW_TEST_FAULTS"  # read by this file only, never by the package

Setter = Callable[[object, str, Any], None]
FAULTS: dict[str, tuple[str, Callable[[ModuleType, Any, Setter], None]]] = {}


def fault(module: str) -> Callable:
    """Register the decorated ``fn(module, value, setattr)`` as a fault patching ``module``."""
    def register(fn: Callable[[ModuleType, Any, Setter], None]) -> Callable:
        FAULTS[fn.__name__] = (module, fn)
        return fn
    return register


# --- the faults ---------------------------------------------------------------------------------

@fault("mnistflow.artifacts.checkpoint")
def slow_save(checkpoint: ModuleType, seconds: float, setattr: Setter = setattr,
              pause: Callable[[float], None] = time.sleep) -> None:
    """Every checkpoint write holds its temporary file, written in full and flushed, for
    ``seconds`` before the rename: a test can kill the process inside the write window."""
    real = checkpoint.atomic_write

    def atomic_write(path, write) -> None:
        def slowly(f) -> None:
            write(f)
            f.flush()
            pause(seconds)

        real(path, slowly)

    setattr(checkpoint, "atomic_write", atomic_write)


@fault("mnistflow.training.setup")
def data_delay(setup: ModuleType, seconds: float, setattr: Setter = setattr) -> None:
    """The run's data is streamed from disk and its training reader sleeps ``seconds`` per batch:
    a run slow enough to signal, kill or watch wait for its data."""
    real = setup.make_loader

    def make_loader(rec, split, *, train: bool = True, **kw):
        kw["resident"] = "no"
        if train:
            kw["delay_s"] = seconds
        return real(rec, split, train=train, **kw)

    setattr(setup, "make_loader", make_loader)


@fault("mnistflow.training.loop")
def die_at_step(loop: ModuleType, spec: dict, setattr: Setter = setattr) -> None:
    """The process of rank ``spec["rank"]`` kills itself (SIGKILL: no checkpoint, no goodbye)
    at its first resumable point at or after step ``spec["step"]``, in the first start of a
    torchrun job only ($TORCHELASTIC_RESTART_COUNT 0): the restarted processes run clean."""
    import signal

    real = loop.at_resumable_point

    def at_resumable_point(run) -> None:
        real(run)
        if (run.info.rank == spec["rank"] and run.state.step >= spec["step"]
                and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"):
            os.kill(os.getpid(), signal.SIGKILL)

    setattr(loop, "at_resumable_point", at_resumable_point)


@fault("mnistflow.training.setup")
def data_delay_alone(setup: ModuleType, seconds: float, setattr: Setter = setattr) -> None:
    """As ``data_delay``, only for a run of one process (world size 1): an elastic job shrunk to
    one machine trains slowly enough for another to join in time, and fast again once it has."""
    real = setup.make_loader

    def make_loader(rec, split, *, train: bool = True, **kw):
        if train and kw.get("world_size", 1) == 1:
            kw.update(resident="no", delay_s=seconds)
        return real(rec, split, train=train, **kw)

    setattr(setup, "make_loader", make_loader)


@fault("mnistflow.training.observe.mlflow_tracker")
def mlflow_missing(tracker: ModuleType, _value: Any = True, setattr: Setter = setattr) -> None:
    """As on a machine without MLflow: the tracker's look-up for the package finds nothing."""
    from types import SimpleNamespace

    real = tracker.importlib.util.find_spec

    def find_spec(name: str, *args):
        return None if name.partition(".")[0] == "mlflow" else real(name, *args)

    setattr(tracker, "importlib", SimpleNamespace(util=SimpleNamespace(find_spec=find_spec)))


@fault("mnistflow.core.limits")
def onnx_deadline(limits: ModuleType, seconds: float, setattr: Setter = setattr) -> None:
    """onnxruntime calls are stopped after ``seconds`` instead of ``MAX_ONNX_RUN_SECONDS``: a
    graph slow enough to meet the deadline without making the test slow."""
    setattr(limits, "MAX_ONNX_RUN_SECONDS", seconds)


# --- how they get in ----------------------------------------------------------------------------

def apply(name: str, value: Any, setattr: Setter = setattr) -> None:
    """Inject fault ``name`` into this process now (``setattr``: ``monkeypatch.setattr`` in a test)."""
    module, fn = FAULTS[name]
    fn(importlib.import_module(module), value, setattr)


def env(**faults: Any) -> dict[str, str]:
    """The environment variables that inject ``faults`` (name=value) into a child process."""
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        raise KeyError(f"no such fault: {', '.join(unknown)} (known: {', '.join(sorted(FAULTS))})")
    path = os.pathsep.join(p for p in (str(SITE), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, ENV: json.dumps(faults)}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` once module ``name`` has been imported (its code run)."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:  # the real spec, from the finders after this one
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        else:
            return None
        sys.meta_path.remove(self)
        run, then = spec.loader.exec_module, self.then

        def exec_module(module: ModuleType) -> None:
            run(module)
            then(module)

        spec.loader.exec_module = exec_module  # this module's own loader instance
        return spec


def install_from_env() -> None:
    """Inject the faults ``$MNISTFLOW_TEST_FAULTS`` names, each when its module is imported."""
    raw = os.environ.get(ENV)
    if not raw:
        return
    for name, value in json.loads(raw).items():
        module, fn = FAULTS[name]

        def then(mod: ModuleType, fn=fn, value=value) -> None:
            fn(mod, value, setattr)

        if module in sys.modules:
            then(sys.modules[module])
        else:
            sys.meta_path.insert(0, _AfterImport(module, then))
