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


class Predictor(Protocol):
    info: ModelInfo
    backend: str  # "pytorch" or "onnxruntime"
    params: int | None

    def predict(self, batch: np.ndarray) -> np.ndarray:
        """uint8 images (N, H, W, C) at the model's size -> class probabilities (N, K)."""


class TorchBackend:
    """A PyTorch model in eval mode; safe to call from several threads (``inference_mode``)."""

    backend = "pytorch"

    def __init__(self, model: nn.Module, info: ModelInfo):
        self.model, self.info = model.eval(), info
        self.params = sum(p.numel() for p in model.parameters())

    @torch.inference_mode()
    def predict(self, batch: np.ndarray) -> np.ndarray:
        return torch_probabilities(self.model, self.info, batch).cpu().numpy()


def torch_probabilities(model: nn.Module, info: ModelInfo, batch: np.ndarray) -> torch.Tensor:
    """uint8 images (N, H, W, C) -> class probabilities (N, K) on the model's device: the one
    preprocessing (``data.normalize.normalize``) and output (softmax in fp32) of a PyTorch model,
    shared with ``artifacts.layers``. Call it under ``torch.inference_mode``."""
    from mnistflow.data.normalize import normalize

    device = next(model.parameters(), torch.empty(0)).device
    return torch.softmax(model(normalize(batch, info.mean, info.std, device)).float(), 1)


def as_predictor(model: nn.Module | OnnxBackend | Predictor, info: ModelInfo) -> Predictor:
    """What ``load_any`` returned, as a Predictor."""
    return model if hasattr(model, "predict") and hasattr(model, "backend") else TorchBackend(model, info)


def predict_arrays(model: nn.Module | OnnxBackend, info: ModelInfo, images: np.ndarray) -> np.ndarray:
    """Class probabilities (N, K) for uint8 images (N, H, W, C) already at the model's size."""
    return as_predictor(model, info).predict(images)
