"""The run's metrics file: one JSON object per line (``metrics.jsonl``), appended as it goes.

Records: ``{"kind": "train", "step": N, <the logged scalars>}`` per logged step (logs that
hold a "loss"),
``{"kind": "val" | "test", "step": N, "acc", "loss", "n", "eval_s", ...}`` per evaluation, and
``{"kind": "epoch", "step": N, "epoch": E, ...}`` when a hook returned scalars at an epoch end.
What a hook returned is in the record of its step, under its own name.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from mnistflow.core.errors import os_error
from mnistflow.training.hooks import EPOCH_KEYS


class MetricsFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._f = open(self.path, "a", buffering=1)  # line-buffered: a crash loses no line
        except OSError as e:
            raise os_error(e, self.path) from e

    def write(self, kind: str, step: int, logs: dict) -> None:
        rec = {"kind": kind, "step": step}
        # a NaN or an infinity (a hook's, an empty evaluation's) is null: JSON has no NaN
        rec.update({k: None if isinstance(v, float) and not math.isfinite(v) else v
                    for k, v in logs.items() if isinstance(v, (int, float, str, bool))})
        try:
            self._f.write(json.dumps(rec) + "\n")
        except OSError as e:  # a full disk: one line naming the file
            raise os_error(e, self.path) from e

    def on_step_end(self, step: int, logs: dict) -> None:
        if "loss" in logs:  # logged steps (the measured scalars) only
            self.write("train", step, logs)

    def on_validation_end(self, step: int, logs: dict) -> None:
        split = logs["split"]  # <split>_acc / <split>_loss repeat acc / loss: left out
        self.write(split, step, {k: v for k, v in logs.items() if k not in (f"{split}_acc", f"{split}_loss")})

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        extra = {k: v for k, v in logs.items() if k not in EPOCH_KEYS}
        if extra:  # the scalars a hook returned (the loop's own numbers are written already)
            self.write("epoch", logs["step"], {"epoch": epoch, **extra})

    def close(self) -> None:
        self._f.close()
