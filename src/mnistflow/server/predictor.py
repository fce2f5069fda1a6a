"""What the server calls to classify: ``predict(uint8 batch (N, H, W, C)) -> probabilities (N, K)``.

Two back ends behind one small interface: ONNX Runtime for an ``.onnx`` export (``mnistflow
export --format onnx``), PyTorch for everything else ``artifacts.load_any`` reads. Both are
safe to call from several threads at once (eval-mode forward under ``inference_mode``;
``InferenceSession.run``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from mnistflow.artifacts.model_file import ModelInfo


class Predictor(Protocol):
    info: ModelInfo
    backend: str  # "pytorch" or "onnxruntime"
    params: int | None

    def predict(self, batch: np.ndarray) -> np.ndarray:
        """uint8 images (N, H, W, C) at the model's size -> class probabilities (N, K)."""


class TorchPredictor:
    backend = "pytorch"

    def __init__(self, model, info: ModelInfo):
        self.model, self.info = model.eval(), info
        self.params = sum(p.numel() for p in model.parameters())

    def predict(self, batch: np.ndarray) -> np.ndarray:
        from mnistflow.inference import predict_arrays

        if not batch.flags.writeable:  # torch.from_numpy warns on read-only arrays
            batch = batch.copy()
        return predict_arrays(self.model, self.info, batch)


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(1, keepdims=True)


class OnnxPredictor:
    """An ONNX export of a mnistflow model: input normalized float32 (N, C, H, W), output logits."""

    backend = "onnxruntime"

    def __init__(self, session, info: ModelInfo, params: int | None = None):
        self.session, self.info, self.params = session, info, params
        self.input_name = session.get_inputs()[0].name
        c = info.in_shape[0]
        self._mean = np.asarray(info.mean, np.float32).reshape(1, c, 1, 1)
        self._std = np.asarray(info.std, np.float32).reshape(1, c, 1, 1)

    def predict(self, batch: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(batch.transpose(0, 3, 1, 2), dtype=np.float32)
        (logits,) = self.session.run(None, {self.input_name: (x - self._mean) / self._std})[:1]
        return _softmax(np.asarray(logits, np.float32))


def _onnx_params(path: Path, info: ModelInfo) -> int | None:
    """Parameters of the model an ONNX file was exported from (the export folds some, e.g.
    batch norm, into others); else its initializers; None when neither can be read."""
    try:
        from mnistflow.models import create_model

        return sum(p.numel() for p in create_model(info.model, tuple(info.in_shape),
                                                   info.num_classes).parameters())
    except Exception:  # a model this mnistflow does not know: count the file's weights
        pass
    try:
        import onnx

        m = onnx.load(str(path), load_external_data=False)
        return int(sum(int(np.prod(t.dims)) for t in m.graph.initializer))
    except Exception:  # onnx is optional (the count is only shown on the page)
        return None


def load_predictor(path: str | Path, threads: int = 1) -> Predictor:
    """A predictor for anything ``artifacts.load_any`` reads: a run directory,
    ``model.safetensors``, a checkpoint, an npz with metadata, or an ``.onnx`` export."""
    import torch

    from mnistflow.artifacts.model_file import load_any

    torch.set_num_threads(threads)  # also the ONNX session's intra-op threads
    model, info = load_any(path)
    session = getattr(model, "session", None)
    if session is not None and hasattr(session, "get_inputs"):  # artifacts.OnnxModule
        return OnnxPredictor(session, info, _onnx_params(Path(model.path), info))
    return TorchPredictor(model, info)
