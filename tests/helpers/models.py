"""Models planted in the registry for one test, and removed after it."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator


@contextlib.contextmanager
def planted(name: str, factory: Callable) -> Iterator[str]:
    """Register ``factory`` as ``name`` for the duration of the block."""
    from mnistflow.models import registry

    registry.register_model(factory, name=name)
    try:
        yield name
    finally:
        registry._REGISTRY.pop(name, None)
