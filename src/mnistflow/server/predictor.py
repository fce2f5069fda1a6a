"""What the server calls to classify: ``predict(uint8 batch (N, H, W, C)) -> probabilities (N, K)``.

The back ends live in ``artifacts``: ONNX Runtime for an ``.onnx`` export
(``artifacts.onnx.OnnxBackend``), PyTorch for everything else ``load_any`` reads
(``artifacts.predictor.TorchBackend``). Both are safe to call from several threads at once.
"""
from __future__ import annotations

from pathlib import Path

from mnistflow.artifacts.predictor import Predictor, as_predictor

__all__ = ["Predictor", "load_predictor"]


def load_predictor(path: str | Path, threads: int = 1, deadline: float | None = None) -> Predictor:
    """A predictor for anything ``artifacts.load.load_any`` reads: a run directory,
    ``model.safetensors``, a checkpoint, an npz with metadata, an ``.onnx`` or a ``.pt2`` export.
    ``deadline``: seconds after which an ONNX model's run is stopped (the server's work deadline:
    a request that overran frees its thread too)."""
    import torch

    from mnistflow.artifacts.load import load_any

    torch.set_num_threads(threads)  # also the ONNX session's intra-op threads
    pred = as_predictor(*load_any(path))
    if deadline is not None and hasattr(pred, "deadline"):
        pred.deadline = deadline
    return pred
