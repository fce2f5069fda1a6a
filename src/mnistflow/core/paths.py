"""Where mnistflow keeps its caches: ``$MNISTFLOW_HOME`` or ``~/.cache/mnistflow``.
"""
from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """mnistflow's cache root: ``$MNISTFLOW_HOME`` or ``~/.cache/mnistflow``."""
    return Path(os.environ.get("MNISTFLOW_HOME") or Path.home() / ".cache" / "mnistflow")
