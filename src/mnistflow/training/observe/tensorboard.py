"""TensorBoard event files: curves as the tutorial shows them, plus throughput and the graph.

The writer (and its heavy import) is created on first use, and only on rank 0.
"""
from __future__ import annotations

import sys
from pathlib import Path


class TensorBoardLogger:
    def __init__(self, logdir: str | Path):
        self.logdir = Path(logdir)
        self._w = None
        self._failed = False

    @property
    def writer(self):
        if self._w is None and not self._failed:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                self._failed = True
                print("mnistflow: warning: tensorboard is not installed; no event files written",
                      file=sys.stderr)
                return None
            self._w = SummaryWriter(str(self.logdir))
        return self._w

    def on_train_log(self, step: int, logs: dict) -> None:
        w = self.writer
        if w is None:
            return
        w.add_scalar("train/loss", logs["loss"], step)
        w.add_scalar("train/acc", logs["acc"], step)
        w.add_scalar("lr", logs["lr"], step)
        w.add_scalar("throughput/img_per_s", logs["img_per_s"], step)
        w.add_scalar("pipeline/data_wait_frac", logs["data_wait_frac"], step)
        w.add_scalar("pipeline/queue_depth", logs["queue_depth"], step)

    def on_eval(self, step: int, logs: dict) -> None:
        w = self.writer
        if w is None:
            return
        w.add_scalar(f"{logs['split']}/loss", logs["loss"], step)
        w.add_scalar(f"{logs['split']}/acc", logs["acc"], step)

    def add_graph(self, model, example) -> None:
        w = self.writer
        if w is None:
            return
        try:
            w.add_graph(model, example)
        except Exception as e:  # tracing is best effort: a model with data-dependent control flow
            print(f"mnistflow: warning: model graph not written to TensorBoard ({e})", file=sys.stderr)

    def close(self) -> None:
        if self._w is not None:
            self._w.flush()
            self._w.close()
