"""The traced graph run in PyTorch, node by node: the twin of the browser's forward pass
(``server/static/web/forward.js``) that the export checks against the model itself.

    values = run_graph(graph, x)            # x: (1, C, H, W) normalized; every node's value
    logits = values[graph.output]
    check(graph, model, info, images)       # the graph and its layers against PyTorch's

The twin checks the trace (that the recorded nodes compute what the model computes); the
browser tests check forward.js against PyTorch.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mnistflow.artifacts.model_info import ModelInfo
from mnistflow.artifacts.web.graph import Graph
from mnistflow.core.errors import MnistflowError

__all__ = ["run_graph", "check"]

_UNARY = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "gelu": F.gelu,
          "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "exp": torch.exp,
          "log": torch.log, "neg": torch.neg, "abs": torch.abs, "sqrt": torch.sqrt}
_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
           "max": torch.maximum, "min": torch.minimum}
_REDUCE = {"max": torch.amax, "min": torch.amin, "mean": torch.mean, "sum": torch.sum}


def _channel(v: torch.Tensor, ndim: int) -> torch.Tensor:
    """A per-channel vector shaped to broadcast along axis 1 of an ``ndim``-d tensor."""
    return v.view(1, -1, *([1] * (ndim - 2)))


def _unary(n: dict, x: torch.Tensor) -> torch.Tensor:
    fn = n["fn"]
    if fn == "leaky_relu":
        return F.leaky_relu(x, n["alpha"])
    if fn == "elu":
        return F.elu(x, n["alpha"])
    if fn == "hardtanh":
        return F.hardtanh(x, n["min"], n["max"])
    return _UNARY[fn](x)


def _node(n: dict, xs: list[torch.Tensor], t: list[torch.Tensor]) -> torch.Tensor:
    """One node's value from its inputs ``xs`` and the constant tensors ``t``."""
    op = n["op"]
    x = xs[0] if xs else None
    opt = lambda k: None if n.get(k) is None else t[n[k]]  # noqa: E731
    if op == "const":
        return t[n["tensor"]].reshape(n["shape"]) if "tensor" in n else torch.tensor(n["value"])
    if op == "conv2d":
        top, left, bottom, right = n["pad"]
        return F.conv2d(F.pad(x, (left, right, top, bottom)), t[n["weight"]], opt("bias"),
                        n["stride"], 0, n["dilation"], n["groups"])
    if op == "linear":
        return F.linear(x, t[n["weight"]], opt("bias"))
    if op == "affine":
        y = x * _channel(t[n["scale"]], x.dim()) + _channel(t[n["shift"]], x.dim())
        return torch.relu(y) if n.get("relu") else y
    if op == "unary":
        return _unary(n, x)
    if op == "binary":
        return _BINARY[n["fn"]](*xs).float()
    if op == "reduce":
        return _REDUCE[n["fn"]](x, dim=n["axes"], keepdim=n["keepdim"])
    if op == "softmax":
        return (F.log_softmax if n["log"] else F.softmax)(x, n["axis"])
    if op == "maxpool2d":
        return F.max_pool2d(x, n["kernel"], n["stride"], n["pad"], n["dilation"], n["ceil"])
    if op == "avgpool2d":
        return F.avg_pool2d(x, n["kernel"], n["stride"], n["pad"], n["ceil"], n["count_include_pad"], n["divisor"])
    if op == "adaptivepool2d":
        return (F.adaptive_avg_pool2d if n["fn"] == "avg" else F.adaptive_max_pool2d)(x, n["shape"][-2:])
    if op == "pad":
        flat = [p for pair in reversed(n["pads"]) for p in pair]
        return F.pad(x, flat, value=n["value"])
    if op == "reshape":
        return x.reshape(n["shape"])
    if op == "permute":
        return x.permute(n["perm"])
    if op == "concat":
        return torch.cat(xs, n["axis"])
    raise ValueError(f"unknown op {op!r}")


@torch.no_grad()
def run_graph(g: Graph, x: torch.Tensor) -> list[torch.Tensor]:
    """Every node's value for the normalized image ``x`` (1, C, H, W), in node order."""
    t = [torch.from_numpy(a) for a in g.tensors]
    values: list[torch.Tensor] = []
    for n in g.nodes:
        v = x if n["op"] == "input" else _node(n, [values[i] for i in n["in"]], t)
        if list(v.shape) != n["shape"]:
            raise AssertionError(f"node {len(values)} ({n['op']}) gives {list(v.shape)}, not {n['shape']}")
        values.append(v)
    return values


def check(g: Graph, model: torch.nn.Module, info: ModelInfo, images: np.ndarray, tol: float = 1e-4) -> dict:
    """The graph's probabilities against ``predict``'s (``torch_probabilities``) on uint8
    ``images`` (N, H, W, C), and its layers against ``artifacts.layers`` on the first: names,
    kinds, shapes and values. A mismatch is a ``MnistflowError`` (the export is not written)."""
    from mnistflow.artifacts.layers import layers
    from mnistflow.artifacts.predictor import torch_probabilities
    from mnistflow.data.normalize import normalize

    with torch.inference_mode():
        want = torch_probabilities(model, info, images).cpu()
    x = normalize(images, info.mean, info.std)
    got = torch.cat([run_graph(g, x[i:i + 1])[g.output].float().softmax(1) for i in range(len(x))])
    diff = float((got - want).abs().max())
    agree = float((got.argmax(1) == want.argmax(1)).float().mean())
    ref = layers(model, info, images[0], max_values=1 << 62)[:-1]
    values = run_graph(g, x[:1])
    mine = [(d["name"], d["kind"], tuple(g.nodes[d["node"]]["shape"][1:])) for d in g.layers]
    if mine != [(r.name, r.kind, r.shape) for r in ref]:
        raise MnistflowError("the traced layers differ from the model's (a forward the web export "
                             "cannot follow); not written")
    layer_diff = max((float(np.abs(values[d["node"]][0].numpy() - r.values).max() / max(1.0, np.abs(r.values).max()))
                      for d, r in zip(g.layers, ref) if r.values.size), default=0.0)
    if diff > tol or agree < 1 or layer_diff > tol:
        raise MnistflowError(f"the traced graph does not match PyTorch (max probability diff {diff:.3g}, "
                             f"layers {layer_diff:.3g}); not written")
    return {"checked_on": len(images), "max_prob_diff": diff, "max_layer_diff": layer_diff}
