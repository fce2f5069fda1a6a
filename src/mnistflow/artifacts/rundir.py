"""The run directory: the contract between ``train`` and every verb that reads a run.

    runs/<name>/
      config.toml        the resolved configuration (``mnistflow train --config`` reads it back)
      metrics.jsonl      one JSON object per logged step / evaluation
      summary.json       the final figures, the warnings the run printed, the kernels it used
      model.safetensors  the trained weights and how to rebuild the model (its metadata)
      tb/                TensorBoard event files
      profile/           the profiler's Chrome trace and tables
      checkpoints/       step-NNNNNN.pt, and the ``last`` / ``best`` pointer files
      report/            ``mnistflow report``'s page and plots

This module is the one place that names these files; everything else asks it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIG = "config.toml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
MODEL = "model.safetensors"
TENSORBOARD = "tb"
PROFILE = "profile"
CHECKPOINTS = "checkpoints"
REPORT = "report"


@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory (nothing is created or read here)."""

    path: Path

    def __init__(self, path: str | Path) -> None:
        object.__setattr__(self, "path", Path(path))

    @property
    def config(self) -> Path:
        return self.path / CONFIG

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY

    @property
    def model(self) -> Path:
        return self.path / MODEL

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD

    @property
    def profile(self) -> Path:
        return self.path / PROFILE

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def report(self) -> Path:
        return self.path / REPORT

    @classmethod
    def of_checkpoint(cls, checkpoint_file: str | Path) -> "RunDir | None":
        """The run a checkpoint file belongs to (``RUN/checkpoints/step-N.pt``), else None."""
        p = Path(checkpoint_file)
        return cls(p.parent.parent) if p.parent.name == CHECKPOINTS else None

    def is_run(self) -> bool:
        """A directory that a ``train`` wrote (or is writing): it has a config or checkpoints."""
        return self.config.is_file() or self.checkpoints.is_dir() or self.model.is_file()
