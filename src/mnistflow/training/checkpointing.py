"""When a run saves a checkpoint (the training policy; the file format and rotation live in
``mnistflow.artifacts.checkpoint``)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from mnistflow.artifacts.checkpoint import CheckpointDir


@dataclass
class Interrupt:
    """Set by the SIGINT/SIGTERM handlers; the loop saves and stops at the next step end."""

    signum: int = 0


@dataclass
class Checkpointer:
    """Hook: save every ``every`` steps and/or ``secs`` seconds, after a new best evaluation,
    and when interrupted. ``payload(state)`` builds the payload (the trainer knows its objects).

    Steps that end an epoch are saved by ``on_epoch_end`` (after the epoch's evaluation and
    bookkeeping), the last step by the trainer's final save, so every checkpoint is a point
    where the loop can continue as if it had never stopped.
    """

    ckpts: CheckpointDir
    payload: Callable[[object], dict]
    steps_per_epoch: int
    every: int | None = None
    secs: float | None = None
    metric_split: str = "val"
    interrupt: Interrupt = field(default_factory=Interrupt)
    last_path: Path | None = None
    _eval: tuple[int, float] | None = None
    _t_last: float = field(default_factory=time.monotonic)
    _saved_step: int = -1
    save_s: float = 0.0  # seconds spent writing checkpoints (kept out of training throughput)

    def on_eval(self, step: int, logs: dict) -> None:
        if logs.get("split") == self.metric_split:
            self._eval = (step, float(logs["acc"]))

    def _metric(self, step: int) -> dict | None:
        if self._eval is not None and self._eval[0] == step:
            return {"name": f"{self.metric_split}_acc", "value": self._eval[1], "step": step}
        return None

    def _due(self, step: int) -> str:
        if self.interrupt.signum:
            return "interrupt"
        if self.every and step % self.every == 0:
            return "every"
        if self.secs and time.monotonic() - self._t_last >= self.secs:
            return "secs"
        m = self._metric(step)
        if m is not None and (self.ckpts.best_value is None or m["value"] > self.ckpts.best_value):
            return "best"
        return ""

    def on_step_end(self, step: int, state) -> None:
        if state.step >= state.total_steps or state.step_in_epoch >= self.steps_per_epoch:
            return  # saved by the final save / on_epoch_end
        self._maybe_save(state)

    def on_epoch_end(self, state) -> None:
        if state.step < state.total_steps:
            self._maybe_save(state)

    def _maybe_save(self, state) -> None:
        reason = self._due(state.step)
        if reason and state.step != self._saved_step:
            self.save(state, reason)
        if self.interrupt.signum:
            state.stop, state.stop_reason = True, "interrupted"

    def save(self, state, reason: str = "final") -> Path:
        t0 = time.perf_counter()
        self.last_path = self.ckpts.save(state.step, self.payload(state), self._metric(state.step),
                                         reason)
        self.save_s += time.perf_counter() - t0
        self._saved_step = state.step
        self._t_last = time.monotonic()
        return self.last_path
