"""Progress lines: one every N steps, a validation line per evaluation.

On a terminal the training line is rewritten in place; in logs every line is kept.
"""
from __future__ import annotations

import sys


class ConsoleLogger:
    def __init__(self, total_steps: int, stream=None, quiet: bool = False):
        self.total = total_steps
        self.stream = stream or sys.stdout
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.quiet = quiet
        self._pending = False  # an unterminated \r line on the terminal

    def _emit(self, text: str, transient: bool = False) -> None:
        if self.quiet:
            return
        if self.tty and transient:
            self.stream.write("\r\033[K" + text)
            self._pending = True
        else:
            if self._pending:
                self.stream.write("\n")
                self._pending = False
            self.stream.write(text + "\n")
        self.stream.flush()

    def on_step_end(self, step: int, logs: dict) -> None:
        self._emit(f"epoch {logs['epoch']:6.2f}  step {step:>6}/{self.total:<6}  "
                   f"loss {logs['loss']:.4f}  acc {100 * logs['acc']:6.2f}%  lr {logs['lr']:.2e}  "
                   f"{logs['img_per_s']:>9,.0f} img/s  data wait {100 * logs['data_wait_frac']:4.1f}%"
                   + (f"  mem {logs['rss_mb']:,.0f} MB" if "rss_mb" in logs else ""),
                   transient=True)

    def on_validation_end(self, step: int, logs: dict) -> None:
        self._emit(f"{logs['split']:<5} step {step:>6}  loss {logs['loss']:.4f}  "
                   f"acc {100 * logs['acc']:6.2f}%  ({logs['n']:,} images, {logs['eval_s']:.2f} s)")

    def message(self, text: str) -> None:
        self._emit(text)
