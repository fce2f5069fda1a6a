"""Warnings and notes for users: one line each on stderr, rank 0 only.
"""
from __future__ import annotations

import os
import sys


def warn(message: str) -> None:
    """One warning line on stderr (rank 0 only under torchrun: the others would repeat it)."""
    if int(os.environ.get("RANK", 0) or 0) == 0:
        sys.stderr.write(f"mnistflow: warning: {message}\n")
        sys.stderr.flush()
