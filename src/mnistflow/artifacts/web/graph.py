"""A PyTorch model as a small graph of operations the browser's forward pass runs.

    graph = trace(model, x)          # (trace.py) x: one normalized image, (1, C, H, W) float32
    graph.nodes[i]                   # {"op", "in": [node indices], "shape": [...], attributes}
    graph.layers                     # [{"name", "kind", "node"}]: what artifacts.layers shows

The model runs once, for real, on ``x``, and every operation is recorded as it happens: a
``TorchFunctionMode`` sees each torch function the forward calls (``F.conv2d``,
``Tensor.permute``, ``+``, ``softmax``, ...), and forward hooks on the leaf modules (modules
without children, the layers of ``artifacts.layers``) mark each one's output as a layer. So
the graph is generic (a registered model, a layer spec, a user's module, an ensemble) and
shape-specialized: the Python control flow is taken as it is for this input size.

A few leaf modules run mnistflow's own kernels (``trace.opaque``); they are recorded as what they
compute (a convolution, a max-pool, batch norm + ReLU) rather than traced into. Tensors that do
not come from the input (parameters, buffers) are constants of the graph (``tensors``); every
operation on the input either becomes nodes or is refused, so no tensor computed from the
input can pass for a constant.
Anything else is refused in one ``MnistflowError`` line naming the layer and the operation:
an operation outside the op set (``OPS``, ``ops.HANDLERS``), a result read back into Python (``.item()``,
``bool(t)``: data-dependent control flow), a dtype other than float32.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from mnistflow.core.errors import MnistflowError

__all__ = ["Graph", "Tracer", "Refused", "OPS"]

# what the browser runs (server/static/web/forward.js) and ``run.run_graph`` twins in torch
OPS = ("input", "const", "conv2d", "linear", "affine", "unary", "binary", "reduce", "softmax",
       "maxpool2d", "avgpool2d", "adaptivepool2d", "pad", "reshape", "permute", "concat")
UNARY = ("relu", "tanh", "sigmoid", "gelu", "gelu_tanh", "silu", "leaky_relu", "elu", "hardtanh",
         "exp", "log", "neg", "abs", "sqrt")
# how a refusal names a few functions
NICE = {"__getitem__": "indexing (t[...])", "__setitem__": "indexing (t[...] = ...)", "__gt__": "a comparison",
        "__lt__": "a comparison", "__ge__": "a comparison", "__le__": "a comparison", "__eq__": "a comparison",
        "__ne__": "a comparison", "gt": "a comparison", "lt": "a comparison", "eq": "a comparison"}
# results that read a tensor's values back into Python: the graph would freeze them
READS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__complex__",
         "__array__", "__iter__", "data_ptr", "equal", "allclose", "is_nonzero"}


@dataclass
class Graph:
    """The recorded forward: ``nodes`` in execution order (node 0 is the input; each node's
    ``in`` are earlier nodes), the ``output`` node (the logits), the ``layers`` (leaf-module
    outputs, named as ``artifacts.layers`` names them) and the constant ``tensors`` (float32);
    ``sources`` finds a parameter's tensor while the model lives."""

    nodes: list[dict] = field(default_factory=list)
    tensors: list[np.ndarray] = field(default_factory=list)
    layers: list[dict] = field(default_factory=list)
    output: int = -1
    sources: dict[int, int] = field(default_factory=dict)  # id(parameter) -> its entry in tensors


class Refused(Exception):
    """An operation the graph cannot hold (turned into one ``MnistflowError`` line by ``trace``)."""


class Tracer(TorchFunctionMode):
    """Records the forward's operations into a ``Graph`` (see the module docstring)."""

    def __init__(self, model: nn.Module, handlers: dict[str, Callable], opaque: dict[type, Callable]):
        super().__init__()
        self.handlers = handlers  # torch function name -> handler (ops.HANDLERS)
        self.g = Graph()
        self.value: dict[int, int] = {}  # id(tensor) -> the node that computed it
        self.keep: list[Any] = []  # every tensor seen, alive: their ids stay unique
        self.const_of: dict[int, int] = {}  # id(constant tensor) -> its const node
        self.opaque = opaque  # leaf module type -> builder (trace.opaque)
        self.depth = 0  # > 0 inside an opaque leaf: its insides are not recorded
        self.where: list[tuple[str, str, bool]] = [("", type(model).__name__, False)]  # name, kind, leaf
        self.calls: dict[str, int] = {}
        self.leaf_input: list[Any] = []

    # --- the graph --------------------------------------------------------------------------
    def add(self, op: str, inputs: list[int], shape: list[int], **attrs) -> int:
        """A node ``op`` of ``inputs`` with output ``shape``; its index."""
        self.g.nodes.append({"op": op, "in": inputs, "shape": [int(s) for s in shape], **attrs})
        return len(self.g.nodes) - 1

    def emit(self, op: str, inputs: list[int], out: torch.Tensor, **attrs) -> int:
        """A node ``op`` of ``inputs`` whose value is ``out`` (float32): ``out`` is its value
        from now on (an in-place operation's output is its input: the newer node wins)."""
        return self.alias(out, self.add(op, inputs, list(out.shape), **attrs))

    def alias(self, out: torch.Tensor, k: int) -> int:
        """``out`` is node ``k``'s value."""
        if out.dtype != torch.float32:
            raise Refused(f"it computes in {str(out.dtype).removeprefix('torch.')}; the web page "
                           "computes in float32")
        self.keep.append(out)
        self.value[id(out)] = k
        return k

    def tensor(self, t: torch.Tensor | np.ndarray) -> int:
        """``t`` (a parameter, a buffer, or an array derived from them) in the constant table,
        as float32; the same tensor twice is one entry."""
        if isinstance(t, np.ndarray):
            self.g.tensors.append(np.ascontiguousarray(t, np.float32))
            return len(self.g.tensors) - 1
        if id(t) not in self.g.sources:
            with torch._C.DisableTorchFunction():  # not an operation of the forward
                a = t.detach().to("cpu", torch.float32).contiguous().numpy().copy()
            self.g.sources[id(t)] = self.tensor(a)
            self.keep.append(t)
        return self.g.sources[id(t)]

    def node(self, v: Any) -> int:
        """The node holding operand ``v``: a traced tensor's, else a new constant (a parameter,
        a buffer, a Python number)."""
        if isinstance(v, torch.Tensor):
            if id(v) in self.value:
                return self.value[id(v)]
            if id(v) not in self.const_of:
                self.const_of[id(v)] = self.add("const", [], list(v.shape), tensor=self.tensor(v))
            return self.const_of[id(v)]
        if isinstance(v, (bool, int, float)):
            return self.add("const", [], [], value=float(v))
        raise Refused(f"an operand of type {type(v).__name__}")

    def traced(self, v: Any) -> bool:
        return isinstance(v, torch.Tensor) and id(v) in self.value

    # --- the mode ---------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.depth:
            return func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        traced = any(self.traced(v) for v in tree_leaves((args, kwargs)))
        if traced and name in READS:
            raise Refused(f"{name} reads the values back into Python (data-dependent code)")
        out = func(*args, **kwargs)
        if not traced:
            return out  # no input in it: a constant, if the graph ever uses it
        if not any(isinstance(v, torch.Tensor) for v in tree_leaves(out)):
            return out  # shape, dtype, device, dim(): static for this input
        handler = self.handlers.get(name)
        if handler is None or not isinstance(out, torch.Tensor):
            raise Refused(f"calls {NICE.get(name, name)}, which the web page cannot run")
        handler(self, args, kwargs, out)
        return out

    # --- the hooks --------------------------------------------------------------------------
    def enter(self, mod: nn.Module, name: str, args: tuple) -> None:
        leaf = not any(True for _ in mod.children())
        self.where.append((name, type(mod).__name__, leaf))
        if leaf:
            self.leaf_input.append(args[0] if args else None)
            self.depth += type(mod) in self.opaque

    def leave(self, mod: nn.Module, name: str, out: Any) -> None:
        if self.where[-1][2]:
            self.leaf_done(mod, name, out)
        self.where.pop()

    def leaf_done(self, mod: nn.Module, name: str, out: Any) -> None:
        """A leaf module returned ``out``: an opaque one is recorded now; the output is a layer
        (as ``artifacts.layers`` shows one: a floating-point tensor with a dimension)."""
        x = self.leaf_input.pop()
        if type(mod) in self.opaque:
            self.depth -= 1
            if self.depth == 0:
                self.opaque[type(mod)](self, mod, x, out)
        if self.depth:
            return
        if isinstance(out, (tuple, list)):
            out = next((o for o in out if torch.is_tensor(o)), None)
        if not torch.is_tensor(out) or out.dim() == 0 or not out.is_floating_point():
            return
        self.calls[name] = self.calls.get(name, 0) + 1
        shown = name if self.calls[name] == 1 else f"{name}#{self.calls[name]}"
        self.g.layers.append({"name": shown, "kind": type(mod).__name__, "node": self.node(out)})

    def refusal(self, why: str) -> MnistflowError:
        """``why`` as one error line naming the module running: a layer (a leaf module), a
        module that holds layers, or the model itself."""
        name, kind, leaf = self.where[-1]
        who = f"layer '{name}' ({kind})" if leaf and name else f"'{name}' ({kind})" if name else f"the model ({kind})"
        return MnistflowError(f"{who}: {why}; the web export runs the operations docs/web.md lists")
