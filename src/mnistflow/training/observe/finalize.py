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

    def _state(self) -> dict[str, tuple]:
        """Each parameter and module, by name: which object, and a parameter's shape and dtype
        (``p.data = ...`` keeps the object and changes what it holds)."""
        return {f"param {n}": (id(p), tuple(p.shape), p.dtype) for n, p in self.model.named_parameters()} | \
               {f"module {n or type(self.model).__name__}": (id(m),) for n, m in self.model.named_modules()}

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

    def __exit__(self, exc_type, exc, tb):
        for h in self._handles:
            h.remove()
        self._handles = []
        # A step that failed after a hook changed the model (a weight given another shape: a
        # raw matmul error in the next forward) is reported as that change, named.
        if exc_type is not None and not isinstance(exc, MnistflowError) and issubclass(exc_type, Exception):
            self.check("a step failed after it")
        return False

    def on_step_end(self, step: int, logs: dict) -> None:
        if "loss" not in logs:  # checked on logged steps only (the loop's cheap steps skip it)
            return
        self.check(f"at step {step}")

    def check(self, when: str) -> None:
        """Raise ``GraphModified`` naming what changed since setup, if anything did."""
        now = self._state()
        if now != self.snapshot:
            added = sorted(set(now) - set(self.snapshot))
            gone = sorted(set(self.snapshot) - set(now))
            changed = sorted(k for k in set(now) & set(self.snapshot) if now[k] != self.snapshot[k])
            what = "; ".join(x for x in (f"added {', '.join(added)}" if added else "",
                                         f"removed {', '.join(gone)}" if gone else "",
                                         f"replaced {', '.join(map(self._change, changed))}" if changed else "")
                             if x)
            raise GraphModified(f"the model changed during training ({when}): {what}")

    def _change(self, key: str) -> str:
        """``key`` and, for a parameter whose object stayed, what it holds now."""
        (was_id, *was), (now_id, *now) = self.snapshot[key], self._state()[key]
        if was_id != now_id or not was:
            return key
        (shape0, dtype0), (shape1, dtype1) = was, now
        return key + (f" (shape {shape0} -> {shape1})" if shape0 != shape1 else f" ({dtype0} -> {dtype1})")
