"""What a report is drawn from: a run directory's own files (``RunLog``) and the trained model
run once over the test split of its records (``SplitPredictions``).

The run's files are read with a cap (``runlog.MAX_METRICS_BYTES``, ``runlog.MAX_SMALL_BYTES``):
memory stays bounded whatever a directory holds, and a file that is not a regular one (a FIFO
would block the read) is refused. What a tampered ``summary.json`` or ``config.toml`` holds is
checked before it is shown (``runlog.read_summary``, the reader ``eval`` uses too): a field of
the wrong type is one error line naming the file and field.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mnistflow.artifacts.rundir import METRICS, RunDir
from mnistflow.artifacts.runlog import (
    is_number,
    read_metrics,
    read_small,
    read_summary,
    type_name,
)
from mnistflow.core import compat
from mnistflow.core.errors import MnistflowError

# the fields of a metrics.jsonl record a report draws (the rest is not kept in memory)
METRIC_KEYS = ("kind", "step", "epoch", "loss", "acc", "lr", "img_per_s", "data_wait_frac")
# what the end-of-run table needs (present, a number unless null is allowed)
TABLE_FIELDS = ("wall_s", "img_per_s", "train_img_per_s", "data_wait_frac", "peak_rss_mb", "val_acc",
                "test_acc", "run_dir")
NULLABLE = ("time_to_target_s", "train_img_per_s", "data_wait_frac", "val_acc", "test_acc")


def table_missing(summary: dict, target) -> list[str]:
    """The fields the end-of-run table needs that ``summary`` lacks (or holds null where a
    number is needed)."""
    need = [*TABLE_FIELDS, *(["time_to_target_s"] if target is not None else []),
            *(["gpu_peak_reserved_mb"] if "gpu_peak_allocated_mb" in summary else [])]
    return [k for k in need if k not in summary or (summary[k] is None and k not in NULLABLE)]


@dataclass
class RunLog:
    """What a run directory says about itself (no model needed)."""

    path: Path
    train: list[dict]
    val: list[dict]
    test: list[dict]
    summary: dict | None
    config: dict
    config_text: str

    @property
    def name(self) -> str:
        return self.path.resolve().name

    @property
    def steps_per_epoch(self) -> float | None:
        """From any training line: ``epoch`` is ``step / steps_per_epoch``."""
        for r in self.train:
            if is_number(r.get("epoch")) and r["epoch"] > 0:
                return r["step"] / r["epoch"]
        return None

    def epochs(self, rows: list[dict]) -> list[float]:
        spe = self.steps_per_epoch or 1.0
        return [r["step"] / spe for r in rows]


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


def _by_step(rows: list[dict]) -> list[dict]:
    """Sorted by step, the last record of a step winning (a resumed run logs some again)."""
    return sorted({r["step"]: r for r in rows if is_number(r.get("step")) and isinstance(r["step"], int)
                   and 0 <= r["step"] < 2**53}.values(), key=lambda r: r["step"])


def load_run(run_dir: str | Path) -> RunLog:
    """The metrics, summary and configuration of a run directory."""
    run = RunDir(run_dir)
    if not run.path.is_dir():
        raise MnistflowError("no such run directory", run.path)
    if not os.path.lexists(run.metrics):
        raise MnistflowError(f"no {METRICS} in this directory (is it a run directory?)", run.path)
    recs = read_metrics(run.metrics, METRIC_KEYS)
    kinds = {k: _by_step([r for r in recs if r.get("kind") == k]) for k in ("train", "val", "test")}
    summary = read_summary(run.summary)
    config = {}
    text = read_small(run.config) or ""
    if text:
        try:
            config = compat.tomllib().loads(text)
        except compat.tomllib().TOMLDecodeError as e:
            raise MnistflowError(f"not valid TOML ({e})", run.config) from None
        except RecursionError:
            raise MnistflowError("not valid TOML (nested too deeply)", run.config) from None
        target = config.get("target_acc")
        if target is not None and not is_number(target):
            raise MnistflowError(f"target_acc is {type_name(target)}, not a number", run.config)
    return RunLog(run.path, kinds["train"], kinds["val"], kinds["test"], summary, config, text)


def predict_split(run_dir: str | Path, *, data: str | Path | None = None, device: str = "auto",
                  batch_size: int = 1000, threads: int | None = None) -> SplitPredictions:
    """The model of ``run_dir`` on the test split (else validation) of its records, per image;
    ``data`` (records or raw input) replaces the records the model was trained on."""
    from mnistflow.artifacts.load import load_any
    from mnistflow.artifacts.model_file import outputs_of_records
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
                            info.class_names, info.model, info.dataset or rec.name, info.values)
