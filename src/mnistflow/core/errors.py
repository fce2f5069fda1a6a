"""The one error type users see.

Every malformed input ends as ``MnistflowError``; the CLI prints it as one line,
``mnistflow: error: <file>: <what is wrong>``, and exits with code 2.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path


class MnistflowError(Exception):
    """A user-facing error: bad input, bad settings, missing data. Never a bug."""

    def __init__(self, message: str, path: str | os.PathLike | None = None):
        self.path = None if path is None else str(path)
        self.detail = message
        super().__init__(f"{self.path}: {message}" if self.path else message)


def fail(path: str | os.PathLike | None, message: str) -> "NoReturn":  # noqa: F821
    """Raise ``MnistflowError`` for ``path``; a one-liner for the parsers."""
    raise MnistflowError(message, path)


def display(path: str | os.PathLike) -> str:
    """A path as the user would type it (relative when under the cwd)."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def import_optional(module: str, extra: str = "onnx"):
    """Import an optional dependency, or fail with one line telling what to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MnistflowError(f"this needs the optional package '{module.split('.')[0]}': "
                             f"pip install 'mnistflow[{extra}]'") from None
