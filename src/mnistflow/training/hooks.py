"""The hook protocol: what the training loop tells its observers and a user's callbacks.

A hook is any object; every method is optional (looked up by name, no base class):

    on_train_start(logs)           logs: total_steps, start_step, steps_per_epoch, run_dir, config (a dict)
    on_step_end(step, logs)        logs: the logged scalars of that step (loss, acc, lr, img_per_s,
                                   data_wait_frac, queue_depth, epoch, ...). Called on LOGGED steps
                                   only (every ``log_every``, and the last step of an epoch or run):
                                   the numbers are read from the device once per log interval, so
                                   a hook costs no device sync per step
    on_validation_end(step, logs)  logs: split ("val", or "test" for a test pass), acc, loss, n,
                                   eval_s, and the same as <split>_acc / <split>_loss
    on_epoch_end(epoch, logs)      logs: epoch (the one that ended), step
    on_train_end(logs)             logs: the run's summary

A method may RETURN a dict of scalars ``{name: number}``: the loop logs them at that step
(metrics.jsonl and TensorBoard, under those names, no prefix), and the hooks called after it
see them in ``logs``. A hook stops training by raising ``StopTraining("reason")``: the other
hooks still get this event, then the run ends at that point like any other (final test
evaluation, model saved) with ``summary["stop_reason"] = "reason"``.

The loop's own observers (console, metrics file, TensorBoard, memory and input watches,
profiler, finalize guard) are hooks too; a user's callbacks come after the observers that
print, before the two that write files (so a returned scalar lands in the same record).
"""
from __future__ import annotations

import math
from numbers import Real
from typing import Iterable

from mnistflow.core.errors import MnistflowError

HOOKS = ("on_train_start", "on_step_end", "on_validation_end", "on_epoch_end", "on_train_end")


class StopTraining(Exception):
    """Raised by a hook to end training cleanly; ``reason`` becomes ``summary["stop_reason"]``."""

    def __init__(self, reason: str = "stopped by a callback"):
        super().__init__(reason)
        self.reason = str(reason) or "stopped by a callback"


def _scalars(hook: object, name: str, out: object) -> dict:
    """A hook's return value as {name: number}; anything else is the hook's bug, named."""
    if not isinstance(out, dict):
        raise MnistflowError(f"{type(hook).__name__}.{name} returned a {type(out).__name__}; a hook "
                             "returns None or a dict of scalars {name: number}")
    bad = [k for k, v in out.items()
           if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, Real)]
    if bad:
        raise MnistflowError(f"{type(hook).__name__}.{name} returned {bad[0]!r}: {out[bad[0]]!r}; "
                             "the values a hook returns must be numbers, under string names")
    return {k: float(v) if not isinstance(v, int) and math.isfinite(v) else v for k, v in out.items()}


def call(hooks: Iterable, name: str, *args) -> str | None:
    """Call ``hook.<name>(*args)`` on every hook that has it, in order.

    The scalars a hook returns are merged into ``logs`` (the last argument) for the hooks after
    it. Returns the reason of the first ``StopTraining`` raised (after every hook was called),
    else None. Any other exception propagates at once.
    """
    logs = args[-1] if args and isinstance(args[-1], dict) else None
    stop = None
    for h in hooks:
        fn = getattr(h, name, None)
        if fn is None:
            continue
        try:
            out = fn(*args)
        except StopTraining as e:
            stop = stop or e.reason
            continue
        if out is not None and logs is not None:
            logs.update(_scalars(h, name, out))
    return stop
