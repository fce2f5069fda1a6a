"""User callbacks: plain objects with optional methods, called by name during training.

    import mnistflow

    class BestSoFar:
        best = 0.0
        def on_validation_end(self, step, logs):
            if logs["split"] == "val":                  # (not the final pass over the test split)
                self.best = max(self.best, logs["val_acc"])
                return {"best_val_acc": self.best}      # logged to metrics.jsonl and TensorBoard

    mnistflow.train("fast", callbacks=[BestSoFar(), mnistflow.EarlyStopping(patience=2),
                                       mnistflow.CSVLogger("runs/log.csv")])

A callback is any object with some of the hook methods of ``mnistflow.training.hooks`` (the
protocol, documented there): on_train_start, on_step_end (every step; the measured scalars on
logged steps), on_validation_end, on_epoch_end, on_train_end, each taking any of the keywords
step, epoch and logs. What a method returns, ``{name: number}``, is logged at that step;
raising ``StopTraining("reason")`` ends the run there (final test, model saved,
``summary["stop_reason"]`` = the reason).
"""
from __future__ import annotations

import csv
import difflib
import io
import math
import os
from pathlib import Path
from typing import Iterable, Sequence

from mnistflow.core.errors import MnistflowError, os_error
from mnistflow.core.fsutil import atomic_write_text, open_regular
from mnistflow.core.log import note, warn
from mnistflow.training.hooks import HOOKS, StopTraining, accepted

# Other frameworks' names, so a ported callback gets a hint instead of silence.
_ALIASES = {"on_batch_end": "on_step_end", "on_train_batch_end": "on_step_end",
            "on_validation_epoch_end": "on_validation_end", "on_test_end": "on_validation_end",
            "on_fit_start": "on_train_start", "on_fit_end": "on_train_end",
            "on_train_epoch_end": "on_epoch_end"}


def check_callbacks(callbacks: Iterable | None) -> list:
    """The callbacks as a list; an object with no hook method at all is an error (a typo would
    otherwise be silently ignored), and a method name that is almost a hook gets a warning."""
    if callbacks is None:
        return []
    if not isinstance(callbacks, Iterable) or isinstance(callbacks, (str, bytes)) \
            or any(hasattr(callbacks, h) for h in HOOKS):
        raise MnistflowError("callbacks must be a list of callback objects, e.g. "
                             "callbacks=[mnistflow.EarlyStopping()]")
    out = list(callbacks)
    for cb in out:
        name = type(cb).__name__
        if isinstance(cb, type):
            raise MnistflowError(f"callback {cb.__name__} is a class: pass an instance, {cb.__name__}()")
        others = [m for m in dir(cb) if m.startswith("on_") and m not in HOOKS and callable(getattr(cb, m, None))]
        for m in others:
            hint = _ALIASES.get(m) or next(iter(difflib.get_close_matches(m, HOOKS, 1)), None)
            if hint:
                warn(f"callback {name} has a method {m}, which mnistflow never calls; "
                     f"did you mean {hint}? (hooks: {', '.join(HOOKS)})")
        if not any(callable(getattr(cb, h, None)) for h in HOOKS):
            raise MnistflowError(f"callback {name} has none of the hook methods "
                                 f"({', '.join(HOOKS)})")
        for h in HOOKS:  # each method's parameters: a name no event passes is an error now
            if callable(fn := getattr(cb, h, None)):
                accepted(cb, fn)
    return out


class EarlyStopping:
    """Stop when a validation metric has not improved for ``patience`` validations in a row.

    ``monitor``: a key of the validation logs (``val_acc``, ``val_loss``, or a scalar another
    callback returned). ``mode``: ``max``, ``min``, or ``auto`` (``min`` for a name with
    "loss" in it, else ``max``). An improvement must exceed ``min_delta``. After training,
    ``best``, ``best_step`` and ``stopped_step`` (None when it did not stop the run) tell what
    happened; the run's ``stop_reason`` is ``early_stopping``.
    """

    def __init__(self, monitor: str = "val_acc", patience: int = 3, min_delta: float = 0.0,
                 mode: str = "auto"):
        if mode not in ("auto", "max", "min"):
            raise MnistflowError(f"EarlyStopping mode must be max, min or auto; got '{mode}'")
        if not isinstance(patience, int) or patience < 1:
            raise MnistflowError(f"EarlyStopping patience must be a positive integer; got {patience!r}")
        if min_delta < 0:
            raise MnistflowError(f"EarlyStopping min_delta must be 0 or more; got {min_delta}")
        self.monitor, self.patience, self.min_delta = monitor, patience, float(min_delta)
        self.mode = ("min" if "loss" in monitor else "max") if mode == "auto" else mode
        self.on_train_start({})

    def on_train_start(self, logs: dict) -> None:
        self.best: float | None = None
        self.best_step: int | None = None
        self.wait = 0
        self.stopped_step: int | None = None
        self._warned = False

    def _improved(self, value: float) -> bool:
        if self.best is None:
            return True
        if self.mode == "max":
            return value > self.best + self.min_delta
        return value < self.best - self.min_delta

    def on_validation_end(self, step: int, logs: dict) -> None:
        if self.monitor not in logs:
            if logs.get("split", "val") == "val" and not self._warned:  # a final test pass is not news
                self._warned = True
                keys = sorted(k for k, v in logs.items() if isinstance(v, (int, float)))
                warn(f"EarlyStopping monitors '{self.monitor}', which the validation logs do not "
                     f"have (they have: {', '.join(keys)}); it will not stop the run")
            return
        value = float(logs[self.monitor])
        if math.isnan(value):
            return
        if self._improved(value):
            self.best, self.best_step, self.wait = value, step, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            self.stopped_step = step
            note(f"early stopping at step {step}: {self.monitor} has not improved for "
                 f"{self.wait} validation(s) (best {self.best:.4g} at step {self.best_step})")
            raise StopTraining("early_stopping")


class CSVLogger:
    """One CSV row per logged training step and per validation: ``kind`` (train, val, test),
    ``step``, then the scalars of the logs (the same numbers as ``metrics.jsonl``).

    The header is the union of the names seen so far, in order of appearance: a row is
    appended and flushed as one line; when a row brings a new name the whole file is rewritten
    atomically with the wider header. So the file is always complete, with one header.
    A previous log at ``path`` (a file that starts with the ``kind,step`` header) is replaced
    when training starts; any other file there is the user's, and training does not start.
    """

    FIRST = ("kind", "step")

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.columns: list[str] = list(self.FIRST)
        self.rows: list[dict] = []
        self._f = None

    def on_train_start(self, logs: dict) -> None:
        self._check_replaceable()
        self.columns, self.rows = list(self.FIRST), []
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._rewrite()

    def _check_replaceable(self) -> None:
        """Only a CSV log (or an empty file) at ``path`` may be replaced, never a user's file."""
        if not os.path.lexists(self.path):
            return
        header = ",".join(self.FIRST).encode()
        try:
            with open_regular(self.path, what="CSV log") as f:
                head = f.read(len(header))
        except MnistflowError as e:
            raise MnistflowError(f"CSVLogger: {e.detail}", self.path) from None
        if head not in (b"", header):
            raise MnistflowError("CSVLogger would replace this file, which is not a CSV log (its first "
                                 "line is not 'kind,step,...'): pick another path, or remove it", self.path)

    def on_step_end(self, step: int, logs: dict) -> None:
        if "loss" in logs:  # logged steps (the measured scalars) only
            self._add("train", step, logs)

    def on_validation_end(self, step: int, logs: dict) -> None:
        self._add(str(logs.get("split", "val")), step, logs)

    def on_train_end(self, logs: dict) -> None:
        self.close()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def _add(self, kind: str, step: int, logs: dict) -> None:
        row = {"kind": kind, "step": step}
        row.update((k, v) for k, v in logs.items()
                   if k not in row and k != "split" and isinstance(v, (int, float, bool)))
        self.rows.append(row)
        new = [k for k in row if k not in self.columns]
        if new or self._f is None:
            self.columns += new
            self._rewrite()
        else:
            try:
                self._f.write(self._lines([row]))
                self._f.flush()
            except OSError as e:  # a full disk: one line naming the file
                raise os_error(e, self.path) from e

    def _lines(self, rows: Sequence[dict], header: bool = False) -> str:
        buf = io.StringIO()
        w = csv.DictWriter(buf, self.columns, lineterminator="\n")
        if header:
            w.writeheader()
        w.writerows(rows)
        return buf.getvalue()

    def _rewrite(self) -> None:
        self.close()
        atomic_write_text(self.path, self._lines(self.rows, header=True))
        try:
            self._f = open(self.path, "a", buffering=1)
        except OSError as e:
            raise os_error(e, self.path) from e


def read_csv_log(path: str | os.PathLike) -> list[dict]:
    """The rows of a ``CSVLogger`` file, numbers as numbers (an empty cell is left out)."""
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            rec: dict = {}
            for k, v in row.items():
                if v == "":
                    continue
                if k == "kind":
                    rec[k] = v
                elif v in ("True", "False"):
                    rec[k] = v == "True"
                else:
                    try:
                        rec[k] = int(v)
                    except ValueError:
                        rec[k] = float(v)
            out.append(rec)
    return out
