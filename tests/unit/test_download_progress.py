"""The downloader's bar on a terminal (size and speed, erased when done), its settings from
the environment, and its mirror order: an in-thread server on 127.0.0.1, synthetic bytes."""
from __future__ import annotations

import hashlib
import http.server
import io
import re
import sys
import threading
import time
from dataclasses import replace

import pytest

from mnistflow.core.errors import MnistflowError
from mnistflow.data.known import KNOWN, RemoteFile, download

DATA = bytes(range(256)) * 800  # 204,800 bytes


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Trickle(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(DATA)))
        self.end_headers()
        for i in range(0, len(DATA), 25_600):
            self.wfile.write(DATA[i:i + 25_600])
            self.wfile.flush()
            time.sleep(0.04)


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for k in ("MNISTFLOW_MIRROR", "MNISTFLOW_MIRRORS", "MNISTFLOW_DOWNLOAD_RETRIES",
              "MNISTFLOW_DOWNLOAD_TIMEOUT", "http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1")


def _toy(*mirrors: str):
    return replace(KNOWN["mnist"], name="toy", files=(RemoteFile("d.bin", hashlib.md5(DATA).hexdigest()),),
                   mirrors=mirrors, homepage="")


def test_bar_on_a_terminal_shows_size_and_speed(tmp_path, monkeypatch):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    monkeypatch.setenv("COLUMNS", "100")
    try:
        download.fetch(_toy(f"http://127.0.0.1:{srv.server_address[1]}/"), tmp_path)
    finally:
        srv.shutdown()
        srv.server_close()
    assert (tmp_path / "d.bin").read_bytes() == DATA
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", tty.getvalue())
    # a redraw mid-file: the bytes so far of the total (205k), and the rate
    assert re.search(r"d\.bin: +\d+%\|[^|]*\| [\d.]+k/205k \[[\d:]+<[\d:?]+, +[\d.]+[kM]B/s\]", out), out
    # erased when done, then the one line that says so
    port = srv.server_address[1]
    tail = out.rsplit("\r", 1)[-1]  # what stays on the screen: the line, not the bar
    assert re.fullmatch(rf"mnistflow: note: downloaded http://127\.0\.0\.1:{port}/d\.bin "
                        r"\(0\.2 MB in [\d.]+ s, checksum OK\)\n", tail), tail


def test_mirror_order_and_overrides(monkeypatch):
    ds = _toy("http://a/x", "http://b/y/")
    assert download.mirrors(ds) == ["http://a/x/", "http://b/y/"]
    monkeypatch.setenv("MNISTFLOW_MIRROR", "http://b/y")
    assert download.mirrors(ds) == ["http://b/y/", "http://a/x/"]  # first, not twice
    monkeypatch.setenv("MNISTFLOW_MIRRORS", "file:///mnt/copy, http://c/ ,")
    assert download.mirrors(ds) == ["http://b/y/", "file:///mnt/copy/", "http://c/"]


@pytest.mark.parametrize("name,value,why", [
    ("MNISTFLOW_DOWNLOAD_RETRIES", "-1", "an integer from 0 to 1000"),
    ("MNISTFLOW_DOWNLOAD_RETRIES", "2.5", "an integer from 0 to 1000"),
    ("MNISTFLOW_DOWNLOAD_RETRIES", "99999999999", "an integer from 0 to 1000"),
    ("MNISTFLOW_DOWNLOAD_TIMEOUT", "0", "a number of seconds > 0, at most 86400"),
    ("MNISTFLOW_DOWNLOAD_TIMEOUT", "never", "a number of seconds > 0, at most 86400"),
    ("MNISTFLOW_DOWNLOAD_TIMEOUT", "inf", "a number of seconds > 0, at most 86400"),  # (an OverflowError)
    ("MNISTFLOW_DOWNLOAD_TIMEOUT", "1e400", "a number of seconds > 0, at most 86400"),
    ("MNISTFLOW_DOWNLOAD_TIMEOUT", "nan", "a number of seconds > 0, at most 86400"),  # (was accepted)
])
def test_bad_settings_are_one_line(monkeypatch, name, value, why):
    monkeypatch.setenv(name, value)
    with pytest.raises(MnistflowError, match=re.escape(f"${name}={value!r}: expected {why}")):
        download._settings()


def test_settings_from_the_environment(monkeypatch):
    assert download._settings() == (download.TIMEOUT, download.RETRIES)
    monkeypatch.setenv("MNISTFLOW_DOWNLOAD_RETRIES", "7")
    monkeypatch.setenv("MNISTFLOW_DOWNLOAD_TIMEOUT", "2.5")
    assert download._settings() == (2.5, 7)


def test_a_file_url_mirror_works(tmp_path):
    src = tmp_path / "copy"
    src.mkdir()
    (src / "d.bin").write_bytes(DATA)
    dest = download.fetch(_toy(src.as_uri()), tmp_path / "dl")
    assert (dest / "d.bin").read_bytes() == DATA


def test_emnist_message_names_the_loose_files_too(tmp_path):
    ds = KNOWN.get("emnist-letters")
    if ds is None:
        pytest.skip("no EMNIST entry in this tree")
    msg = download._all_failed(ds, tmp_path, ["http://a/"],
                               {ds.files[0].name: [("http://a/", "HTTP 404 Not Found")]})
    assert f"http://a/{ds.files[0].name}: HTTP 404 Not Found" in msg
    assert f"place in {tmp_path}: {ds.files[0].name} (md5 {ds.files[0].md5}), or the zip's " \
           "emnist-letters-train-images-idx3-ubyte.gz" in msg
