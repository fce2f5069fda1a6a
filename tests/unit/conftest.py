"""The unit tier: synthetic data only, no subprocess, the whole tier in well under a minute.

These guards make the rule hold: a unit test that reaches for the real MNIST or starts a
process fails at once and says which tier it belongs to.
"""
from __future__ import annotations

import subprocess

import pytest


@pytest.fixture(scope="session")
def mnist_dir():
    pytest.fail("unit tests use synthetic data (synthetic_records); real MNIST is for tests/integration")


@pytest.fixture(autouse=True)
def _no_real_data(monkeypatch, tmp_path_factory):
    """$MNISTFLOW_DATA (the real MNIST in CI) points at an empty folder: a unit test that trains
    without ``data=`` fails instead of quietly reading MNIST."""
    monkeypatch.setenv("MNISTFLOW_DATA", str(tmp_path_factory.mktemp("no-real-data")))


@pytest.fixture(autouse=True)
def _no_subprocess(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("unit tests start no process: move this test to tests/integration")

    monkeypatch.setattr(subprocess, "Popen", refuse)


@pytest.fixture(autouse=True)
def _pytorch_ops_only(monkeypatch):
    """Unit tests run on PyTorch's own ops: building the native kernels needs the C compiler (a
    process). The library cache is cleared on both sides so that a later integration test in
    the same session still builds and uses the kernels."""
    from mnistflow import kernels

    monkeypatch.setenv("MNISTFLOW_KERNELS", "0")
    kernels.library.cache_clear()
    yield
    monkeypatch.undo()
    kernels.library.cache_clear()
