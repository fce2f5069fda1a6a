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


BATCH = 256  # images per forward pass: the activations stay in the CPU's caches (BENCHMARKS.md)


class TorchBackend:
    """A PyTorch model in eval mode (``inference_model``); safe to call from several threads
    (``inference_mode``). ``predict`` runs ``batch_size`` images at a time, in ``precision``
    (fp32, or bf16 / fp16 under autocast: ``runtime.device.Amp``)."""

    backend = "pytorch"

    def __init__(self, model: nn.Module, info: ModelInfo, *, precision: str = "fp32",
                 batch_size: int = BATCH):
        self.model, self.info = inference_model(model), info
        self.params = sum(p.numel() for p in model.parameters())
        self.batch_size = batch_size
        self.amp = Amp.create(precision, _device(model))

    @torch.inference_mode()
    def predict(self, batch: np.ndarray) -> np.ndarray:
        out = np.empty((len(batch), self.info.num_classes), np.float32)
        for i in range(0, len(batch), self.batch_size):
            with self.amp.autocast():
                probs = torch_probabilities(self.model, self.info, batch[i:i + self.batch_size])
            out[i:i + len(probs)] = probs.cpu().numpy()
        return out


def inference_model(model: nn.Module) -> nn.Module:
    """``model`` (changed in place) ready to classify: in eval mode and, when it has
    convolutions (4-D weights), channels-last, as training runs it (mnistflow's pooling and
    batch-norm kernels take channels-last tensors; elsewhere PyTorch's ops run slower on NCHW
    at these sizes). A ``.pt2`` program is left as it was traced."""
    model.eval()
    if _channels_last(model):
        model.to(memory_format=torch.channels_last)
    return model


def _channels_last(model: nn.Module) -> bool:
    """Whether ``inference_model`` makes ``model`` channels-last (and its input is)."""
    from mnistflow.artifacts.pt2 import ExportedModel

    return not isinstance(model, ExportedModel) and any(p.dim() == 4 for p in model.parameters())


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters(), torch.empty(0)).device


def torch_probabilities(model: nn.Module, info: ModelInfo, batch: np.ndarray) -> torch.Tensor:
    """uint8 images (N, H, W, C) -> class probabilities (N, K) on the model's device: the one
    preprocessing (``data.normalize.normalize``, channels-last for a channels-last model) and
    output (softmax in fp32) of a PyTorch model made ready by ``inference_model``, shared with
    ``artifacts.layers``. Call it under ``torch.inference_mode``."""
    from mnistflow.data.normalize import normalize

    x = normalize(batch, info.mean, info.std, _device(model), channels_last=_channels_last(model))
    return torch.softmax(model(x).float(), 1)


def as_predictor(model: nn.Module | OnnxBackend | Predictor, info: ModelInfo, *,
                 precision: str = "fp32") -> Predictor:
    """What ``load_any`` returned, as a Predictor (a PyTorch model runs in ``precision``; ONNX
    Runtime in the precision it was exported in)."""
    if hasattr(model, "predict") and hasattr(model, "backend"):
        return model
    return TorchBackend(model, info, precision=precision)


def predict_arrays(model: nn.Module | OnnxBackend, info: ModelInfo, images: np.ndarray) -> np.ndarray:
    """Class probabilities (N, K) for uint8 images (N, H, W, C) already at the model's size."""
    return as_predictor(model, info).predict(images)
