"""Where mnistflow keeps its caches: ``$MNISTFLOW_HOME`` or ``~/.cache/mnistflow``.
"""
from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

from mnistflow.core.errors import MnistflowError


def home() -> Path:
    """mnistflow's cache root: ``$MNISTFLOW_HOME`` or ``~/.cache/mnistflow``. A
    ``$MNISTFLOW_HOME`` that can hold no cache (a file, or in a file system that holds no files,
    like ``/proc``) is one line naming it, before anything is read or written there."""
    given = os.environ.get("MNISTFLOW_HOME")
    if given:
        _check_home(given)
    return Path(given or Path.home() / ".cache" / "mnistflow")


@functools.lru_cache(maxsize=8)
def _check_home(given: str) -> None:
    p = Path(given)
    where = next((q for q in (p, *p.parents) if q.exists()), None)
    if where is None:
        return
    if not where.is_dir():
        raise MnistflowError("$MNISTFLOW_HOME is a file, not a folder: set it to a folder for mnistflow's "
                             "caches", where)
    try:
        empty_fs = shutil.disk_usage(where).total == 0
    except OSError:
        return
    if empty_fs:
        raise MnistflowError("$MNISTFLOW_HOME is on a file system that holds no files (like /proc): set it to "
                             "a folder for mnistflow's caches", where)
