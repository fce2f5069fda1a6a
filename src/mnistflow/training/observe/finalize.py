"""The equivalent of finalizing the graph: after setup, the model's modules and parameters
are frozen. Creating a module or parameter during training (a layer built inside
``forward``) or replacing one raises an error naming it."""
from __future__ import annotations

import traceback

import torch.nn as nn
from torch.nn.modules.module import (register_module_module_registration_hook,
                                     register_module_parameter_registration_hook)

from mnistflow.core.errors import MnistflowError


class GraphModified(MnistflowError):
    pass


def _where() -> str:
    """The innermost frame outside torch and mnistflow: the user's line that did it."""
    for fr in reversed(traceback.extract_stack()[:-2]):
        f = fr.filename.replace("\\", "/")
        if "/torch/" not in f and "/mnistflow/training/" not in f:
            return f"{fr.filename}:{fr.lineno}"
    return "?"


class FinalizeGuard:
    """Use as a context manager around the training loop (a layer or parameter created during
    training fails at once), and as a hook: ``on_step_end`` (logged steps: logs with a "loss")
    compares the model's modules and parameters with the snapshot taken at setup (one
    replaced in between)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.snapshot = self._state()
        self._handles = []

    def _state(self) -> dict[str, int]:
        return {f"param {n}": id(p) for n, p in self.model.named_parameters()} | \
               {f"module {n or type(self.model).__name__}": id(m) for n, m in self.model.named_modules()}

    def _param_registered(self, module, name, value):
        # Fires while a new layer builds its own parameters (before it is attached anywhere).
        if value is not None:
            raise GraphModified(f"a {type(module).__name__} layer was created during training "
                                f"(at {_where()}): create every layer in __init__, before training starts")

    def _module_registered(self, module, name, value):
        if value is not None:
            raise GraphModified(f"{type(value).__name__} '{name}' was added to {type(module).__name__} "
                                f"during training (at {_where()}): create every layer in __init__, "
                                "before training starts")

    def __enter__(self):
        self._handles = [register_module_parameter_registration_hook(self._param_registered),
                         register_module_module_registration_hook(self._module_registered)]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        return False

    def on_step_end(self, step: int, logs: dict) -> None:
        if "loss" not in logs:  # checked on logged steps only (the loop's cheap steps skip it)
            return
        now = self._state()
        if now != self.snapshot:
            added = sorted(set(now) - set(self.snapshot))
            gone = sorted(set(self.snapshot) - set(now))
            changed = sorted(k for k in set(now) & set(self.snapshot) if now[k] != self.snapshot[k])
            what = "; ".join(x for x in (f"added {', '.join(added)}" if added else "",
                                         f"removed {', '.join(gone)}" if gone else "",
                                         f"replaced {', '.join(changed)}" if changed else "") if x)
            raise GraphModified(f"the model changed during training at step {step}: {what}")
