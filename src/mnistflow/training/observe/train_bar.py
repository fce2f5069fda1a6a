"""The training bar: steps done of the run's total, the rate, the ETA, the last loss and
accuracy, on stderr when it is a terminal (``core.progress``).

A hook (``training.hooks``). It moves at every ``on_step_end`` it gets, redrawn at most ten
times a second (tqdm's own clock: a step costs a comparison, never a device sync), and at
every logged step (logs holding "loss", numbers the loop has read), with its loss and accuracy.
``--quiet`` and ``--json`` (the run's config) turn it off; so does a stderr that is no terminal,
where the console's lines are the record.
"""
from __future__ import annotations

from typing import IO

from mnistflow.core.progress import progress


class TrainProgress:
    def __init__(self, total_steps: int, enabled: bool = True, stream: IO | None = None):
        self.total = total_steps
        self.enabled = enabled
        self.stream = stream
        self.bar = None

    @property
    def showing(self) -> bool:
        """Whether a bar is on the terminal (the console then leaves its in-place line out)."""
        return self.bar is not None and not self.bar.disable

    def on_train_start(self, logs: dict) -> None:
        cfg = logs.get("config") or {}
        on = self.enabled and not cfg.get("quiet") and not cfg.get("json")
        self.close()
        # start_step: where a resumed run starts (the rate and ETA count this run's steps only)
        self.bar = progress(logs.get("total_steps", self.total), "train", "step", on,
                            stream=self.stream, initial=logs.get("start_step", 0), mininterval=0.1)

    def on_step_end(self, step: int, logs: dict) -> None:
        if not self.showing:
            return
        self.bar.update(step - self.bar.n)  # (redrawn when a tenth of a second has passed)
        if "loss" in logs:  # a logged step: its numbers, shown now
            self.bar.set_postfix_str(f"loss {logs['loss']:.3f} acc {100 * logs['acc']:.1f}%")

    def on_train_end(self, logs: dict) -> None:
        self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
