"""Fixtures the integration tests share: the real MNIST, and models trained once on it."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _real_mnist(mnist_dir):
    """The real MNIST is in place before any integration test runs: a command that reads
    ``$MNISTFLOW_DATA`` without asking for ``mnist_dir`` finds it too (in a plain clone it is
    downloaded here, once)."""
    return mnist_dir


@pytest.fixture(scope="session")
def serve_model(mnist_records, tmp_path_factory):
    """A run directory with a ``fast`` model trained for one epoch (~98.5% test accuracy),
    shared by every serve test (the JSON API and the browser)."""
    from mnistflow.training.api import train

    run = tmp_path_factory.mktemp("serve") / "run"
    s = train(recipe="fast", epochs=1, data=mnist_records, run_dir=run, quiet=True, threads=1,
              tensorboard=False)
    assert s["test_acc"] >= 0.975, s
    return run
