"""How the test suite finds the real datasets (helpers/realdata.py), so that the README's test
command runs in a plain clone: $MNISTFLOW_DATA, else ../shared/data/<dataset> when it exists,
else mnistflow's cache, else a verified download into the cache. Downloads go to a mirror on
127.0.0.1 only (never the real internet); a mirror that counts requests shows when none is made.
"""
from __future__ import annotations

import functools
import os
import http.server
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.realdata import ENV, MNIST_DIR, SHARED, real_data, where

from mnistflow.data.known import KNOWN, files_in, verify

# The t10k pair only (the smaller files): enough to tell where each folder comes from.
T10K = replace(KNOWN["mnist"], files=KNOWN["mnist"].files[2:])


class _Counting(http.server.SimpleHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self):
        self.requests.append(self.path)
        super().do_GET()

    def log_message(self, *a):
        pass


@pytest.fixture
def mirror(mnist_dir, monkeypatch):
    """(the dataset T10K served from a local mirror of the real files, the requests it got)."""
    for k in ("http_proxy", "HTTP_PROXY", "MNISTFLOW_MIRROR", "MNISTFLOW_MIRRORS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    requests: list[str] = []
    handler = functools.partial(type("H", (_Counting,), {"requests": requests}), directory=str(mnist_dir))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield replace(T10K, mirrors=(f"http://127.0.0.1:{srv.server_address[1]}/",)), requests
    srv.shutdown()
    srv.server_close()


def _folder_with_t10k(folder: Path, mnist_dir: Path) -> Path:
    folder.mkdir(parents=True)
    for f in T10K.files:
        shutil.copyfile(mnist_dir / f.name, folder / f.name)
    return folder


def test_mnistflow_data_comes_first(tmp_path, mnist_dir, mirror):
    ds, requests = mirror
    mine = _folder_with_t10k(tmp_path / "mine", mnist_dir)
    shared = tmp_path / "shared"
    _folder_with_t10k(shared / "mnist", mnist_dir)
    _folder_with_t10k(tmp_path / "cache" / "mnist", mnist_dir)
    assert real_data(ds, env=str(mine), shared=shared, cache=tmp_path / "cache") == mine
    # it names MNIST's folder only: another dataset is looked for in the shared folder
    (shared / "fashion-mnist").mkdir()
    assert where(KNOWN["fashion-mnist"], env=str(mine), shared=shared) == shared / "fashion-mnist"
    assert requests == []


def test_then_the_shared_folder_then_the_cache(tmp_path, mnist_dir, mirror):
    ds, requests = mirror
    cache = _folder_with_t10k(tmp_path / "cache" / "mnist", mnist_dir).parent
    shared = tmp_path / "shared"
    assert real_data(ds, env=None, shared=shared, cache=cache) == cache / "mnist"  # no shared folder
    _folder_with_t10k(shared / "mnist", mnist_dir)
    assert real_data(ds, env=None, shared=shared, cache=cache) == shared / "mnist"
    assert requests == []


def test_else_a_verified_download_into_the_cache(tmp_path, mirror):
    ds, requests = mirror
    cache = tmp_path / "cache"
    folder = real_data(ds, env=None, shared=tmp_path / "no-shared", cache=cache)
    assert folder == cache / "mnist"
    verify(ds, folder)  # the published md5 sums
    assert sorted(requests) == sorted(f"/{f.name}" for f in ds.files)
    assert real_data(ds, env=None, shared=tmp_path / "no-shared", cache=cache) == folder
    assert len(requests) == len(ds.files)  # the second time: from the cache


@pytest.mark.parametrize("named_by", ["env", "shared"])
def test_a_named_folder_without_the_files_fails_and_never_downloads(tmp_path, mirror, named_by):
    ds, requests = mirror
    empty = tmp_path / "shared" / "mnist"
    empty.mkdir(parents=True)
    env = str(empty) if named_by == "env" else None
    with pytest.raises(pytest.fail.Exception, match=r"real mnist not found at .*mnist \((\$MNISTFLOW_DATA|the "
                                                    r"shared data folder)\): place t10k-images-idx3-ubyte.gz"):
        real_data(ds, env=env, shared=tmp_path / "shared", cache=tmp_path / "cache")
    assert requests == [] and not (tmp_path / "cache").exists()


def test_a_failed_download_says_what_to_do(tmp_path, mirror, monkeypatch):
    ds, requests = mirror
    ds = replace(ds, mirrors=(ds.mirrors[0] + "nothing-here/",))  # 404 for every file
    with pytest.raises(pytest.fail.Exception, match=r"not in mnistflow's cache and could not be downloaded: "
                                                    r".*cannot download mnist: .*place in .*MNISTFLOW_DATA"):
        real_data(ds, env=None, shared=tmp_path / "no-shared", cache=tmp_path / "cache")
    assert requests


def test_the_session_names_the_folder_it_reads_for_every_command(mnist_dir):
    """The commands the tests run read ``$MNISTFLOW_DATA``: the session sets it to the folder
    found (as CI's ``.ci/run`` once did by hand), and that folder holds MNIST."""
    assert os.environ["MNISTFLOW_DATA"] == str(mnist_dir) == str(MNIST_DIR)
    assert files_in(KNOWN["mnist"], mnist_dir)
    if ENV is None and (SHARED / "mnist").is_dir():  # here and in CI: never the cache
        assert mnist_dir == SHARED / "mnist"
