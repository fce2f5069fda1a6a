"""A loaded model behind one small interface: ``predict(uint8 images) -> probabilities``.

Two back ends: PyTorch (``TorchBackend``, any ``nn.Module``) and ONNX Runtime
(``artifacts.onnx.OnnxBackend``). ``eval``, ``predict``, ``serve`` and ``report`` all classify
through it, so the preprocessing (uint8 -> normalized float) is the loaders' own
(``data.normalize.normalize``) everywhere.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
import torch.nn as nn

from mnistflow.artifacts.model_info import ModelInfo
from mnistflow.artifacts.onnx import OnnxBackend
from mnistflow.runtime.device import Amp


class Predictor(Protocol):
    info: ModelInfo
    backend: str  # "pytorch" or "onnxruntime"
    params: int | None

    def predict(self, batch: np.ndarray) -> np.ndarray:
        """uint8 images (N, H, W, C) at the model's size -> class probabilities (N, K)."""


BATCH = 256  # images per forward pass where the cache rule cannot tell (``cache_batch``)
DEVICE_BATCH = 2000  # on a GPU: enough images to keep it busy
# past ~1,000 images a batch's fixed costs are paid off, and its answers (a dict, ~1 KB, each)
# and inputs still take only megabytes
MIN_BATCH, MAX_BATCH = 32, 1024


class TorchBackend:
    """A PyTorch model in eval mode (``inference_model``); safe to call from several threads
    (``inference_mode``). ``predict`` runs ``batch_size`` images at a time (default:
    ``default_batch``), in ``precision`` (fp32, or bf16 / fp16 under autocast:
    ``runtime.device.Amp``)."""

    backend = "pytorch"

    def __init__(self, model: nn.Module, info: ModelInfo, *, precision: str = "fp32",
                 batch_size: int | None = None):
        self.model, self.info = inference_model(model), info
        self.params = sum(p.numel() for p in model.parameters())
        self.amp = Amp.create(precision, _device(model))
        self.batch_size = batch_size or default_batch(self.model, info, self.amp)
        # what runs the batches: the model in oneDNN's blocked layout where that is the same function
        self.net = (blocked_model(self.model, info) if precision == "fp32" else None) or self.model

    @torch.inference_mode()
    def predict(self, batch: np.ndarray) -> np.ndarray:
        out = np.empty((len(batch), self.info.num_classes), np.float32)
        for i in range(0, len(batch), self.batch_size):
            with self.amp.autocast():
                probs = torch_probabilities(self.net, self.info, batch[i:i + self.batch_size])
            out[i:i + len(probs)] = probs.cpu().numpy()
        return out


def default_batch(model: nn.Module, info: ModelInfo, amp: Amp) -> int:
    """Images per forward pass: on a CPU, ``cache_batch``; on a GPU, ``DEVICE_BATCH``."""
    return cache_batch(model, info, amp) if _device(model).type == "cpu" else DEVICE_BATCH


@torch.inference_mode()
def cache_batch(model: nn.Module, info: ModelInfo, amp: Amp) -> int:
    """As many images as keep the largest tensor of a batch's forward pass (the input or a
    layer's output, measured on one image in ``amp``'s precision) within the CPU's L3 cache,
    between ``MIN_BATCH`` and ``MAX_BATCH``: each layer then reads its input from the cache
    (seed-cnn: ~330 images, the fast net ~1300, so 1024; a batch 4 times smaller or larger ran
    10-25% slower on a Zen 3).
    ``BATCH`` where the cache or the layers cannot be told (a ``.pt2`` program, a forward pass
    that fails)."""
    from mnistflow.artifacts.pt2 import ExportedModel
    from mnistflow.runtime.cpu import l3_bytes

    cache = l3_bytes()
    if cache is None or isinstance(model, ExportedModel):
        return BATCH
    largest = [int(np.prod(info.in_shape)) * 4]  # the normalized input, float32
    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    handles = [m.register_forward_hook(lambda _m, _i, out: largest.append(
        out.numel() * out.element_size() if isinstance(out, torch.Tensor) else 0)) for m in leaves]
    try:
        with amp.autocast():
            torch_probabilities(model, info, np.zeros((1, *info.in_shape[1:], info.in_shape[0]), np.uint8))
    except Exception:  # a model that fails on a blank image fails where it is used, not here
        return BATCH
    finally:
        for h in handles:
            h.remove()
    return int(min(max(cache // max(largest), MIN_BATCH), MAX_BATCH))


def inference_model(model: nn.Module) -> nn.Module:
    """``model`` (changed in place) ready to classify: in eval mode and, when it has
    convolutions (4-D weights), channels-last, as training runs it (mnistflow's pooling and
    batch-norm kernels take channels-last tensors; elsewhere PyTorch's ops run slower on NCHW
    at these sizes). A ``.pt2`` program is left as it was traced."""
    model.eval()
    if takes_channels_last(model):
        model.to(memory_format=torch.channels_last)
    return model


class BlockedConv2d(nn.Module):
    """A convolution of ``nn.Conv2d``'s zero padding on oneDNN tensors (``Tensor.to_mkldnn``):
    blocked in, blocked out."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        self.weight = conv.weight.detach().contiguous().to_mkldnn()
        self.bias = None if conv.bias is None else conv.bias.detach().contiguous()
        self.args = (conv.padding, conv.stride, conv.dilation, conv.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mkldnn_convolution(x, self.weight, self.bias, *self.args)


class ToDense(nn.Module):
    """Where a blocked model's convolutions end: the rest runs on ordinary tensors."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to_dense() if x.is_mkldnn else x


class BlockedModel(nn.Sequential):
    """Layers that take a blocked tensor, behind a dense interface."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.to_mkldnn())


@torch.inference_mode()
def blocked_model(model: nn.Module, info: ModelInfo) -> BlockedModel | None:
    """``model``'s convolutions on oneDNN's blocked layout, so their outputs pass from layer to
    layer without a reorder each (seed-cnn's fp32 forward on a CPU: ~1.25x channels-last's
    img/s); the layers after them run as they are. Only for a CPU ``nn.Sequential`` whose
    layers up to the last convolution all have blocked forms that compute the same function
    (not SAME padding made by hand, not a fused batch norm + ReLU), and only if it agrees with
    ``model`` on a probe batch; None otherwise."""
    from mnistflow.models.layers import MaxPool2x2

    layers = list(model) if isinstance(model, nn.Sequential) else []
    end = _blocked_end(layers)
    if not end or _device(model).type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    # mnistflow's max-pool kernel reads strided tensors; PyTorch's op takes blocked ones
    head = [BlockedConv2d(m) if isinstance(m, nn.Conv2d)
            else nn.MaxPool2d(2, 2, ceil_mode=m.ceil_mode) if type(m) is MaxPool2x2 else m for m in layers[:end]]
    blocked = BlockedModel(*head, ToDense(), *layers[end:])
    probe = np.random.default_rng(0).integers(0, 256, (8, *info.in_shape[1:], info.in_shape[0]), np.uint8)
    try:
        got, want = torch_probabilities(blocked, info, probe), torch_probabilities(model, info, probe)
    except RuntimeError:  # an op without a blocked kernel
        return None
    return blocked if torch.allclose(got, want, rtol=0, atol=1e-5) else None


def _blocked_end(layers: list[nn.Module]) -> int:
    """How many of ``layers`` run blocked: up to the last convolution and the layers after it
    that take either layout; 0 when one before it has no blocked form."""
    from mnistflow.models.layers import Conv2d, Dropout, MaxPool2x2

    either = (nn.ReLU, nn.Identity, nn.Tanh, nn.Sigmoid, nn.Dropout, Dropout, nn.MaxPool2d, MaxPool2x2,
              nn.AdaptiveAvgPool2d)
    convs = [i for i, m in enumerate(layers) if isinstance(m, nn.Conv2d)]
    for m in layers[:convs[-1] + 1] if convs else []:
        conv = type(m) in (nn.Conv2d, Conv2d) and not getattr(m, "tf_same", False) \
            and m.padding_mode == "zeros" and m.weight.dtype == torch.float32
        if not (conv or type(m) in either):
            return 0
    end = convs[-1] + 1 if convs else 0
    while end and end < len(layers) and type(layers[end]) in either:
        end += 1
    return end


def takes_channels_last(model: object) -> bool:
    """Whether ``inference_model`` makes ``model`` channels-last, and so its input is best given
    channels-last (an ONNX backend or a ``.pt2`` program takes NCHW)."""
    from mnistflow.artifacts.pt2 import ExportedModel

    return (isinstance(model, nn.Module) and not isinstance(model, ExportedModel)
            and any(p.dim() == 4 for p in model.parameters()))


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters(), torch.empty(0)).device


def torch_probabilities(model: nn.Module, info: ModelInfo, batch: np.ndarray) -> torch.Tensor:
    """uint8 images (N, H, W, C) -> class probabilities (N, K) on the model's device: the one
    preprocessing (``data.normalize.normalize``, channels-last for a channels-last model) and
    output (softmax in fp32) of a PyTorch model made ready by ``inference_model``, shared with
    ``artifacts.layers``. Call it under ``torch.inference_mode``."""
    from mnistflow.data.normalize import normalize

    x = normalize(batch, info.mean, info.std, _device(model), channels_last=takes_channels_last(model))
    return torch.softmax(model(x).float(), 1)


def as_predictor(model: nn.Module | OnnxBackend | Predictor, info: ModelInfo, *,
                 precision: str = "fp32", batch_size: int | None = None) -> Predictor:
    """What ``load_any`` returned, as a Predictor (a PyTorch model runs in ``precision``,
    ``batch_size`` images a forward pass; ONNX Runtime as it was exported)."""
    if hasattr(model, "predict") and hasattr(model, "backend"):
        return model
    return TorchBackend(model, info, precision=precision, batch_size=batch_size)


def predict_arrays(model: nn.Module | OnnxBackend, info: ModelInfo, images: np.ndarray) -> np.ndarray:
    """Class probabilities (N, K) for uint8 images (N, H, W, C) already at the model's size."""
    return as_predictor(model, info).predict(images)
