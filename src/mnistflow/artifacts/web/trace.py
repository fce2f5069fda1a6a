"""``trace(model, x)``: the graph (``graph.Graph``) of a PyTorch model for the browser.

    graph = trace(model.eval(), x)   # x: one normalized image, (1, C, H, W) float32

How the forward is recorded: ``graph``'s module docstring; which torch functions become
which nodes: ``ops``. This module adds the leaf modules recorded whole (``OPAQUE``) and runs
the model once under the tracer.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from mnistflow.artifacts.web.graph import Graph, Refused, Tracer
from mnistflow.artifacts.web.ops import HANDLERS, affine_node, conv_node, pool_node
from mnistflow.core.errors import MnistflowError

__all__ = ["trace", "opaque"]


def _conv(tr: Tracer, mod: nn.Conv2d, x: torch.Tensor, out: torch.Tensor) -> None:
    conv_node(tr, x, mod.weight, mod.bias, mod.stride, mod.padding, mod.dilation, mod.groups, out)


def _max_pool(tr: Tracer, mod: nn.MaxPool2d, x: torch.Tensor, out: torch.Tensor) -> None:
    pool_node(tr, "maxpool2d", x, mod.kernel_size, mod.stride, mod.padding, out,
              dilation=mod.dilation, ceil_mode=mod.ceil_mode)


def _bn_relu(tr: Tracer, mod: nn.BatchNorm2d, x: torch.Tensor, out: torch.Tensor) -> None:
    k = affine_node(tr, x, mod.running_mean, mod.running_var, mod.weight, mod.bias, mod.eps, out)
    tr.g.nodes[k]["relu"] = True


def opaque() -> dict[type, Callable]:
    """Leaf modules recorded as what they compute, by exact type: inside, they run mnistflow's
    own kernels or autograd functions, not torch functions a trace could follow."""
    from mnistflow.models.fast import FastConv2d
    from mnistflow.models.layers import BatchNormReLU2d, MaxPool2x2
    from mnistflow.models.patch_conv import PatchConv2d

    return {FastConv2d: _conv, PatchConv2d: _conv, MaxPool2x2: _max_pool, BatchNormReLU2d: _bn_relu}


def trace(model: nn.Module, x: torch.Tensor) -> Graph:
    """The graph of ``model`` (eval mode) for inputs shaped like ``x`` ((1, C, H, W) float32,
    normalized); an operation the page cannot run is one ``MnistflowError`` line naming the
    layer (or the model) that calls it."""
    tr = Tracer(model, HANDLERS, opaque())
    # an input that needs a gradient takes the plain paths (no dtype views, no native kernels);
    # not a leaf of autograd's graph, so that the forward may change it in place
    x = x.detach().clone().requires_grad_(True) * 1.0
    tr.emit("input", [], x)
    handles = []
    for name, mod in model.named_modules():
        handles.append(mod.register_forward_pre_hook(lambda m, a, name=name: tr.enter(m, name, a)))
        handles.append(mod.register_forward_hook(lambda m, a, o, name=name: tr.leave(m, name, o)))
    try:
        with torch.enable_grad(), tr:
            out = model(x)
    except Refused as e:
        raise tr.refusal(str(e)) from None
    except (RuntimeError, TypeError, ValueError) as e:  # a model that does not take this input
        shape = "x".join(map(str, x.shape[1:]))
        raise MnistflowError(f"the model's forward fails on a {shape} input ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
    finally:
        for h in handles:
            h.remove()
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 1 or id(out) not in tr.value:
        raise MnistflowError("the model's output is not one (N, classes) tensor computed from its input")
    tr.g.output = tr.value[id(out)]  # the page applies torch_probabilities' softmax itself
    tr.keep.clear()
    return tr.g
