"""Shared fixtures. The integration tests use the REAL MNIST, found as ``helpers/realdata.py``
says (``$MNISTFLOW_DATA``, else ``../shared/data/mnist`` as in CI, else mnistflow's cache, else
a download); tiny synthetic data is made per test where a format needs it."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from helpers.realdata import MNIST_DIR, real_data


@pytest.fixture(scope="session", autouse=True)
def _isolated_home(tmp_path_factory):
    """Keep every test's cache out of the user's ~/.cache and single-threaded (2-core CI);
    ``$MNISTFLOW_DATA`` names the real MNIST's folder for every command the tests run, as in CI."""
    home = tmp_path_factory.mktemp("mnistflow_home")
    os.environ["MNISTFLOW_HOME"] = str(home)
    os.environ.setdefault("MNISTFLOW_THREADS", "1")
    os.environ.setdefault("MNISTFLOW_DATA", str(MNIST_DIR))
    yield home


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """The real MNIST's folder (its four .gz files), downloaded once if it is nowhere."""
    from mnistflow.data.known import KNOWN

    return real_data(KNOWN["mnist"])


@pytest.fixture(scope="session")
def mnist_records(mnist_dir, tmp_path_factory) -> Path:
    """Real MNIST prepared once for the whole session (55,000 / 5,000 / 10,000)."""
    from mnistflow.data.prepare import prepare

    return prepare("mnist", mnist_dir, tmp_path_factory.mktemp("rec") / "mnist", quiet=True)


@pytest.fixture(scope="session")
def synthetic_records(tmp_path_factory) -> Path:
    """Synthetic digits as records (600 train / 100 val / 200 test): the unit tier's data."""
    from helpers.synthetic import write_records

    return write_records(tmp_path_factory.mktemp("synthetic") / "digits", n_train=700, val_size=100)


@pytest.fixture
def plant_model():
    """``plant_model(name, factory)``: register a test model, removed when the test ends."""
    from helpers.models import planted

    with contextlib.ExitStack() as stack:
        yield lambda name, factory: stack.enter_context(planted(name, factory))
