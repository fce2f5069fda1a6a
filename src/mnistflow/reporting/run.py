"""What a report is drawn from besides the run's own files (``artifacts.runlog.load_run``): the
trained model run once over the test split of its records (``SplitPredictions``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mnistflow.artifacts.predictor import Predictor
from mnistflow.core.errors import MnistflowError


@dataclass
class SplitPredictions:
    """Per-image predictions of the model on a split of its records."""

    split: str
    images: np.ndarray  # (N, H, W, C) uint8
    labels: np.ndarray  # (N,) the model's output index of each image's true class
    probs: np.ndarray  # (N, K)
    class_names: list[str]  # shown for each output: the class name (its label value if unnamed)
    model: str
    dataset: str
    label_values: list[int] | None = None  # the original label of each output (None: 0..K-1)
    predictor: Predictor | None = None  # the model that made ``probs`` (the report shows its layers)
    confusion: np.ndarray = field(init=False)

    def __post_init__(self):
        k = len(self.class_names)
        self.confusion = np.bincount(self.labels * k + self.pred, minlength=k * k).reshape(k, k)

    @property
    def pred(self) -> np.ndarray:
        return self.probs.argmax(1)

    @property
    def acc(self) -> float:
        return float((self.pred == self.labels).mean()) if len(self.labels) else float("nan")

    @property
    def per_class_acc(self) -> np.ndarray:
        return np.diag(self.confusion) / np.maximum(self.confusion.sum(1), 1)


def predict_split(run_dir: str | Path, *, data: str | Path | None = None, device: str = "auto",
                  batch_size: int = 1000, threads: int | None = None) -> SplitPredictions:
    """The model of ``run_dir`` on the test split (else validation) of its records, per image;
    ``data`` (records or raw input) replaces the records the model was trained on."""
    from mnistflow.artifacts.load import load_any
    from mnistflow.artifacts.model_info import outputs_of_records
    from mnistflow.artifacts.predictor import as_predictor
    from mnistflow.data import open_data
    from mnistflow.runtime.cpu import set_threads
    from mnistflow.runtime.device import pick_device

    set_threads(threads)
    model, info = load_any(run_dir, device=pick_device(device), data=data)
    rec = open_data(data, fallback=info.records)
    if rec.in_shape != tuple(info.in_shape):
        raise MnistflowError(f"records hold {rec.shape} images but the model takes "
                             f"{tuple(info.in_shape)} (C, H, W)", rec.path)
    split = "test" if rec.has("test") else "val"
    outputs = outputs_of_records(info, rec, split)  # the records' classes -> the model's outputs
    x, y = rec.split(split)
    if outputs is not None:
        y = np.asarray(outputs, np.int64)[y]
    predictor = as_predictor(model, info)
    probs = np.concatenate([predictor.predict(np.array(x[i:i + batch_size]))
                            for i in range(0, len(y), batch_size)] or [np.zeros((0, info.num_classes))])
    return SplitPredictions(split, np.asarray(x), np.asarray(y, dtype=np.int64), probs,
                            info.class_names, info.model, info.dataset or rec.name, info.values, predictor)
