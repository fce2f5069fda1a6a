"""The layers of a model for one input: every leaf module's output, in execution order.

    from mnistflow.artifacts.layers import layers, kernel
    model, info = load_any("runs/fast-1")
    for layer in layers(model, info, image):      # image: uint8 (H, W, C) at the model's size
        print(layer.name, layer.kind, layer.shape, layer.values.max())
    w = kernel(model, "features.0", 5)            # conv channel 5's weights, (C_in/groups, kh, kw)

Generic: one forward pass with forward hooks on the leaf modules (modules without children),
so a registered model, a layer spec, a user's own ``nn.Module`` and an ensemble (``NAME-xK``:
each member's layers, named ``members.<i>.<layer>``) all work the same. A layer's name is its
module's path in the model (what ``kernel`` takes), ``#<n>`` added for the n-th call of a
module called more than once; ``kind`` is the module's class name. Functional steps between
modules (``torch.relu``, ``flatten``, space-to-depth) have no module and are not shown. The
list ends with the output probabilities: given a predictor, its own ``predict``'s answer, so
they equal ``predict``'s bit for bit (it may run the layers in another layout).

The size is bounded: all layers together hold at most ``core.limits.MAX_LAYER_VALUES`` values
(the probabilities always come whole). A model over it loses channels of its widest layers:
every layer keeps at most L values, L the largest budget under which the total fits; a layer
over L keeps its ``L // (values per channel)`` most active channels (largest mean |value|; maybe
none), in their original order, listed in ``channels``, with ``truncated`` set. The channel
axis is a layer's first (C of C x H x W, the unit of a fully connected layer).

An ONNX model or a ``.pt2`` program has no modules to hook: one ``MnistflowError`` line.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from mnistflow.artifacts.model_info import ModelInfo
from mnistflow.artifacts.predictor import inference_model, torch_probabilities
from mnistflow.core.errors import MnistflowError
from mnistflow.core.limits import MAX_LAYER_VALUES

__all__ = ["Layer", "layers", "kernel", "torch_model"]


@dataclass
class Layer:
    """One layer's output for one input. ``shape``: the output's full shape (batch dimension
    left out); ``values``: float32, ``shape`` itself, or (len(channels), *shape[1:]) when
    ``truncated`` (``channels``: the kept channel indices, ascending)."""

    name: str
    kind: str
    shape: tuple[int, ...]
    values: np.ndarray
    truncated: bool = False
    channels: list[int] | None = None


def torch_model(model: object, what: str = "layers") -> nn.Module:
    """``model`` when it is a PyTorch module with its layers, else one error line: an ONNX
    backend or a ``.pt2`` program (a traced graph) has none to show."""
    from mnistflow.artifacts.pt2 import ExportedModel

    inner = getattr(model, "model", model)  # a TorchBackend: its model
    if not isinstance(inner, nn.Module) or isinstance(inner, ExportedModel):
        kind = "a .pt2 program" if isinstance(inner, ExportedModel) else "an ONNX model"
        raise MnistflowError(f"{what} need the PyTorch model (a run directory, model.safetensors, "
                             f"a checkpoint or an npz), not {kind}")
    return inner


def _capture(model: nn.Module, found: list[Layer]) -> list:
    """Forward hooks on ``model``'s leaf modules that append each call's output to ``found``,
    for calls from this thread only (a server runs other requests on the same model at once)."""
    owner = threading.get_ident()
    calls: dict[str, int] = {}

    def hook(mod: nn.Module, _inp, out, name: str) -> None:
        if threading.get_ident() != owner:
            return
        if isinstance(out, (tuple, list)):
            out = next((o for o in out if torch.is_tensor(o)), None)
        if not torch.is_tensor(out) or out.dim() == 0 or not out.is_floating_point():
            return
        calls[name] = calls.get(name, 0) + 1
        shown = name if calls[name] == 1 else f"{name}#{calls[name]}"
        # a copy: an in-place module after this one (ReLU(inplace=True)) would change it
        values = out[0].detach().to("cpu", torch.float32, copy=True).numpy()
        found.append(Layer(shown, type(mod).__name__, tuple(values.shape), values))

    return [mod.register_forward_hook(lambda m, i, o, name=name: hook(m, i, o, name))
            for name, mod in model.named_modules() if name and not any(True for _ in mod.children())]


def layers(model: nn.Module, info: ModelInfo, image: np.ndarray,
           max_values: int = MAX_LAYER_VALUES) -> list[Layer]:
    """Every layer's output for one uint8 ``image`` (H, W, C) at the model's input size, in
    execution order, then ``probabilities`` (kind ``softmax``, the model's class order); bounded
    by ``max_values`` as the module docstring says. ``model``: a ``TorchBackend``, or an
    ``nn.Module`` in eval mode."""
    net = inference_model(torch_model(model))  # as the predictor runs it
    c, h, w = info.in_shape
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.shape != (h, w, c):
        got = f"{image.dtype} {'x'.join(map(str, image.shape))}" if isinstance(image, np.ndarray) \
            else type(image).__name__
        raise MnistflowError(f"layers take one uint8 {h}x{w}x{c} image (H x W x C), got {got}")
    found: list[Layer] = []
    handles = _capture(net, found)
    try:
        with torch.inference_mode():
            probs = torch_probabilities(net, info, image[None])[0].cpu().numpy()
    finally:
        for h in handles:
            h.remove()
    if hasattr(model, "predict"):  # a predictor: its own answer (it may run the layers another way)
        probs = model.predict(image[None])[0]
    out = Layer("probabilities", "softmax", tuple(probs.shape), probs.astype(np.float32))
    return bound(found, max(max_values - probs.size, 0)) + [out]


def budget(sizes: list[int], cap: int) -> int:
    """The largest L with sum(min(size, L)) <= cap (water filling), or the largest size when
    everything fits."""
    if sum(sizes) <= cap:
        return max(sizes, default=0)
    rest, left = sorted(sizes), cap
    for i, s in enumerate(rest):  # layers below the level keep all; the others share what is left
        level = left // (len(rest) - i)
        if s > level:
            return level
        left -= s
    return left  # (not reached: the sizes would have fitted)


def bound(found: list[Layer], cap: int) -> list[Layer]:
    """``found`` with at most ``cap`` values in all: the widest layers keep their most active
    channels (the module docstring's rule)."""
    level = budget([layer.values.size for layer in found], cap)
    for layer in found:
        v = layer.values
        if v.size <= level:
            continue
        per = v.size // v.shape[0] if v.ndim else v.size
        keep = min(level // max(per, 1), v.shape[0] if v.ndim else 0)
        activity = np.abs(v.reshape(v.shape[0], -1)).mean(1) if v.ndim else np.zeros(0)
        kept = np.sort(np.argsort(-activity, kind="stable")[:keep])
        layer.values = np.ascontiguousarray(v[kept]) if v.ndim else v.reshape(0)
        layer.truncated, layer.channels = True, [int(k) for k in kept]
    return found


def kernel(model: nn.Module, layer: str, channel: int,
           max_values: int = MAX_LAYER_VALUES) -> tuple[np.ndarray, list[int]]:
    """What produced output channel ``channel`` of convolution ``layer`` (a name from
    ``layers``, ``#<n>`` allowed): its weights, float32 (C_in/groups, kh, ...) one slice per
    input channel, and the input channels those slices read (all of them, unless grouped).
    An unknown layer, one that is no convolution, a channel out of range or a kernel over
    ``max_values`` values is a ``MnistflowError``."""
    net = torch_model(model, "kernels")
    name = layer.split("#", 1)[0]
    shown = layer if len(layer) <= 80 else layer[:80] + "..."
    mod = dict(net.named_modules()).get(name) if name else None
    if mod is None:
        raise MnistflowError(f"no layer named '{shown}' in this model")
    if not isinstance(mod, nn.modules.conv._ConvNd) or mod.transposed:
        raise MnistflowError(f"layer '{shown}' is a {type(mod).__name__}, not a convolution: "
                             "only convolutions have kernels")
    if isinstance(channel, bool) or not isinstance(channel, int) or not 0 <= channel < mod.out_channels:
        raise MnistflowError(f"layer '{shown}' has channels 0..{mod.out_channels - 1}, not {channel!r}")
    w = mod.weight[channel]
    if w.numel() > max_values:
        raise MnistflowError(f"the kernel of layer '{shown}' holds {w.numel():,} values: at most "
                             f"{max_values:,}")
    per_group = mod.in_channels // mod.groups
    first = channel // (mod.out_channels // mod.groups) * per_group
    weights = w.detach().to("cpu", torch.float32, copy=True).numpy()
    return weights, list(range(first, first + per_group))
