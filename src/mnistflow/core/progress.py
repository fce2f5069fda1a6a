"""Progress bars for the long operations (prep, download, train, export, report): the one owner.

    with progress(len(files), "prep", "file") as bar:
        for f in files:
            ...
            bar.update()

A bar (tqdm) shows the count, the rate and an ETA on stderr, and only when stderr is a
terminal: in logs, pipes and CI nothing extra is written (each operation's own lines are the
record). A bar never outgrows its terminal: its width is the terminal's, read again at each
refresh (``COLUMNS``, else 80, where the stream is no real terminal), and a line is cut to
it. ``quiet()`` (the CLI's ``--quiet`` / ``--json``) turns every bar off. A line printed
while a bar shows goes through :func:`write` so that it lands above the bar, not through it
(``core.log`` does that for warnings and notes).
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

_quiet = [0]  # depth of open quiet() blocks
_METER = 56  # columns beside the description: " 45%|" + 10 of bar + "| 9.9M/9.9M [01:02<03:04, 5.1MB/s"


def is_terminal(stream: IO | None) -> bool:
    """Whether ``stream`` is an interactive terminal."""
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or closed
        return False


def columns(stream: IO | None = None) -> int:
    """The width of the terminal behind ``stream`` (stderr by default); ``COLUMNS``, else 80,
    when it has none."""
    try:
        return max(os.get_terminal_size((stream or sys.stderr).fileno()).columns, 1)
    except (AttributeError, ValueError, OSError, TypeError):  # io.StringIO & co: no descriptor
        pass
    env = os.environ.get("COLUMNS", "")
    return int(env) if env.isdigit() and int(env) > 0 else 80


def is_quiet() -> bool:
    """Whether a ``quiet()`` block is open (``--quiet`` / ``--json``): no bar, no progress lines."""
    return bool(_quiet[0])


@contextlib.contextmanager
def quiet(on: bool = True) -> Iterator[None]:
    """No progress bar inside the block (``--quiet``, ``--json``)."""
    _quiet[0] += bool(on)
    try:
        yield
    finally:
        _quiet[0] -= bool(on)


@functools.cache
def _bar_class() -> type:
    from tqdm import tqdm

    class Bar(tqdm):
        """tqdm with its width taken from ``columns`` on every refresh (tqdm's own
        ``dynamic_ncols`` reads only a real terminal's descriptor, and gives no width for a
        stream without one), no padding past it, and no monitor thread (a bar refreshes when
        it is updated)."""

        monitor_interval = 0

        @staticmethod
        def status_printer(file: IO) -> Callable[[str], None]:
            """Each refresh rewrites the line and clears the rest of it (tqdm pads with spaces to
            the last line's length, which wraps once the terminal got narrower)."""
            def print_status(s: str) -> None:
                file.write("\r" + s + "\x1b[K")
                getattr(file, "flush", lambda: None)()

            return print_status

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if not self.disable:
                self.dynamic_ncols = lambda fp: (columns(fp), None)

        @property
        def format_dict(self) -> dict:
            """A long description is cut so that the count, the times and the rate (and a
            bit of bar) still fit: tqdm cuts a line from its right end."""
            d = super().format_dict
            room = max((d.get("ncols") or 80) - _METER, 8)
            if d.get("prefix") and len(d["prefix"]) > room:
                d["prefix"] = d["prefix"][:room - 1] + "~"
            return d

    return Bar


def progress(total: float | None, desc: str, unit: str = "it", enabled: bool = True, *,
             stream: IO | None = None, initial: float = 0, unit_scale: bool = False,
             leave: bool = False, mininterval: float = 0.2, delay: float = 0) -> Any:
    """A progress bar (a ``tqdm``: ``update(n)``, ``set_postfix_str``, ``close``, a context
    manager) of ``total`` ``unit``s on ``stream`` (stderr). Disabled, writing nothing, when
    ``enabled`` is false, inside :func:`quiet`, or when the stream is not a terminal.
    ``leave=False``: the bar is erased when closed (the operation's result line follows);
    ``mininterval``: the fewest seconds between two redraws (0 for rare updates: each shows);
    ``delay``: seconds before the bar first shows (an operation that ends sooner shows none)."""
    stream = sys.stderr if stream is None else stream
    on = enabled and not _quiet[0] and is_terminal(stream)
    return _bar_class()(total=total, desc=desc, unit=unit, file=stream, disable=not on,
                        initial=initial, unit_scale=unit_scale, leave=leave, ncols=columns(stream),
                        dynamic_ncols=False, mininterval=mininterval,
                        miniters=1 if mininterval == 0 else None, smoothing=0.3, delay=delay)


@contextlib.contextmanager
def stages(names: Sequence[str], desc: str, enabled: bool = True, *,
           stream: IO | None = None) -> Iterator[Callable[[str], None]]:
    """A bar over the named stages of one operation (export: convert, verify, write):
    ``stage(name)`` marks the stage before done and shows ``name``; erased at the end."""
    with progress(len(names), desc, "step", enabled, stream=stream) as bar:
        started = [False]

        def stage(name: str) -> None:
            if started[0]:
                bar.update()
            started[0] = True
            bar.set_postfix_str(name)

        yield stage


def write(text: str, stream: IO | None = None) -> None:
    """Print ``text`` as a line on ``stream`` (stdout by default), above any bar showing; on a
    terminal, wrapped at words to its width (:func:`fit`)."""
    stream = sys.stdout if stream is None else stream
    with above_bars(stream):
        stream.write(fit(text, stream) + "\n")
        stream.flush()


def fit(text: str, stream: IO | None) -> str:
    """``text`` as it should show on ``stream``: on a terminal, each line longer than the
    terminal is wrapped at spaces, its continuation indented by 2 (a terminal would cut it
    mid-word); a single word longer than a line (a path) is not cut. Elsewhere (logs, pipes)
    unchanged: one line stays one line, for grep."""
    if not is_terminal(stream):
        return text
    width = columns(stream)
    if all(len(line) <= width for line in text.split("\n")):
        return text
    import textwrap

    return "\n".join(textwrap.fill(line, width, subsequent_indent="  ", break_long_words=False,
                                   break_on_hyphens=False) if len(line) > width else line
                     for line in text.split("\n"))


def above_bars(stream: IO) -> contextlib.AbstractContextManager:
    """Around a write to ``stream``: clear the bars showing, redraw them after (a no-op while
    no bar shows: none exists, or each is still in its ``delay``)."""
    tqdm = sys.modules.get("tqdm")  # a bar exists only once tqdm is imported
    if tqdm is None or not any(_shown(bar) for bar in getattr(tqdm.tqdm, "_instances", ())):
        return contextlib.nullcontext()
    return tqdm.tqdm.external_write_mode(file=stream)


def _shown(bar: Any) -> bool:
    """Whether ``bar`` has been drawn (tqdm draws a delayed bar first after its ``delay``)."""
    return getattr(bar, "last_print_t", 0) >= getattr(bar, "start_t", 0) + getattr(bar, "delay", 0)


def close_all() -> None:
    """Close (erase) every bar still showing: before an error line, say, after an operation
    stopped by an exception left its bar behind."""
    tqdm = sys.modules.get("tqdm")
    if tqdm is not None:
        for bar in list(getattr(tqdm.tqdm, "_instances", ())):
            bar.close()
