"""Saving checkpoints during training, and being interrupted: the mechanics.

WHEN to save (every N steps or seconds, a new best, a signal) is decided in
``training.loop``; the file format and rotation live in ``mnistflow.artifacts.checkpoint``.
SIGINT/SIGTERM set a flag that the loop acts on at the end of the step (save, then stop with
:class:`TrainingInterrupted`, exit 128 + signal); a second signal stops at once. Standard
output closing under the run (``train ... | head``: the reader left) is taken as SIGPIPE, the
same way: a checkpoint, one line on stderr, exit 141.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from mnistflow.artifacts.checkpoint import CheckpointDir
from mnistflow.core.errors import display
from mnistflow.runtime import dist


@dataclass
class Interrupt:
    """Set by the SIGINT/SIGTERM handlers; the loop saves and stops at the next step end."""

    signum: int = 0


class SignalHandlers:
    """SIGINT/SIGTERM set ``interrupt.signum``; a second signal stops at once. Installed only in
    the main thread, restored on exit."""

    def __init__(self, interrupt: Interrupt, quiet: bool = False):
        self.interrupt = interrupt
        self.quiet = quiet
        self.old: dict = {}

    def _handle(self, signum, frame):
        if self.interrupt.signum:
            raise KeyboardInterrupt
        self.interrupt.signum = signum
        if not self.quiet:  # not a warning: said at once, from inside a signal handler
            sys.stderr.write(f"mnistflow: {signal.Signals(signum).name}: saving a checkpoint at the end "
                             "of this step, then stopping (again to stop at once)\n")
            sys.stderr.flush()

    def _stdout_closed(self) -> None:
        """The reader of standard output left: stop as for a signal (no note: the final line
        says it), unless a signal came first."""
        if not self.interrupt.signum:
            self.interrupt.signum = signal.SIGPIPE

    def _parent_died(self, signum, frame):
        """torchrun's agent died (``dist.die_with_parent``): as SIGTERM, but never "again" (the
        signal may come once per thread of the dying agent)."""
        self.old[signum] = signal.SIG_IGN  # the later ones, after the training loop too
        if self.interrupt.signum:
            return
        self.interrupt.signum = signal.SIGTERM
        if not self.quiet:
            sys.stderr.write("mnistflow: the torchrun agent that started this process is gone: saving a "
                             "checkpoint at the end of this step, then stopping\n")
            sys.stderr.flush()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.old[sig] = signal.signal(sig, self._handle)
            if sys.stdout is not None:
                self.stdout = sys.stdout
                sys.stdout = StdoutGuard(sys.stdout, self._stdout_closed)
            if dist.PARENT_DEATH_SIGNAL is not None:
                self.old[dist.PARENT_DEATH_SIGNAL] = signal.signal(dist.PARENT_DEATH_SIGNAL, self._parent_died)
        return self

    def __exit__(self, *exc):
        for sig, h in self.old.items():
            signal.signal(sig, h)
        if isinstance(sys.stdout, StdoutGuard) and getattr(self, "stdout", None) is not None:
            sys.stdout = self.stdout


class StdoutGuard:
    """``sys.stdout`` while a run trains: a write to a pipe whose reader left is a stop request
    (``closed()``), not a BrokenPipeError in the middle of a step; what is written after goes
    to /dev/null. Everything else is the stream's own."""

    def __init__(self, stream, closed: Callable[[], None]):
        self.stream, self.closed = stream, closed

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._gone()

    def _gone(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self.stream.fileno())
            os.close(null)
        self.closed()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


class Signals:
    """SIGINT/SIGTERM during training, as the loop reads them: :meth:`signalled` is the signal
    every rank agrees on (under torchrun, a signal to any rank stops all of them at the same
    step). ``catch=False`` (checkpoints off: nothing to save) leaves the default handlers."""

    def __init__(self, info: dist.DistInfo, catch: bool, quiet: bool = False):
        self.local = Interrupt()  # set by this process's handlers
        self.agreed = 0  # the signal the run stops for, once one arrived
        self.distributed = catch and info.enabled
        self.handlers = SignalHandlers(self.local, quiet=quiet) if catch else None

    def __enter__(self) -> "Signals":
        if self.handlers is not None:
            self.handlers.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.handlers is not None:
            self.handlers.__exit__(*exc)

    def agree(self, due: str = "", saved: bool = False) -> tuple[int, str]:
        """(the signal to stop for or 0, why every rank takes part in a checkpoint here or "").
        Rank 0's ``due`` (a reason of ``REASONS``) and ``saved`` (this step is saved already),
        and any rank's signal (a checkpoint then, "interrupt", unless saved), agreed by every
        rank in one tiny collective under torchrun: every rank calls it at the same points."""
        mine = [self.local.signum, REASONS.index(due), int(saved)]
        signum, wish, done = dist.max_over_ranks(mine) if self.distributed else mine
        if signum and not self.agreed:
            self.agreed = signum
        if self.agreed:
            return self.agreed, "" if done else "interrupt"
        return 0, REASONS[wish]


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM (or standard output closing: SIGPIPE) during training: a checkpoint was
    saved; exit code 128 + signal."""

    def __init__(self, signum: int, step: int, path: Path | None, run_dir: Path, rank: int = 0,
                 world_size: int = 1):
        self.signum, self.step, self.path, self.run_dir = signum, step, path, run_dir
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        if signum == signal.SIGPIPE:
            name += " (standard output closed: its reader left)"
        if rank:
            super().__init__(f"rank {rank}: interrupted by {name} at step {step}; rank 0 saved the checkpoint")
            return
        saved = f"checkpoint saved: {display(path)}" if path else "no checkpoint (checkpoints are off)"
        again = f"mnistflow train --resume --run-dir {display(run_dir)}"
        if world_size > 1:
            again += f" --nproc {world_size} (or the same under torchrun)"
        super().__init__(f"interrupted by {name} at step {step}; {saved}; continue with: {again}")


REASONS = ("", "best", "secs", "every", "interrupt")  # why a checkpoint is saved at a point


@dataclass
class Saver:
    """Writes checkpoints into ``ckpts`` (rank 0); remembers what the save rules ask about:
    the last evaluation on ``metric_split``, the time and step of the last save."""

    ckpts: CheckpointDir
    payload: Callable[[list | None], dict]  # everything to resume from, at this moment
    metric_split: str = "val"
    last_path: Path | None = None
    save_s: float = 0.0  # seconds spent writing checkpoints (kept out of training throughput)
    _eval: tuple[int, float] | None = None
    _t_last: float = field(default_factory=time.monotonic)
    _saved_step: int = -1

    def note_eval(self, step: int, split: str, acc: float) -> None:
        if split == self.metric_split:
            self._eval = (step, float(acc))

    def metric(self, step: int) -> dict | None:
        """The evaluation of this very step (the checkpoint's metric), if there was one."""
        if self._eval is not None and self._eval[0] == step:
            return {"name": f"{self.metric_split}_acc", "value": self._eval[1], "step": step}
        return None

    def is_new_best(self, step: int) -> bool:
        m = self.metric(step)
        return m is not None and (self.ckpts.best_value is None or m["value"] > self.ckpts.best_value)

    def seconds_since_save(self) -> float:
        return time.monotonic() - self._t_last

    def saved(self, step: int) -> bool:
        return step == self._saved_step

    def due(self, step: int, every: int | None, secs: float | None) -> str:
        """Why a checkpoint is due at ``step`` ("every", "secs", "best"), or "" (or saved already)."""
        if self.saved(step):
            return ""
        return ("every" if every and step % every == 0 else
                "secs" if secs and self.seconds_since_save() >= secs else
                "best" if self.is_new_best(step) else "")

    def save(self, step: int, reason: str, rank_rng: list | None = None) -> Path:
        """Write the checkpoint of ``step``; ``rank_rng``: every rank's RNG state (by rank)."""
        t0 = time.perf_counter()
        self.last_path = self.ckpts.save(step, self.payload(rank_rng), self.metric(step), reason)
        self.save_s += time.perf_counter() - t0
        self._saved_step = step
        self._t_last = time.monotonic()
        return self.last_path
