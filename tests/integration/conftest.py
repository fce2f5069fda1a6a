"""Fixtures the integration tests share: models trained once on the real MNIST."""
from __future__ import annotations

import pytest


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
