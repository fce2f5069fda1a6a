"""Progress lines: one every N steps, a validation line per evaluation, and the training bar.

In logs every line is kept. On a terminal the training line is rewritten in place, or, when
stderr is a terminal too, the bar with its ETA (``observe.train_bar``) stands for it and the
other lines are printed above the bar.
"""
from __future__ import annotations

import sys
from typing import IO

from mnistflow.core.progress import is_terminal, write
from mnistflow.training.observe.train_bar import TrainProgress


class ConsoleLogger:
    def __init__(self, total_steps: int, stream: IO | None = None, quiet: bool = False,
                 bar_stream: IO | None = None):
        self.total = total_steps
        self.stream = stream or sys.stdout
        self.tty = is_terminal(self.stream)
        self.quiet = quiet
        self._pending = False  # an unterminated \r line on the terminal
        self.progress = TrainProgress(total_steps, enabled=not quiet, stream=bar_stream)

    def _emit(self, text: str, transient: bool = False) -> None:
        if self.quiet:
            return
        if self.tty and transient:
            if self.progress.showing:
                return  # the bar stands for the in-place line
            self.stream.write("\r\033[K" + text)
            self._pending = True
            self.stream.flush()
        else:
            if self._pending:
                self.stream.write("\n")
                self._pending = False
            write(text, self.stream)  # above the bar, if one shows

    def on_train_start(self, logs: dict) -> None:
        self.progress.on_train_start(logs)

    def on_train_end(self, logs: dict) -> None:
        self.progress.on_train_end(logs)

    def on_step_end(self, step: int, logs: dict) -> None:
        if "loss" not in logs:  # an unlogged step: nothing measured
            return
        self._emit(f"epoch {logs['epoch']:6.2f}  step {step:>6}/{self.total:<6}  "
                   f"loss {logs['loss']:.4f}  acc {100 * logs['acc']:6.2f}%  lr {logs['lr']:.2e}  "
                   f"{logs['img_per_s']:>9,.0f} img/s  data wait {100 * logs['data_wait_frac']:4.1f}%"
                   + (f"  mem {logs['rss_mb']:,.0f} MB" if "rss_mb" in logs else ""),
                   transient=True)
        self.progress.on_step_end(step, logs)

    def on_validation_end(self, step: int, logs: dict) -> None:
        self._emit(f"{logs['split']:<5} step {step:>6}  loss {logs['loss']:.4f}  "
                   f"acc {100 * logs['acc']:6.2f}%  ({logs['n']:,} images, {logs['eval_s']:.2f} s)")

    def message(self, text: str) -> None:
        self._emit(text)
