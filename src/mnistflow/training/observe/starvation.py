"""Watch the input queue: warn once when waiting for data takes over 10% of step time."""
from __future__ import annotations

from collections import deque

from mnistflow.core.log import warn


class StarvationWatch:
    """Looks at the data-wait fraction of the last ``window`` log intervals.

    Only a loader fed through a queue can starve the model. With the resident loader the
    "wait" is batch assembly on the device itself (reported in every progress line, but no
    input pipeline to fix), so ``queued=False`` keeps the watch quiet.
    """

    def __init__(self, threshold: float = 0.10, window: int = 3, queued: bool = True):
        self.threshold, self.window, self.queued = threshold, window, queued
        self.recent: deque[float] = deque(maxlen=window)
        self.warned = False
        self.message = ""

    def on_step_end(self, step: int, logs: dict) -> None:
        if "data_wait_frac" not in logs:  # an unlogged step: nothing measured
            return
        self.recent.append(logs["data_wait_frac"])
        if not self.queued or self.warned or len(self.recent) < self.window:
            return
        frac = sum(self.recent) / len(self.recent)
        if frac > self.threshold:
            self.warned = True
            self.message = (
                f"input starvation: {100 * frac:.0f}% of step time waiting for data "
                f"over the last {self.window} log intervals (queue depth {logs['queue_depth']}, "
                f"{logs['img_per_s']:,.0f} img/s). Likely fixes: prepare records once ('mnistflow prep'), "
                "keep the data on the device (--resident yes), or raise the reader's prefetch.")
            warn(self.message)
