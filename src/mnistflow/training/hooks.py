"""The hook protocol: what the training loop tells its observers and a user's callbacks.

A hook is any object; every method is optional (looked up by name, no base class). Each event
comes with the same three keywords, and a method takes those it names (keyword arguments are
filtered by signature, as Lightning Fabric's ``call`` does):

    step    the optimizer steps done so far
    epoch   the epoch (0-based; for on_epoch_end, the one that ended)
    logs    a dict, by event:
        on_train_start      total_steps, start_step, steps_per_epoch, run_dir, config (a dict)
        on_step_end         every step: epoch (a fraction) and lr; on a logged step (every
                            ``log_every``, and the last step of an epoch or run) also the measured
                            scalars of the interval: loss, acc, img_per_s, data_wait_frac,
                            queue_depth, ... ("loss" in logs tells a logged step). The numbers are
                            read from the device once per log interval: a hook costs no sync
        on_validation_end   split ("val", or "test" for a test pass), acc, loss, n, eval_s, and
                            the same as <split>_acc / <split>_loss
        on_epoch_end        epoch (the one that ended), step, the epoch's training loss and acc,
                            and val_loss / val_acc when the epoch ended with a validation pass
        on_train_end        the run's summary

So ``def on_epoch_end(self, epoch, logs)`` and ``def on_step_end(self, step, logs)`` both work.

A method may RETURN a dict of scalars ``{name: number}``: the loop logs them at that step
(metrics.jsonl and TensorBoard, under those names, no prefix), and the hooks called after it
see them in ``logs``. A name the run logs itself (``RESERVED``: step, loss, lr...) or one
already in the event's logs is refused: a hook adds figures, it never replaces the run's. A hook stops training by raising ``StopTraining("reason")``: the other
hooks still get this event, then the run ends at that point like any other (final test
evaluation, model saved) with ``summary["stop_reason"] = "reason"``.

A callback's ``close()``, if it has one, is called as the run ends however it ends (a failure
too; ``sys.exc_info()`` tells one), after its last event: a file or a tracker's run to end.

The loop's own observers (console, metrics file, TensorBoard, memory and input watches,
finalize guard) are hooks too; a user's callbacks come after the observers that print, before
the two that write files (so a returned scalar lands in the same record).
"""
from __future__ import annotations

import inspect
import math
from numbers import Real
from typing import Callable, Iterable

from mnistflow.core.errors import MnistflowError

HOOKS = ("on_train_start", "on_step_end", "on_validation_end", "on_epoch_end", "on_train_end")
ARGS = ("step", "epoch", "logs")  # the keywords of every event
EPOCH_KEYS = ("epoch", "step", "loss", "acc", "val_loss", "val_acc")  # the loop's own on_epoch_end logs
# The names the loop writes in metrics.jsonl records (besides what an event's logs hold): a hook
# that returned one would overwrite the run's own figures (a "step" or "loss" of its choosing)
RESERVED = ("kind", "step", "epoch", "split", "loss", "acc", "lr", "img_per_s", "data_wait_frac",
            "queue_depth", "n", "eval_s", "val_acc", "val_loss", "test_acc", "test_loss")


class StopTraining(Exception):
    """Raised by a hook to end training cleanly; ``reason`` becomes ``summary["stop_reason"]``."""

    def __init__(self, reason: str = "stopped by a callback"):
        super().__init__(reason)
        self.reason = str(reason) or "stopped by a callback"


def _scalars(hook: object, name: str, out: object, logs: dict) -> dict:
    """A hook's return value as {name: number}; anything else is the hook's bug, named: so is
    a name the run writes itself (``RESERVED``) or one the event's logs hold already (a hook
    adds figures; it never replaces the run's own, nor another hook's)."""
    if not isinstance(out, dict):
        raise MnistflowError(f"{type(hook).__name__}.{name} returned a {type(out).__name__}; a hook "
                             "returns None or a dict of scalars {name: number}")
    bad = [k for k, v in out.items()
           if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, Real)]
    if bad:
        raise MnistflowError(f"{type(hook).__name__}.{name} returned {bad[0]!r}: {out[bad[0]]!r}; "
                             "the values a hook returns must be numbers, under string names")
    taken = [k for k in out if k in RESERVED or k in logs]
    if taken:
        raise MnistflowError(f"{type(hook).__name__}.{name} returned {taken[0]!r}, a name the run "
                             "logs itself; a hook adds figures under names of its own (e.g. "
                             f"'my_{taken[0]}')")
    return {k: float(v) if not isinstance(v, int) and math.isfinite(v) else v for k, v in out.items()}


def accepted(hook: object, fn: Callable) -> tuple[str, ...] | None:
    """The keywords of ``ARGS`` that hook method ``fn`` takes (None: all, it has ``**kwargs``).
    A parameter it requires that no event passes is an error naming the method."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: give it all
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    unknown = [p.name for p in params if p.name not in ARGS and p.default is p.empty
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if unknown:
        raise MnistflowError(f"{type(hook).__name__}.{fn.__name__} takes {', '.join(unknown)}; a hook "
                             f"method takes any of {', '.join(ARGS)} (by name)")
    return tuple(p.name for p in params if p.name in ARGS)


class Hooks:
    """The run's hooks in order, each method called with the keywords it takes."""

    def __init__(self, hooks: Iterable) -> None:
        self.calls: dict[str, list[tuple[object, Callable, tuple[str, ...] | None]]] = {
            name: [(h, fn, accepted(h, fn)) for h in hooks if callable(fn := getattr(h, name, None))]
            for name in HOOKS}

    def call(self, name: str, *, step: int, epoch: int, logs: dict) -> str | None:
        """Call ``name`` on every hook that has it, in order. The scalars a hook returns are
        merged into ``logs`` for the hooks after it. Returns the reason of the first
        ``StopTraining`` raised (after every hook was called), else None. Any other exception
        propagates at once."""
        given = {"step": step, "epoch": epoch, "logs": logs}
        stop = None
        for hook, fn, names in self.calls[name]:
            try:
                out = fn(**(given if names is None else {k: given[k] for k in names}))
            except StopTraining as e:
                stop = stop or e.reason
                continue
            if out is not None:
                logs.update(_scalars(hook, name, out, logs))
        return stop
