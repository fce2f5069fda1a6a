"""A time limit for a call that may block forever (opening a FIFO waits for a writer)."""
from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def deadline(seconds: int = 5) -> Iterator[None]:
    """A read that blocks (a FIFO) fails the test after ``seconds`` instead of hanging it."""
    def boom(*_):
        raise AssertionError(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
