"""Downloader against local HTTP servers on 127.0.0.1 only: the real MNIST files, a corrupt
mirror, a connection dropped mid-file, a closed port, a silent server, a 404 then a good mirror."""
from __future__ import annotations

import functools
import hashlib
import http.server
import shutil
import socket
import threading
from dataclasses import replace

import pytest

from mnistflow.data import download
from mnistflow.data.datasets import KNOWN
from mnistflow.data.download import fetch_known
from mnistflow.data.sources import locate_known, verify_known_files
from mnistflow.core.errors import MnistflowError

MNIST = KNOWN["mnist"]


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for k in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.delenv("MNISTFLOW_MIRROR", raising=False)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


class _Dropper(http.server.BaseHTTPRequestHandler):
    """Promises 100,000 bytes, sends 1,000, hangs up."""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        self.wfile.write(b"\x1f\x8b" + bytes(998))
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *a):
        pass


def _serve(handler):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/"


@pytest.fixture
def serve():
    servers = []

    def start(directory=None, handler=None):
        h = handler or functools.partial(_Quiet, directory=str(directory))
        srv, url = _serve(h)
        servers.append(srv)
        return url

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.fixture
def closed_port_url():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/"


def _md5(p) -> str:
    return hashlib.md5(p.read_bytes()).hexdigest()


def _leftovers(dest):
    return sorted(p.name for p in dest.parent.rglob("*") if p.name.endswith(".part"))


def test_downloads_real_mnist_and_verifies(tmp_path, serve, closed_port_url, mnist_dir,
                                           monkeypatch, capsys):
    url = serve(mnist_dir)
    monkeypatch.setenv("MNISTFLOW_MIRROR", url.rstrip("/"))  # tried first; slash optional
    ds = replace(MNIST, mirrors=(closed_port_url,))  # never the real internet mirrors
    dest = tmp_path / "raw" / "mnist"
    assert fetch_known(ds, dest) == dest
    for f in ds.files:
        assert (dest / f.name).read_bytes() == (mnist_dir / f.name).read_bytes()
    # The shared train-images .gz is recompressed: accepted through the md5 of its content.
    assert _md5(dest / "train-images-idx3-ubyte.gz") != MNIST.files[0].md5
    verify_known_files(ds, dest)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all("downloaded" in ln and url in ln for ln in err)
    assert _leftovers(dest) == []
    fetch_known(ds, dest)  # already there and verified: nothing fetched
    assert capsys.readouterr().err == ""


def test_locate_known_downloads_into_cache(tmp_path, serve, closed_port_url, mnist_dir, monkeypatch):
    monkeypatch.setenv("MNISTFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MNISTFLOW_DATA", raising=False)
    monkeypatch.setenv("MNISTFLOW_MIRROR", serve(mnist_dir))
    ds = replace(MNIST, files=MNIST.files[2:], mirrors=(closed_port_url,))  # the t10k pair
    folder = locate_known(ds)
    assert folder == tmp_path / "home" / "raw" / "mnist"
    verify_known_files(ds, folder)


def test_corrupt_mirror(tmp_path, serve, closed_port_url, mnist_dir, monkeypatch):
    name = "t10k-labels-idx1-ubyte.gz"
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    data = bytearray((mnist_dir / name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (bad_dir / name).write_bytes(data)
    bad_md5 = hashlib.md5(data).hexdigest()
    url = serve(bad_dir)
    monkeypatch.setenv("MNISTFLOW_MIRROR", url)
    ds = replace(MNIST, files=(MNIST.files[3],), mirrors=(closed_port_url,))
    dest = tmp_path / "dl" / "mnist"
    with pytest.raises(MnistflowError) as e:
        fetch_known(ds, dest)
    msg = str(e.value)
    assert msg.startswith(str(dest)) and "\n" not in msg
    assert url + name in msg and bad_md5 in msg and MNIST.files[3].md5 in msg
    assert not dest.exists() and _leftovers(dest) == []


def test_good_files_are_kept_when_a_later_one_fails(tmp_path, serve, closed_port_url, mnist_dir,
                                                    monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(mnist_dir / "t10k-labels-idx1-ubyte.gz", src)
    (src / "t10k-images-idx3-ubyte.gz").write_bytes(b"junk")
    monkeypatch.setenv("MNISTFLOW_MIRROR", serve(src))
    ds = replace(MNIST, files=(MNIST.files[3], MNIST.files[2]), mirrors=(closed_port_url,))
    dest = tmp_path / "dl"
    with pytest.raises(MnistflowError, match="t10k-images-idx3-ubyte.gz"):
        fetch_known(ds, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["t10k-labels-idx1-ubyte.gz"]


def test_dropped_connection(tmp_path, serve, closed_port_url, monkeypatch):
    url = serve(handler=_Dropper)
    monkeypatch.setenv("MNISTFLOW_MIRROR", url)
    ds = replace(MNIST, files=(MNIST.files[3],), mirrors=(closed_port_url,))
    dest = tmp_path / "dl"
    with pytest.raises(MnistflowError) as e:
        fetch_known(ds, dest)
    assert "connection dropped" in str(e.value) and url in str(e.value)
    assert not dest.exists() and _leftovers(dest) == []


def test_404_then_good_mirror(tmp_path, serve, mnist_dir, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("MNISTFLOW_MIRROR", serve(empty))
    ds = replace(MNIST, files=(MNIST.files[3],), mirrors=(serve(mnist_dir),))
    dest = fetch_known(ds, tmp_path / "dl")
    assert _md5(dest / MNIST.files[3].name) == MNIST.files[3].md5


def test_offline_is_one_clear_line(tmp_path, closed_port_url, monkeypatch, capsys):
    monkeypatch.setenv("MNISTFLOW_MIRROR", closed_port_url)
    ds = replace(MNIST, mirrors=(closed_port_url,))
    dest = tmp_path / "cache" / "raw" / "mnist"
    with pytest.raises(MnistflowError) as e:
        fetch_known(ds, dest)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(dest) + ":")
    for f in ds.files:
        assert f.name in msg
    assert "by hand" in msg and "MNISTFLOW_DATA" in msg and "--data" in msg
    assert not dest.exists() and capsys.readouterr().err == ""


def test_silent_server_times_out(tmp_path, monkeypatch):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4)  # accepts connections (kernel backlog) but never answers
    try:
        monkeypatch.setattr(download, "TIMEOUT", 0.5)
        url = f"http://127.0.0.1:{s.getsockname()[1]}/"
        ds = replace(MNIST, files=(MNIST.files[3],), mirrors=(url,))
        with pytest.raises(MnistflowError, match="no mirror reachable"):
            fetch_known(ds, tmp_path / "dl")
    finally:
        s.close()
    assert not (tmp_path / "dl").exists()
