"""What differs between the Python versions mnistflow supports (3.10+)."""
from __future__ import annotations

import sys
from types import ModuleType


def tomllib() -> ModuleType:
    """The standard library's TOML reader (3.11+), or the same reader as ``tomli`` before (a
    dependency on 3.10). Imported when used: ``train --help`` does not need it."""
    if sys.version_info >= (3, 11):
        import tomllib  # novermin  (guarded: vermin sees version guards at module level only)
    else:
        import tomli as tomllib
    return tomllib
