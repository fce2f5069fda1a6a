"""The run's console record: a table with a row per epoch that stays, as Keras prints one line
per epoch, and the live bar below it on a terminal.

    epoch     step     loss      acc  val_loss  val_acc      img/s  data wait
     1.00      430   0.3414   90.25%    0.3320   90.68%     82,229      14.3%

Which rows stay (the rule):

* at the end of every epoch, and at the end of the run (a run that stops inside an epoch):
  the steps since the row before, their mean loss and accuracy, img/s and data wait, and the
  validation pass of that very step (val_loss, val_acc; blank when there was none);
* inside a long epoch, on a terminal: a logged step once ``keep_every_s`` (60 s) have passed
  since the row before, so a long epoch leaves a row a minute, never more than one per log
  interval;
* when stdout is no terminal (logs, pipes, CI): every logged step (``--log-every``).

A validation pass of another step, and every test pass, gets its own line. On a terminal the
bar with its ETA (``observe.train_bar``, on stderr) shows the live progress below the rows;
with no bar (stderr redirected) the row of the latest logged step is rewritten in place. Every
line fits 80 columns. The console acts only on logs that hold a "loss" (logged steps), so it
stays cheap and correct when ``on_step_end`` comes every step.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import IO, Callable

from mnistflow.core.progress import is_terminal, write
from mnistflow.training.observe.train_bar import TrainProgress

KEEP_EVERY_S = 60.0  # on a terminal, a row inside an epoch at most this often
HEADER_EVERY = 25  # the header again after this many rows (it has scrolled away)

# (title, width): the rows' columns, two spaces apart: 75 columns
_COLUMNS = (("epoch", 7), ("step", 7), ("loss", 7), ("acc", 7), ("val_loss", 8), ("val_acc", 7),
            ("img/s", 9), ("data wait", 9))


@dataclass
class Span:
    """Logged steps summed for one row: loss and accuracy weighted by steps, and each window's
    time (as steps / img/s: the batch size cancels out) for img/s and data wait."""

    steps: int = 0
    loss: float = 0.0
    acc: float = 0.0
    time: float = 0.0  # sum of steps / img_per_s
    wait: float = 0.0  # sum of data_wait_frac x time

    def add(self, steps: int, logs: dict) -> None:
        t = steps / max(logs["img_per_s"], 1e-12)
        self.steps += steps
        self.loss += steps * logs["loss"]
        self.acc += steps * logs["acc"]
        self.time += t
        self.wait += logs["data_wait_frac"] * t

    def figures(self) -> dict:
        n = max(self.steps, 1)
        return {"loss": self.loss / n, "acc": self.acc / n,
                "img_per_s": self.steps / self.time if self.time else 0.0,
                "data_wait_frac": self.wait / self.time if self.time else 0.0}


def header() -> str:
    return "  ".join(f"{title:>{width}}" for title, width in _COLUMNS)


def row(epoch: float, step: int, figures: dict, val: dict | None = None) -> str:
    """One row of the table: ``figures`` (loss, acc, img_per_s, data_wait_frac), and the
    validation pass ``val`` (loss, acc) of that step, if any."""
    vl, va = (f"{val['loss']:.4f}", f"{100 * val['acc']:.2f}%") if val else ("", "")
    cells = (f"{epoch:.2f}", str(step), f"{figures['loss']:.4f}", f"{100 * figures['acc']:.2f}%", vl, va,
             f"{figures['img_per_s']:,.0f}", f"{100 * figures['data_wait_frac']:.1f}%")
    return "  ".join(f"{c:>{w}}" for c, (_, w) in zip(cells, _COLUMNS)).rstrip()


def eval_line(step: int, logs: dict) -> str:
    """An evaluation's own line (a test pass, or a validation pass between rows)."""
    return (f"{logs['split']:<5} step {step:>6}  loss {logs['loss']:.4f}  acc {100 * logs['acc']:6.2f}%  "
            f"({logs['n']:,} images, {logs['eval_s']:.2f} s)")


class ConsoleLogger:
    """The console's hook (``training.hooks``): rows, evaluation lines and messages on
    ``stream`` (stdout), the bar on ``bar_stream`` (stderr). ``quiet``: nothing at all."""

    def __init__(self, total_steps: int, stream: IO | None = None, quiet: bool = False,
                 bar_stream: IO | None = None, keep_every_s: float = KEEP_EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self.total = total_steps
        self._stream = stream
        self.tty = is_terminal(self.stream)
        self.quiet = quiet
        self.keep_every_s, self.clock = keep_every_s, clock
        self.progress = TrainProgress(total_steps, enabled=not quiet, stream=bar_stream)
        self.steps_per_epoch = total_steps
        self._pending = False  # an unterminated in-place row on the terminal
        self._rows = 0  # rows since the header
        self._last = 0  # the last logged step
        self._since = Span()  # the logged steps since the last row
        self._row_at: tuple[int, float] | None = None  # (step, epoch) of a row waiting for its evaluations
        self._held: list[dict] = []  # evaluations of that step, shown with its row
        self._kept_at = clock()

    # --- output ---------------------------------------------------------------------------
    @property
    def stream(self) -> IO:
        """The stream given, else ``sys.stdout`` as it is when written to (the training loop
        guards it: ``checkpointing.StdoutGuard``)."""
        return self._stream or sys.stdout

    def _emit(self, text: str) -> None:
        """A line that stays (above the bar, over an in-place row)."""
        if self.quiet:
            return
        if self._pending:
            self.stream.write("\r\033[K")
            self._pending = False
        write(text, self.stream)

    def _in_place(self, text: str) -> None:
        if self.quiet:
            return
        self.stream.write("\r\033[K" + text)
        self.stream.flush()
        self._pending = True

    def _table_row(self, text: str) -> None:
        if self._rows % HEADER_EVERY == 0:
            self._emit(header())
        self._rows += 1
        self._emit(text)
        self._kept_at = self.clock()

    def message(self, text: str) -> None:
        self._flush()  # (a row waiting for its evaluations shows first)
        self._emit(text)

    # --- hooks ----------------------------------------------------------------------------
    def on_train_start(self, logs: dict) -> None:
        self.total = logs.get("total_steps", self.total)
        self.steps_per_epoch = logs.get("steps_per_epoch") or self.total
        self._last = logs.get("start_step", 0)
        self._kept_at = self.clock()
        self.progress.on_train_start(logs)

    def on_step_end(self, step: int, logs: dict) -> None:
        self.progress.on_step_end(step, logs)
        if "loss" not in logs:  # not a logged step: nothing measured to show
            return
        self._flush()  # (a row still waiting: no evaluation came at its step)
        self._since.add(step - self._last, logs)
        self._last = step
        epoch = logs.get("epoch", step / self.steps_per_epoch)
        if step % self.steps_per_epoch == 0 or step >= self.total:
            self._row_at = (step, epoch)  # its evaluations come next: the row waits for them
        elif not self.tty or self.clock() - self._kept_at >= self.keep_every_s:
            self._table_row(row(epoch, step, self._take()))
        elif not self.progress.showing:  # (a bar showing stands for the in-place row)
            if self._rows == 0:
                self._emit(header())
                self._rows = 1
            self._in_place(row(epoch, step, logs))

    def on_validation_end(self, step: int, logs: dict) -> None:
        if self._row_at is not None and self._row_at[0] == step:
            self._held.append(logs)
        else:
            self._emit(eval_line(step, logs))

    def on_epoch_end(self, logs: dict) -> None:
        self._flush()

    def on_train_end(self, logs: dict) -> None:
        self._flush()
        if self._since.steps:  # stopped after a logged step that was no row (a target, a callback)
            self._table_row(row(self._last / self.steps_per_epoch, self._last, self._take()))
        self.progress.on_train_end(logs)

    def _take(self) -> dict:
        figures, self._since = self._since.figures(), Span()
        return figures

    def _flush(self) -> None:
        """The waiting row, with the validation pass of its step; then its test pass."""
        if self._row_at is None:
            return
        (step, epoch), held = self._row_at, self._held
        self._row_at, self._held = None, []
        val = next((e for e in held if e["split"] == "val"), None)
        self._table_row(row(epoch, step, self._take(), val))
        for e in held:
            if e is not val:
                self._emit(eval_line(step, e))
