"""A user's model class or factory, imported by its ``package.module:qualname`` to rebuild a
saved model (``model_file.build_model``): never from the run directory or the model file's
folder, since saved files must not run code."""
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Callable, Iterable

from mnistflow.artifacts.rundir import RunDir
from mnistflow.core.errors import MnistflowError


def _is_within(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except (ValueError, OSError):
        return False


def _forbidden_dirs(source: str | Path | None) -> list[Path]:
    """Where a factory's code must not come from: the saved file's folder and its run."""
    if source is None:
        return []
    p = Path(source)
    folder = p if p.is_dir() else p.parent
    run = RunDir.of_checkpoint(p)
    return [folder] + ([run.path] if run is not None else [])


def import_factory(spec: str, source: str | Path | None) -> Callable:
    """The callable named by ``pkg.module:qualname``, imported with importlib; refused when its
    code would come from the run directory or the saved model's folder."""
    mod_name, sep, qualname = spec.partition(":")
    if not sep or not mod_name or not qualname or any(not part.isidentifier()
                                                      for part in mod_name.split(".") + qualname.split(".")):
        raise MnistflowError(f"model factory '{spec}' is not of the form 'package.module:name'", source)
    forbidden = _forbidden_dirs(source)

    def check(origin: str | None, locations: Iterable[str] = ()) -> None:
        for where in [origin, *locations]:
            if where and any(_is_within(Path(where), d) for d in forbidden):
                raise MnistflowError(f"refused: the model factory '{spec}' would be imported from "
                                     f"{where}, inside the run directory or next to the model file "
                                     "(saved files never run code; install the module or put it "
                                     "on PYTHONPATH elsewhere)", source)

    top = mod_name.split(".")[0]
    try:
        found = importlib.util.find_spec(top)  # locating a top-level module executes nothing
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise MnistflowError(f"cannot rebuild the model: its module '{mod_name}' is not importable "
                             f"(factory '{spec}'; install it or add it to PYTHONPATH)", source)
    check(found.origin, found.submodule_search_locations or ())
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:
        raise MnistflowError(f"cannot import '{mod_name}' for the model factory '{spec}' ({e})",
                             source) from None
    check(getattr(module, "__file__", None))
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise MnistflowError(f"'{mod_name}' has no '{qualname}' (model factory '{spec}')", source)
    if not callable(obj):
        raise MnistflowError(f"model factory '{spec}' is not callable", source)
    return obj
