"""The one error type users see.

Every malformed input ends as ``MnistflowError``; the CLI prints it as one line,
``mnistflow: error: <file>: <what is wrong>``, and exits with code 2.
"""
from __future__ import annotations

import errno
import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import NoReturn


class MnistflowError(Exception):
    """A user-facing error: bad input, bad settings, missing data. Never a bug."""

    def __init__(self, message: str, path: str | os.PathLike | None = None):
        self.path = None if path is None else str(path)
        self.detail = message
        super().__init__(f"{self.path}: {message}" if self.path else message)


def one_line(text: object) -> str:
    """``text`` as it may appear in the one error line: control characters (a newline in a file
    name, a terminal's escape codes) and undecodable bytes shown as Python escapes, so that the
    line stays one line and writes nothing but text to the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def fail(path: str | os.PathLike | None, message: str) -> NoReturn:
    """Raise ``MnistflowError`` for ``path``; a one-liner for the parsers."""
    raise MnistflowError(message, path)


def os_error(e: OSError, path: str | os.PathLike | None = None) -> MnistflowError:
    """``e`` as the one line users see: ``path`` (else the file the system named) and the
    system's reason, e.g. ``runs/x/model.safetensors: No space left on device``. A path of
    the wrong kind names the file that is in the way (``runs/x: is a file, not a directory``).
    """
    where = path if path is not None else (e.filename2 or e.filename)
    why = e.strerror or str(e) or type(e).__name__
    if where is not None and e.errno in (errno.EEXIST, errno.ENOTDIR):
        blocker = _non_directory(Path(os.fsdecode(where)))  # the file used as a directory
        if blocker is not None:
            where = blocker
            why = "is a file, not a directory" if blocker.is_file() else "is not a directory"
    elif e.errno == errno.EISDIR:
        why = "is a directory, not a file"
    return MnistflowError(why, where)


def _non_directory(path: Path) -> Path | None:
    """The first existing non-directory on the way from the root down to ``path``."""
    for p in (*reversed(path.parents), path):
        if os.path.lexists(p) and not p.is_dir():
            return p
    return None


def display(path: str | os.PathLike) -> str:
    """A path as the user would type it (relative when under the cwd)."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def import_optional(module: str, extra: str = "onnx") -> ModuleType:
    """Import an optional dependency, or fail with one line telling what to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MnistflowError(f"this needs the optional package '{module.split('.')[0]}': "
                             f"pip install 'mnistflow[{extra}]'") from None
