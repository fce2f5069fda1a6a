"""Environment variables that hold a number: read and checked in one place."""
from __future__ import annotations

import math
import os

from mnistflow.core.errors import MnistflowError


def env_seconds(name: str, *, say_unset: bool = False) -> float:
    """``$name`` as a finite number of seconds >= 0 (0 when unset or empty); anything else is
    one ``MnistflowError`` (``say_unset``: its message adds that unset is allowed too)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise MnistflowError(f"{name} must be a finite number of seconds >= 0{' (or unset)' if say_unset else ''}, "
                             f"got {raw[:40]!r}")
    return value
