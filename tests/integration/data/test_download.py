"""Downloader against local HTTP servers on 127.0.0.1 only (never the real mirrors): the real
MNIST files, a corrupt mirror, a connection dropped mid-file (resumed with Range), a server
refusing Range, a slow one, a silent one, a closed port, 404 on the first mirror only, 503 then
OK (retried with backoff), every mirror failing (one line), the CLI's message, and two
downloads of one file at once."""
from __future__ import annotations

import functools
import hashlib
import http.server
import random
import re
import shutil
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.cli import assert_one_line_error, run_cli

from mnistflow.core import progress
from mnistflow.core.errors import MnistflowError
from mnistflow.data.known import KNOWN, RemoteFile, download, locate, verify
from mnistflow.data.known.download import fetch

MNIST = KNOWN["mnist"]
_ENV = ("MNISTFLOW_MIRROR", "MNISTFLOW_MIRRORS", "MNISTFLOW_DOWNLOAD_RETRIES",
        "MNISTFLOW_DOWNLOAD_TIMEOUT")


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for k in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    for k in _ENV:
        monkeypatch.delenv(k, raising=False)
    # Retries in hundredths of a second: the behaviour, not the patience, is under test.
    monkeypatch.setattr(download, "BACKOFF", 0.01)
    monkeypatch.setattr(download, "RETRIES", 2)
    monkeypatch.setattr(download, "TIMEOUT", 5.0)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


class _Dropper(http.server.BaseHTTPRequestHandler):
    """Promises the 1,648,877 bytes of MNIST's t10k images, sends 1,000, hangs up."""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "1648877")
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
    assert fetch(ds, dest) == dest
    for f in ds.files:
        assert (dest / f.name).read_bytes() == (mnist_dir / f.name).read_bytes()
    # The shared train-images .gz is recompressed: accepted through the md5 of its content.
    assert _md5(dest / "train-images-idx3-ubyte.gz") != MNIST.files[0].md5
    verify(ds, dest)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all("downloaded" in ln and url in ln for ln in err)
    assert _leftovers(dest) == []
    fetch(ds, dest)  # already there and verified: nothing fetched
    assert capsys.readouterr().err == ""


def test_locate_known_downloads_into_cache(tmp_path, serve, closed_port_url, mnist_dir, monkeypatch):
    monkeypatch.setenv("MNISTFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MNISTFLOW_DATA", raising=False)
    monkeypatch.setenv("MNISTFLOW_MIRROR", serve(mnist_dir))
    ds = replace(MNIST, files=MNIST.files[2:], mirrors=(closed_port_url,))  # the t10k pair
    folder = locate(ds)
    assert folder == tmp_path / "home" / "raw" / "mnist"
    verify(ds, folder)


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
        fetch(ds, dest)
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
        fetch(ds, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["t10k-labels-idx1-ubyte.gz"]


def test_dropped_connection(tmp_path, serve, closed_port_url, monkeypatch):
    url = serve(handler=_Dropper)
    monkeypatch.setenv("MNISTFLOW_MIRROR", url)
    ds = replace(MNIST, files=(MNIST.files[2],), mirrors=(closed_port_url,))
    dest = tmp_path / "dl"
    with pytest.raises(MnistflowError) as e:
        fetch(ds, dest)
    msg = str(e.value)
    assert url + "t10k-images-idx3-ubyte.gz: connection dropped at 0.0 MB of 1.6 MB (4 tries)" in msg
    # The server ignores Range: every try starts over, and only the first one made progress.
    # The 1,000 bytes are kept for the next run to resume (from a mirror that honours Range).
    assert "kept in .part files: the next try resumes" in msg
    assert _leftovers(dest) == ["t10k-images-idx3-ubyte.gz.part"]
    assert (dest / "t10k-images-idx3-ubyte.gz.part").stat().st_size == 1000


def test_404_then_good_mirror(tmp_path, serve, mnist_dir, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("MNISTFLOW_MIRROR", serve(empty))
    ds = replace(MNIST, files=(MNIST.files[3],), mirrors=(serve(mnist_dir),))
    dest = fetch(ds, tmp_path / "dl")
    assert _md5(dest / MNIST.files[3].name) == MNIST.files[3].md5


def test_offline_is_one_clear_line(tmp_path, closed_port_url, monkeypatch, capsys):
    monkeypatch.setenv("MNISTFLOW_MIRROR", closed_port_url)
    ds = replace(MNIST, mirrors=(closed_port_url,))
    dest = tmp_path / "cache" / "raw" / "mnist"
    with pytest.raises(MnistflowError) as e:
        fetch(ds, dest)
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
        monkeypatch.setattr(download, "TIMEOUT", 0.3)
        url = f"http://127.0.0.1:{s.getsockname()[1]}/"
        ds = replace(MNIST, files=(MNIST.files[3],), mirrors=(url,))
        with pytest.raises(MnistflowError, match=r"unreachable: no answer within 0.3 s \(3 tries\)"):
            fetch(ds, tmp_path / "dl")
    finally:
        s.close()
    assert not (tmp_path / "dl").exists()


# --- synthetic files from misbehaving mirrors -----------------------------------------------

class _Mirror(http.server.BaseHTTPRequestHandler):
    """Serves ``server.files`` ({name: bytes}); the server's other attributes make it misbehave:
    ``statuses`` (codes answered first, one per request), ``ranges`` (honour Range),
    ``drops``/``drop_at`` (that many responses cut after drop_at bytes), ``stall``/``stall_at``
    (a pause of stall seconds after stall_at bytes), ``trickle`` ((bytes, seconds) per piece).
    Every request is recorded in ``requests`` as (file name, Range header)."""

    def log_message(self, *a):
        pass

    def do_GET(self):
        s = self.server
        name = self.path.rsplit("/", 1)[-1]
        rng = self.headers.get("Range")
        s.requests.append((name, rng))
        if s.statuses:
            self.send_error(s.statuses.pop(0))
            return
        data = s.files.get(name)
        if data is None:
            self.send_error(404)
            return
        start = 0
        m = re.fullmatch(r"bytes=(\d+)-", rng or "")
        if m and s.ranges:
            start = int(m[1])
            if start >= len(data):
                self.send_error(416)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            if s.drops and len(body) > s.drop_at:
                s.drops -= 1
                self.wfile.write(body[:s.drop_at])
                self.close_connection = True  # hang up mid-file
                return
            if s.stall and len(body) > s.stall_at:
                self.wfile.write(body[:s.stall_at])
                self.wfile.flush()
                time.sleep(s.stall)
                body = body[s.stall_at:]
            step, pause = s.trickle or (len(body), 0)
            for i in range(0, len(body), step):
                self.wfile.write(body[i:i + step])
                self.wfile.flush()
                time.sleep(pause)
        except OSError:  # the client gave up on us
            pass


@pytest.fixture
def mirror():
    """``mirror(files, **knobs)`` -> (base URL, server): a misbehaving mirror (see _Mirror)."""
    servers = []

    def start(files, *, statuses=(), ranges=True, drops=0, drop_at=0, stall=0.0, stall_at=0,
              trickle=None):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Mirror)
        srv.daemon_threads = True
        srv.files, srv.statuses, srv.ranges = dict(files), list(statuses), ranges
        srv.drops, srv.drop_at, srv.stall, srv.stall_at = drops, drop_at, stall, stall_at
        srv.trickle, srv.requests = trickle, []
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}/", srv

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


A = random.Random(1).randbytes(200_000)
B = random.Random(2).randbytes(30_000)
FILES = {"a.bin": A, "b.bin": B}


def _toy(*mirrors: str):
    """A known dataset of two synthetic files (their md5s published), on ``mirrors``."""
    files = tuple(RemoteFile(n, hashlib.md5(d).hexdigest()) for n, d in FILES.items())
    return replace(MNIST, name="toy", files=files, mirrors=mirrors, homepage="", aliases=())


@pytest.fixture
def sleeps(monkeypatch):
    """The backoff waits the downloader asked for (it does not wait)."""
    got = []
    monkeypatch.setattr(download, "_sleep", got.append)
    return got


def _check(dest):
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == FILES  # and no .part left


def test_dropped_connection_resumes_with_range(tmp_path, mirror, sleeps):
    url, srv = mirror(FILES, drops=1, drop_at=50_000)
    dest = fetch(_toy(url), tmp_path / "dl")
    _check(dest)
    assert srv.requests == [("a.bin", None), ("a.bin", "bytes=50000-"), ("b.bin", None)]
    assert sleeps == []  # progress was made: retried at once, not counted as a failure


def test_range_refused_starts_over(tmp_path, mirror, sleeps):
    url, srv = mirror(FILES, drops=1, drop_at=50_000, ranges=False)
    dest = fetch(_toy(url), tmp_path / "dl")
    _check(dest)  # the whole file again after the 200, not the old 50,000 bytes + all of it
    assert srv.requests == [("a.bin", None), ("a.bin", "bytes=50000-"), ("b.bin", None)]


def test_part_left_by_an_earlier_run_is_resumed(tmp_path, mirror):
    url, srv = mirror(FILES)
    dest = tmp_path / "dl"
    dest.mkdir()
    (dest / "a.bin.part").write_bytes(A[:123_456])  # a run killed mid-file
    (dest / "b.bin.part").write_bytes(b"x" * 1000)  # a part of some other file: wrong bytes
    _check(fetch(_toy(url), dest))
    # a.bin: only the rest asked for; b.bin: resumed, wrong md5, so fetched whole again.
    assert srv.requests == [("a.bin", "bytes=123456-"), ("b.bin", "bytes=1000-"), ("b.bin", None)]


def test_whole_part_answered_416_is_verified(tmp_path, mirror):
    url, srv = mirror(FILES)
    dest = tmp_path / "dl"
    dest.mkdir()
    (dest / "a.bin.part").write_bytes(A)  # complete, killed before the rename
    _check(fetch(_toy(url), dest))
    assert srv.requests == [("a.bin", "bytes=200000-"), ("b.bin", None)]


def test_slow_mirror_under_the_timeout_is_waited_for(tmp_path, mirror, monkeypatch, capsys):
    monkeypatch.setattr(download, "TIMEOUT", 0.5)
    monkeypatch.setattr(download, "HEARTBEAT", 0.0)  # a progress line at every chance
    url, srv = mirror(FILES, trickle=(20_000, 0.03))
    _check(fetch(_toy(url), tmp_path / "dl"))
    assert [r[1] for r in srv.requests] == [None, None]  # one request each: no retry
    err = capsys.readouterr().err.splitlines()
    # stderr is no terminal here: plain lines with size and speed, then one line per file
    assert any(re.search(r"note: downloading .*a\.bin: [\d.]+ MB of 0\.2 MB \(\d+%\), "
                         r"[\d.]+ MB/s$", ln) for ln in err), err
    assert [ln for ln in err if "downloaded" in ln] == [
        ln for ln in err if re.search(rf"note: downloaded {url}[ab]\.bin \(0\.\d MB in [\d.]+ s, "
                                      r"checksum OK\)$", ln)]
    assert sum("downloaded" in ln for ln in err) == 2


def test_quiet_says_nothing(tmp_path, mirror, monkeypatch, capsys):
    monkeypatch.setattr(download, "HEARTBEAT", 0.0)
    url, _ = mirror(FILES, trickle=(50_000, 0.01))
    with progress.quiet():
        _check(fetch(_toy(url), tmp_path / "dl"))
    assert capsys.readouterr().err == ""


def test_stalled_mirror_times_out_and_the_next_one_resumes(tmp_path, mirror, monkeypatch, sleeps):
    monkeypatch.setattr(download, "TIMEOUT", 0.2)
    slow, srv1 = mirror(FILES, stall=2.0, stall_at=1000, ranges=False)
    good, srv2 = mirror(FILES)
    t = time.monotonic()
    _check(fetch(_toy(slow, good), tmp_path / "dl"))
    assert time.monotonic() - t < 3  # 2 files x 4 tries of ~0.2 s, not the 2 s stalls
    # First try: 1,000 bytes then silence (progress: again at once); then 3 tries without
    # progress (2 retries); the good mirror continues from the 1,000 bytes.
    assert srv1.requests == [("a.bin", None)] + [("a.bin", "bytes=1000-")] * 3 \
        + [("b.bin", None)] + [("b.bin", "bytes=1000-")] * 3
    assert srv2.requests == [("a.bin", "bytes=1000-"), ("b.bin", "bytes=1000-")]
    assert sleeps == [0.01, 0.02] * 2


def test_wrong_checksum_goes_to_the_next_mirror(tmp_path, mirror, monkeypatch, capsys):
    bad = bytearray(A)
    bad[100_000] ^= 1
    url1, _ = mirror({"a.bin": bytes(bad), "b.bin": B})
    url2, srv2 = mirror(FILES)
    renamed = []  # what lands under a final name: the md5 of each file renamed into place
    real_replace = download.os.replace

    def spy(src, dst):
        renamed.append((str(dst), hashlib.md5(Path(src).read_bytes()).hexdigest()))
        return real_replace(src, dst)

    monkeypatch.setattr(download.os, "replace", spy)
    dest = fetch(_toy(url1, url2), tmp_path / "dl")
    _check(dest)
    md5 = {n: hashlib.md5(d).hexdigest() for n, d in FILES.items()}
    assert sorted(renamed) == sorted((str(dest / n), m) for n, m in md5.items())
    assert srv2.requests == [("a.bin", None)]  # b.bin came from the first mirror
    err = capsys.readouterr().err
    assert f"{url1}a.bin: md5 {hashlib.md5(bad).hexdigest()}, expected the published " \
           f"{md5['a.bin']}" in err  # the line saying a.bin was downloaded tells what happened


def test_404_on_the_first_mirror_only_is_per_file(tmp_path, mirror, sleeps):
    url1, srv1 = mirror({"b.bin": B})  # lacks a.bin
    url2, srv2 = mirror(FILES)
    _check(fetch(_toy(url1, url2), tmp_path / "dl"))
    assert srv1.requests == [("a.bin", None), ("b.bin", None)]  # 404: no retry
    assert srv2.requests == [("a.bin", None)]  # b.bin still came from the first mirror
    assert sleeps == []


def test_503_is_retried_with_backoff(tmp_path, mirror, sleeps):
    url, srv = mirror(FILES, statuses=[503, 503])
    _check(fetch(_toy(url), tmp_path / "dl"))
    assert srv.requests == [("a.bin", None)] * 3 + [("b.bin", None)]
    assert sleeps == [0.01, 0.02]  # doubled each time


def test_retries_and_timeout_from_the_environment(tmp_path, mirror, monkeypatch, sleeps):
    monkeypatch.setenv("MNISTFLOW_DOWNLOAD_RETRIES", "0")
    url, srv = mirror(FILES, statuses=[503])
    with pytest.raises(MnistflowError, match=r"a\.bin: HTTP 503 Service Unavailable\. "):
        fetch(_toy(url), tmp_path / "dl")
    assert sleeps == [] and srv.requests == [("a.bin", None), ("b.bin", None)]
    monkeypatch.setenv("MNISTFLOW_DOWNLOAD_TIMEOUT", "soon")
    with pytest.raises(MnistflowError, match=r"\$MNISTFLOW_DOWNLOAD_TIMEOUT='soon': expected a "
                                             r"number of seconds > 0"):
        fetch(_toy(url), tmp_path / "dl")


def test_mirrors_from_the_environment_replace_the_datasets(tmp_path, mirror, monkeypatch):
    own, srv_own = mirror(FILES)
    url1, srv1 = mirror({})
    url2, _ = mirror(FILES)
    monkeypatch.setenv("MNISTFLOW_MIRRORS", f" {url1.rstrip('/')} ,{url2},")
    assert download.mirrors(_toy(own)) == [url1, url2]
    _check(fetch(_toy(own), tmp_path / "dl"))
    assert srv_own.requests == [] and len(srv1.requests) == 2


def test_every_mirror_failing_is_one_line(tmp_path, mirror, closed_port_url, sleeps):
    empty, _ = mirror({})
    busy, srv = mirror(FILES, statuses=[503] * 100)
    dest = tmp_path / "cache" / "toy"
    ds = _toy(empty, closed_port_url, busy)
    with pytest.raises(MnistflowError) as e:
        fetch(ds, dest)
    msg = str(e.value)
    assert "\n" not in msg
    want = (f"{dest}: cannot download toy: {empty} (2 files): HTTP 404 Not Found; "
            f"{closed_port_url} (2 files): unreachable: connection refused (3 tries); "
            f"{busy} (2 files): HTTP 503 Service Unavailable (3 tries). "
            f"Fetch by hand and place in {dest}: a.bin (md5 {ds.files[0].md5}), "
            f"b.bin (md5 {ds.files[1].md5}); or point --data or MNISTFLOW_DATA at a folder "
            "holding them, or MNISTFLOW_MIRRORS at mirrors that serve them")
    assert msg == want
    assert len(srv.requests) == 6  # 3 tries per file; the closed port was tried for a.bin only
    assert sleeps == [0.01, 0.02] * 3
    assert not dest.exists()  # nothing kept: no byte came


def test_two_downloads_of_one_file_take_turns(tmp_path, mirror):
    url, srv = mirror(FILES, trickle=(20_000, 0.02))
    dest = tmp_path / "dl"
    errors = []

    def run():
        try:
            fetch(_toy(url), dest)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    _check(dest)
    # The second waited on the part's lock, then found the file there: each fetched once.
    assert sorted(srv.requests) == [("a.bin", None), ("b.bin", None)]


def test_cli_says_what_was_tried_and_what_to_place(tmp_path, mirror, closed_port_url):
    empty, _ = mirror({})
    home = tmp_path / "home"
    proc = run_cli("prep", "mnist", "--out", str(tmp_path / "records"), timeout=120,
                   env={"MNISTFLOW_HOME": str(home), "MNISTFLOW_DATA": None,
                        "MNISTFLOW_MIRROR": None, "no_proxy": "127.0.0.1", "http_proxy": None,
                        "HTTP_PROXY": None, "MNISTFLOW_MIRRORS": f"{closed_port_url},{empty}",
                        "MNISTFLOW_DOWNLOAD_RETRIES": "0"})
    dest = home / "raw" / "mnist"
    assert_one_line_error(proc, f"{dest}: cannot download mnist: ",
                          f"{closed_port_url} (4 files): unreachable: connection refused; ",
                          f"{empty} (4 files): HTTP 404 Not Found. ",
                          f"place in {dest}: train-images-idx3-ubyte.gz "
                          f"(md5 {MNIST.files[0].md5}), train-labels-idx1-ubyte.gz",
                          f"t10k-labels-idx1-ubyte.gz (md5 {MNIST.files[3].md5})")
    assert not dest.exists()
