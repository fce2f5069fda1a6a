"""Where the tests read the real datasets (MNIST, Fashion-MNIST), found much as mnistflow finds
them, so that the README's test command runs in a plain clone on a machine with the network:

1. ``$MNISTFLOW_DATA`` when set (MNIST: the folder of its four .gz files);
2. else ``../shared/data/<dataset>`` beside the checkout, when that folder exists (this
   project's machines and CI: the tests never download there);
3. else mnistflow's cache (``$MNISTFLOW_HOME`` or ``~/.cache/mnistflow``, ``raw/<dataset>``),
   where ``mnistflow prep`` and ``scripts/train_mnist.sh`` leave the files;
4. else a download into that cache by mnistflow's own downloader (the dataset's mirrors, each
   file checked against its published md5).

A folder named by 1 or 2 that lacks the files fails the test instead of downloading.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.cli import REPO

from mnistflow.core.errors import MnistflowError
from mnistflow.core.paths import home
from mnistflow.data.known import KNOWN, KnownDataset, files_in

SHARED = REPO.parent / "shared" / "data"
# Read when the tests are collected, before the session points MNISTFLOW_HOME at a temporary
# folder and sets MNISTFLOW_DATA (tests/conftest.py): the user's own settings.
ENV = os.environ.get("MNISTFLOW_DATA") or None
CACHE = home() / "raw"


def where(ds: KnownDataset, *, env: str | None = ENV, shared: Path = SHARED,
          cache: Path = CACHE) -> Path:
    """The folder the tests read ``ds`` from, by the order above; no download (for the cache,
    the folder a download fills)."""
    if env and ds.name == "mnist":
        return Path(env)
    if (shared / ds.home).is_dir():
        return shared / ds.home
    return cache / ds.home


def real_data(ds: KnownDataset, *, env: str | None = ENV, shared: Path = SHARED,
              cache: Path = CACHE) -> Path:
    """``where(ds)``, with its files: downloaded into the cache when they are nowhere."""
    folder = where(ds, env=env, shared=shared, cache=cache)
    if files_in(ds, folder):
        return folder
    if folder != cache / ds.home:
        why = "$MNISTFLOW_DATA" if env and ds.name == "mnist" else "the shared data folder"
        pytest.fail(f"real {ds.name} not found at {folder} ({why}): place "
                    f"{', '.join(f.name for f in ds.files)} there, or unset MNISTFLOW_DATA to use "
                    "mnistflow's cache (downloaded once)")
    from mnistflow.data.known.download import fetch

    try:
        return fetch(ds, folder)
    except MnistflowError as e:
        pytest.fail(f"real {ds.name} is not in mnistflow's cache and could not be downloaded: {e}")


MNIST_DIR = where(KNOWN["mnist"])
