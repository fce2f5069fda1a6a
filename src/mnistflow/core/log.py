"""Warnings and notes for users, through :mod:`logging` (logger ``mnistflow``).

Every warning or note mnistflow prints goes through :func:`warn` or :func:`note`, so:

* the CLI shows each as one line on stderr (``mnistflow: warning: <what>``), wrapped at words
  on a terminal (``core.progress.fit``);
* a library user's own logging configuration controls them (``logging.getLogger("mnistflow")``),
  and ``quiet=True`` silences them (:func:`quiet`);
* under torchrun only rank 0 emits them (the other ranks would repeat every line);
* a run records every warning it emitted (:func:`recording`) in its ``summary.json``;
* a line never runs through a progress bar (``core.progress``): it is printed above it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Iterator, TextIO

from mnistflow.core.progress import above_bars, fit

LOGGER = logging.getLogger("mnistflow")
_records: list[list[str]] = []  # a stack: one list per open ``recording()``


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", 0) or 0)
    except ValueError:
        return 0


class _Line(logging.Formatter):
    """``mnistflow: warning: <what>`` / ``mnistflow: note: <what>``: the CLI's one-line form."""

    def format(self, record: logging.LogRecord) -> str:
        kind = "warning" if record.levelno >= logging.WARNING else "note"
        return f"mnistflow: {kind}: {record.getMessage()}"


class _Stderr(logging.StreamHandler):
    """Writes to the *current* ``sys.stderr`` (tests and the CLI swap it), one line each."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(_Line())

    @property
    def stream(self) -> TextIO:  # noqa: D401 - a property so that a swapped sys.stderr is honoured
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass

    def format(self, record: logging.LogRecord) -> str:
        return fit(super().format(record), self.stream)  # wrapped at words on a terminal

    def emit(self, record: logging.LogRecord) -> None:
        with above_bars(self.stream):  # a progress bar showing: the line goes above it
            super().emit(record)


class _RankZero(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _rank() == 0


def _setup() -> None:
    if getattr(LOGGER, "_mnistflow_ready", False):
        return
    LOGGER.setLevel(logging.INFO)
    LOGGER.addFilter(_RankZero())
    # Our own handler, unless the user configured one: then their handlers decide.
    LOGGER.addHandler(_Stderr())
    LOGGER.propagate = False
    LOGGER._mnistflow_ready = True  # type: ignore[attr-defined]


_setup()


def warn(message: str) -> None:
    """A warning the user should act on or know about (one line). Recorded first, so that a run's
    summary holds it whatever the logging configuration or the rank."""
    for got in _records:  # every open recording: a run inside a caller's own recording
        got.append(message)
    LOGGER.warning(message)


def note(message: str) -> None:
    """Information that explains what mnistflow did (one line)."""
    LOGGER.info(message)


@contextlib.contextmanager
def quiet(on: bool = True) -> Iterator[None]:
    """Silence mnistflow's warnings and notes on stderr inside the block (still recorded)."""
    if not on:
        yield
        return
    handlers = [h for h in LOGGER.handlers if isinstance(h, _Stderr)]
    for h in handlers:
        h.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for h in handlers:
            h.setLevel(logging.NOTSET)


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    """Collect the warnings emitted inside the block (for a run's ``summary.json``)."""
    got: list[str] = []
    _records.append(got)
    try:
        yield got
    finally:
        # by identity: list.remove compares by value, and two recordings that hold the same
        # warnings are equal, so it could take another one's list off the stack
        _records[:] = [r for r in _records if r is not got]
