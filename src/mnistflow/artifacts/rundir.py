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


def _entry(name: str) -> property:
    """A read-only attribute: the path of ``name`` inside the run directory."""
    return property(lambda self: self.path / name, doc=f"``RUN/{name}``")


@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory (nothing is created or read here)."""

    path: Path

    def __init__(self, path: str | Path) -> None:
        object.__setattr__(self, "path", Path(path))

    config = _entry(CONFIG)
    metrics = _entry(METRICS)
    summary = _entry(SUMMARY)
    model = _entry(MODEL)
    tensorboard = _entry(TENSORBOARD)
    profile = _entry(PROFILE)
    checkpoints = _entry(CHECKPOINTS)
    report = _entry(REPORT)

    @classmethod
    def of_checkpoint(cls, checkpoint_file: str | Path) -> "RunDir | None":
        """The run a checkpoint file belongs to (``RUN/checkpoints/step-N.pt``), else None."""
        p = Path(checkpoint_file)
        return cls(p.parent.parent) if p.parent.name == CHECKPOINTS else None

    def is_run(self) -> bool:
        """A directory that a ``train`` wrote (or is writing): it has a config or checkpoints."""
        return self.config.is_file() or self.checkpoints.is_dir() or self.model.is_file()
