"""The public API: every name resolves to the function or class, even after its module is imported."""
from __future__ import annotations

import importlib

import mnistflow


def test_api_names_are_not_shadowed_by_submodules():
    for name, (mod, _) in mnistflow._API.items():
        importlib.import_module(mod)  # importing a submodule binds its name on the package
    for name in mnistflow._API:
        obj = getattr(mnistflow, name)
        assert callable(obj) and not isinstance(obj, type(mnistflow)), name
