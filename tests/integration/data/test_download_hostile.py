"""Hostile mirrors (issue 40, R6), on 127.0.0.1 only: a download stops at the file's known size
and deletes what went past it, every try counts (a one-byte drip ends), a mirror slower than
the rate floor is a stall, a redirect loop is one plain line, and a gzip bomb under an expected
name is refused without being inflated. Each CLI case runs under a file-size limit (so that
without the fix it fails instead of filling the disk) and a 20 s timeout."""
from __future__ import annotations

import gzip
import http.server
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest
from helpers.cli import assert_one_line_error

from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError
from mnistflow.data.known import KNOWN, RemoteFile, download, matches, verify
from mnistflow.data.known.download import fetch

MNIST = KNOWN["mnist"]
FSIZE = 64 << 20  # the CLI's file-size limit: more than any part may hold now


class _Evil(http.server.BaseHTTPRequestHandler):
    """``server.mode``: "endless" (200, no Content-Length, zeros until the client hangs up),
    "drip" (206 "bytes N-N/<total>", one byte; ``server.total`` None: 999,999,999), "trickle"
    (200 with the file's size, one byte every 0.2 s), "grow" (206 continuing any part, zeros
    without end), "loop" (302 to itself). Every request is counted in ``server.hits``."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        s = self.server
        s.hits += 1
        name = self.path.rsplit("/", 1)[-1]
        start = int(self.headers.get("Range", "bytes=0-")[6:].rstrip("-") or 0)
        size = next((f.size for f in MNIST.files if f.name == name), 1000)
        try:
            if s.mode == "loop":
                self.send_response(302)
                self.send_header("Location", self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif s.mode == "drip":
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{start}/{s.total or 999_999_999}")
                self.send_header("Content-Length", "1")
                self.end_headers()
                self.wfile.write(b"\0")
            elif s.mode == "trickle":
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                for _ in range(size):
                    self.wfile.write(b"\0")
                    self.wfile.flush()
                    time.sleep(0.2)
            else:  # endless, grow
                self.send_response(206 if s.mode == "grow" else 200)
                if s.mode == "grow":
                    self.send_header("Content-Range", f"bytes {start}-{start + 10**9}/*")
                self.send_header("Connection", "close")
                self.end_headers()
                while True:
                    self.wfile.write(bytes(1 << 16))
        except OSError:  # the client hung up
            pass


@pytest.fixture
def evil():
    servers = []

    def start(mode: str, total: int | None = None) -> tuple[str, http.server.HTTPServer]:
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Evil)
        srv.daemon_threads = True
        srv.mode, srv.total, srv.hits = mode, total, 0
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}/", srv

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def _fsize_limit():
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE, FSIZE))


def _prep(tmp_path, mirror: str, timeout_s: str = "5", retries: str = "1"):
    """``prep mnist`` downloading from ``mirror`` only, under the file-size limit; returns the
    process, its seconds and the download folder."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MNISTFLOW_DATA", "MNISTFLOW_MIRROR", "http_proxy", "HTTP_PROXY")}
    env.update(MNISTFLOW_HOME=str(tmp_path / "home"), MNISTFLOW_MIRRORS=mirror, no_proxy="127.0.0.1",
               MNISTFLOW_DOWNLOAD_RETRIES=retries, MNISTFLOW_DOWNLOAD_TIMEOUT=timeout_s)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mnistflow", "prep", "mnist", "--out", str(tmp_path / "rec")],
                          capture_output=True, text=True, env=env, timeout=20, preexec_fn=_fsize_limit)
    return proc, time.monotonic() - t0, tmp_path / "home" / "raw" / "mnist"


def _parts(dest) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in dest.glob("*.part")} if dest.exists() else {}


def test_endless_body_stops_at_the_known_size_and_leaves_no_part(tmp_path, evil):
    """R6 / K01: 200, no Content-Length, zeros for ever: the part filled the disk and stayed."""
    url, srv = evil("endless")
    proc, took, dest = _prep(tmp_path, url)
    assert_one_line_error(proc, "cannot download mnist", "the most a copy of the file holds")
    assert took < 15 and _parts(dest) == {}, (took, _parts(dest))


def test_range_drip_ends(tmp_path, evil):
    """R6 / K-range_drip: every request a 206 of one byte of a 1 GB "file": 79,954 requests in
    45 s, no end. Now the size it offers is refused at once."""
    url, srv = evil("drip")
    proc, took, dest = _prep(tmp_path, url)
    assert_one_line_error(proc, "offers 999,999,999 bytes; a copy of the file holds at most")
    assert srv.hits <= 4 * 2 and took < 15 and _parts(dest) == {}


def test_drip_of_the_right_size_is_counted(tmp_path, evil):
    """A drip that names the true size: every try gained a byte, so none counted before; now
    at most MAX_DOWNLOAD_RESUMES of them per file, then the next mirror."""
    url, srv = evil("drip", total=MNIST.files[0].size)
    proc, took, dest = _prep(tmp_path, url, retries="0")
    assert_one_line_error(proc, "cannot download mnist", "connection dropped at 0.0 MB of")
    assert srv.hits <= 4 * (limits.MAX_DOWNLOAD_RESUMES + 2) and took < 15, (srv.hits, took)
    assert all(n <= limits.MAX_DOWNLOAD_RESUMES + 1 for n in _parts(dest).values())


def test_trickle_under_the_rate_floor_is_a_stall(tmp_path, evil):
    """One byte every 0.2 s, each within the timeout: it was waited for (~23 days for MNIST)."""
    url, srv = evil("trickle")
    proc, took, dest = _prep(tmp_path, url, timeout_s="1", retries="0")
    assert_one_line_error(proc, "cannot download mnist", "slower than 4.096 kB/s for 1 s")
    assert took < 15 and srv.hits == 4


def test_a_part_over_the_size_is_deleted(tmp_path, evil):
    """A .part larger than the file can be (another tool's, or an older mnistflow's) was kept
    and resumed from; a 206 continuing a part without end grew it past the size."""
    url, srv = evil("grow")
    dest = tmp_path / "home" / "raw" / "mnist"
    dest.mkdir(parents=True)
    with open(dest / "train-labels-idx1-ubyte.gz.part", "wb") as f:
        f.truncate(50 << 20)  # sparse: no disk used
    (dest / "t10k-labels-idx1-ubyte.gz.part").write_bytes(bytes(4000))  # resumed, then grows
    proc, took, _ = _prep(tmp_path, url)
    assert_one_line_error(proc, "cannot download mnist", "the most a copy of the file holds")
    assert took < 15 and _parts(dest) == {}, _parts(dest)


def test_redirect_loop_is_one_plain_line(tmp_path, evil):
    url, _ = evil("loop")
    proc, _, _ = _prep(tmp_path, url)
    assert_one_line_error(proc, "HTTP 302: redirects in a loop")
    assert "\\n" not in proc.stderr and "infinite loop" not in proc.stderr


# --- in process: the size bound on the API, and the gzip bomb ---------------------------------

@pytest.fixture
def _fast(monkeypatch):
    for k in ("http_proxy", "HTTP_PROXY", "MNISTFLOW_MIRROR", "MNISTFLOW_MIRRORS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.setattr(download, "BACKOFF", 0.01)
    monkeypatch.setattr(download, "_sleep", lambda s: None)


@pytest.fixture
def _fsize_here():
    """This process's files limited to FSIZE while the test runs (a write past it fails with
    EFBIG instead of filling the disk, should the bound under test be missing)."""
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE, old[1]))
    yield
    resource.setrlimit(resource.RLIMIT_FSIZE, old)
    signal.signal(signal.SIGXFSZ, handler)


def test_a_file_without_a_size_in_the_table_is_capped(tmp_path, evil, _fast, _fsize_here, monkeypatch):
    """A file the table gives no size stops at limits.MAX_DOWNLOAD_BYTES (here made small)."""
    monkeypatch.setattr(limits, "MAX_DOWNLOAD_BYTES", 3 << 20)
    url, _ = evil("endless")
    ds = replace(MNIST, name="toy", files=(RemoteFile("a.bin", "0" * 32),), mirrors=(url,))
    with pytest.raises(MnistflowError, match="sent more than 3,145,728 bytes"):
        fetch(ds, tmp_path / "dl")
    assert not (tmp_path / "dl").exists()


def _bomb(path, gib: int, isize: int | None = None) -> None:
    """A gzip of ``gib`` GiB of zeros in ~1 MB a GiB (members of 1 MiB each); ``isize``: the
    trailer's length field made to say that."""
    member = gzip.compress(bytes(1 << 20), 9)
    with open(path, "wb") as f:
        for _ in range(1024 * gib):
            f.write(member)
        if isize is not None:
            f.seek(-4, os.SEEK_END)
            f.write((isize % (1 << 32)).to_bytes(4, "little"))


@pytest.mark.parametrize("isize", [None, MNIST.files[0].raw_size], ids=["true trailer", "lying trailer"])
def test_gzip_bomb_under_an_expected_name_is_refused_without_inflating_it(tmp_path, isize):
    """Minor finding: 1 GiB of zeros in 1 MB under each expected name cost 17 s (each inflated
    in full for the md5 of its content). Now the trailer's length is checked first, and the
    inflation never goes past the known uncompressed size."""
    bomb = tmp_path / "train-images-idx3-ubyte.gz"
    _bomb(bomb, 2, isize)
    t0 = time.process_time()
    assert not matches(bomb, MNIST.files[0])
    assert time.process_time() - t0 < 2


def test_a_local_file_over_the_size_is_refused_unread(tmp_path):
    folder = tmp_path / "mnist"
    folder.mkdir()
    for f in MNIST.files:
        with open(folder / f.name, "wb") as fh:
            fh.truncate(2 << 30)  # sparse 2 GiB: md5 would read it all
    t0 = time.monotonic()
    with pytest.raises(MnistflowError, match=r"2,147,483,648 bytes, over the 19,824,844 a copy"):
        verify(MNIST, folder)
    assert time.monotonic() - t0 < 1
