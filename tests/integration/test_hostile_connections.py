"""``mnistflow serve`` against hostile connections (issue 40, HOSTILE-INPUTS.md R1, R3, the Host
and pipelining findings, and the first sweep's refused body that reached urllib as a reset):
what one connection may cost is bounded (``server.connection``), every refusal is JSON, and the
server keeps serving.

The server is the real one (``connection.server_config``) in a thread of the test process, so
``tracemalloc`` sees what it allocates.
"""
from __future__ import annotations

import contextlib
import http.client
import io
import json
import socket
import threading
import time
import tracemalloc
import urllib.error
import urllib.request

import numpy as np
import pytest

from helpers.serving import guarded_server, softmax_predictor

pytest.importorskip("uvicorn")

from mnistflow.server import connection  # noqa: E402


FAST = dict(header_timeout=2.0, body_timeout=2.0, work_timeout=5.0)


predictor = softmax_predictor


def serving(pred=None, **limits):
    """The real server with this file's short timeouts (``helpers.serving.guarded_server``)."""
    return guarded_server(pred, log_level="critical", **{**FAST, **limits})


def get(port: int, path: str = "/healthz", headers: dict | None = None) -> tuple[int, str, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, r.getheader("content-type", ""), r.read()
    finally:
        c.close()


def raw(port: int, request: bytes, timeout: float = 10) -> bytes:
    """Send ``request`` on a fresh connection; everything the server answers until it closes
    (or ``timeout``)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(timeout)
    try:
        s.sendall(request)
        data = b""
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            while chunk := s.recv(65536):
                data += chunk
        return data
    finally:
        s.close()


def json_error(data: bytes) -> tuple[int, dict]:
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), data[:300]
    return int(head.split()[1]), json.loads(body)


def png28() -> bytes:
    from PIL import Image

    b = io.BytesIO()
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(b, format="PNG")
    return b.getvalue()


# --- R1: request line and headers bounded in bytes ---------------------------------------------

FLOODS = {  # the first bytes, then what is repeated: one header line after another, one
    # growing header value, name or URL
    "header-lines": (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"a: b\r\n" * 10_000),
    "header-value": (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-a: ", b"b" * 60_000),
    "header-name": (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX", b"a" * 60_000),
    "url": (b"GET /healthz?", b"a" * 60_000),
}


@pytest.mark.parametrize("kind", list(FLOODS))
def test_r1_a_header_flood_is_a_431_after_some_tens_of_kb_and_memory_stays_bounded(kind):
    """R1: the headers (or URL) of one request grow without end. Before: every byte was kept
    (one client, 9 s: +2.2 GB). Now: a JSON 431 once the head passes 32 KiB, the connection
    closed, the server's allocations flat, the server serving."""
    first, piece = FLOODS[kind]
    with serving() as port:
        assert get(port)[0] == 200
        s = socket.create_connection(("127.0.0.1", port))
        tracemalloc.start()
        try:
            s.sendall(first)
            sent = len(first)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                while sent < 8 << 20:  # 8 MB of head
                    s.sendall(piece)
                    sent += len(piece)
            s.settimeout(10)
            answer = b""
            with contextlib.suppress(ConnectionResetError, TimeoutError):
                while chunk := s.recv(65536):
                    answer += chunk
            peak = tracemalloc.get_traced_memory()[1] / 2**20
        finally:
            tracemalloc.stop()
            s.close()
        status, err = json_error(answer)
        assert status == 431 and err["error"] == "the request line and headers are over 32,768 bytes", err
        assert peak < 8, f"{peak:.1f} MB allocated while a client sent 8 MB of headers"
        assert get(port)[0] == 200


def test_r1_real_requests_with_large_headers_still_pass():
    """Under the cap, a head of ~30 KB (a browser's cookies for localhost can be large) passes,
    whether it arrives in one piece or in many (the count is of the head, not of the pieces)."""
    cookie = "a=" + "x" * 30_000
    with serving() as port:
        assert get(port, headers={"Cookie": cookie})[0] == 200
        head = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: {cookie}\r\n\r\n".encode()
        s = socket.create_connection(("127.0.0.1", port))
        for i in range(0, len(head), 7000):  # arrives in five pieces
            s.sendall(head[i:i + 7000])
            time.sleep(0.05)
        s.settimeout(10)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        # a POST's head and its body in one write: the body is not counted as head
        body = png28() + b"\0" * 200_000  # trailing bytes after IEND are ignored by PNG readers
        s.sendall(b"POST /api/predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        data = b""
        while b"probabilities" not in data:
            data += s.recv(65536)
        assert data.startswith(b"HTTP/1.1 200"), data[:200]
        s.close()
        status, _ = json_error(raw(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: " + b"x" * 40_000
                                   + b"\r\n\r\n"))
        assert status == 431


# --- R3: idle sockets do not count; every 503 is JSON --------------------------------------------

def test_r3_idle_sockets_cannot_lock_anyone_out():
    """R3: 256 sockets that never send a byte made every request a 503 (text/plain). Now a
    connection with no request in progress holds no capacity: past the cap, the one idle the
    longest is closed, so requests are answered however many idle sockets are held (here 40
    against a cap of 8, some of them trickling headers)."""
    with serving(max_connections=8) as port:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(10)]
        for s in slow:
            s.sendall(b"GET /healthz HTTP/1.1\r\n")
        time.sleep(0.3)
        for _ in range(10):
            status, ctype, _ = get(port)
            assert (status, ctype) == (200, "application/json")
        closed = 0
        for s in idle + slow:
            s.settimeout(0.5)
            with contextlib.suppress(TimeoutError, ConnectionResetError):
                closed += s.recv(1) == b""
            s.close()
        assert closed >= 30, f"only {closed} of 40 idle connections were closed (cap 8)"
        assert get(port)[0] == 200


def test_r3_past_the_request_cap_the_503_is_json_and_service_resumes():
    inner = predictor()
    gate = threading.Event()

    class Held:  # each prediction waits for the gate
        info, backend, params = inner.info, inner.backend, inner.params

        def predict(self, batch):
            gate.wait(10)
            return inner.predict(batch)

    body = json.dumps({"pixels": np.zeros((28, 28), int).tolist()}).encode()

    def post():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        c.request("POST", "/api/predict", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.getheader("content-type"), r.getheader("retry-after"), r.read()

    with serving(Held(), max_connections=2, max_concurrent=2) as port:
        held = [threading.Thread(target=post) for _ in range(2)]
        for t in held:
            t.start()
        time.sleep(0.5)
        status, ctype, retry, data = post()
        assert (status, ctype, retry) == (503, "application/json", "1"), data
        assert "the server is busy (2 requests in progress)" in json.loads(data)["error"]
        gate.set()
        for t in held:
            t.join()
        assert post()[0] == 200


# --- the first sweep's leftover: a refused body sent whole before the answer is read --------------

@pytest.mark.parametrize("size", [3 << 20, 20 << 20])
def test_an_oversized_body_sent_whole_by_urllib_gets_the_413_not_a_reset(size):
    """urllib (and requests) send the whole body, then read the answer, with ``Connection:
    close``. The server answers 413 at once; closing then, with the body still arriving, reset
    the connection before urllib read the answer. Now the server lingers: it stops sending and
    discards what arrives for a bounded time, then closes."""
    with serving() as port:
        for _ in range(3):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/api/predict", data=b"\x89PNG" + bytes(size),
                                         headers={"Content-Type": "image/png"})
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=30)
            assert e.value.code == 413 and e.value.headers["content-type"] == "application/json"
            assert "at most 2,097,152" in json.loads(e.value.read())["error"]
        assert get(port)[0] == 200


def test_the_lingering_close_is_bounded_in_bytes_and_time(monkeypatch):
    """A client that keeps sending after its refusal is cut off after LINGER_BYTES or
    LINGER_SECONDS, whichever comes first."""
    monkeypatch.setattr(connection, "LINGER_SECONDS", 0.5)
    monkeypatch.setattr(connection, "LINGER_BYTES", 1 << 20)
    with serving() as port:
        for budget in ("time", "bytes"):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /api/predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n"
                      b"Connection: close\r\nContent-Length: 999999999\r\n\r\n")
            t0, sent = time.monotonic(), 0
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                while time.monotonic() - t0 < 10:
                    s.sendall(b"\0" * 1000 if budget == "time" else b"\0" * 65536)
                    sent += 1000 if budget == "time" else 65536
                    if budget == "time":
                        time.sleep(0.01)
            elapsed = time.monotonic() - t0
            s.close()
            if budget == "time":
                assert elapsed < 3, f"still lingering after {elapsed:.1f} s"
            else:
                assert sent < 40 << 20, f"{sent:,} bytes taken after the refusal"
        assert get(port)[0] == 200


# --- pipelining -------------------------------------------------------------------------------------

def test_pipelining_without_reading_is_bounded_and_a_modest_pipeline_is_answered():
    """Minor finding: ~267,000 pipelined requests sent without reading the answers cost +115 MB.
    Now at most MAX_PIPELINED wait behind the one answered; past that, the connection closes."""
    with serving() as port:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 10)
        s.settimeout(10)
        data = b""
        while data.count(b"HTTP/1.1 200") < 10:
            data += s.recv(65536)
        s.close()
        tracemalloc.start()
        try:
            s = socket.create_connection(("127.0.0.1", port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                s.settimeout(10)
                for _ in range(50):  # 200,000 requests, 8 MB
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 4000)
            peak = tracemalloc.get_traced_memory()[1] / 2**20
        finally:
            tracemalloc.stop()
        s.close()
        assert peak < 10, f"{peak:.1f} MB"
        assert get(port)[0] == 200


# --- Host handling (minor findings) -------------------------------------------------------------------

@pytest.mark.parametrize("request_line, headers, expected", [
    ("GET /healthz HTTP/1.1", "Host: 127.0.0.1\r\nHost: evil.example", 400),  # the app read the last
    ("GET /healthz HTTP/1.1", "Host: evil.example\r\nHost: 127.0.0.1", 400),
    ("GET /healthz HTTP/1.1", "Host: evil@127.0.0.1", 403),
    ("GET /healthz HTTP/1.1", "Host: 127.0.0.1:{port}/x", 403),
    ("GET /healthz HTTP/1.1", "Host: 127.0.0.1:99999", 403),
    ("GET http://evil.example/healthz HTTP/1.1", "Host: 127.0.0.1", 403),  # the target names the host
    ("GET http://evil@127.0.0.1:{port}/healthz HTTP/1.1", "Host: 127.0.0.1", 400),
    ("GET http://127.0.0.1:{port}/healthz HTTP/1.1", "Host: evil.example", 200),
    ("GET http://[::1]:{port}/healthz HTTP/1.1", "Host: 127.0.0.1", 200),
    ("GET /healthz HTTP/1.1", "", 400),  # HTTP/1.1 requires a Host
    ("GET /healthz HTTP/1.0", "", 200),  # HTTP/1.0 may omit it: this server's own address
    ("GET /healthz HTTP/1.0", "Host: evil.example", 403),
    ("GET /healthz HTTP/1.1", "Host: localhost:{port}", 200),
], ids=["two-hosts-last-evil", "two-hosts-first-evil", "userinfo", "path", "port-range", "absolute-evil",
        "absolute-userinfo", "absolute-local", "absolute-ipv6", "none-http11", "none-http10", "http10-evil",
        "localhost"])
def test_the_host_a_request_is_for_is_checked_as_rfc_9112_defines_it(request_line, headers, expected):
    with serving() as port:
        head = f"{request_line}\r\n{headers}\r\n" if headers else f"{request_line}\r\n"
        data = raw(port, (head.format(port=port) + "Connection: close\r\n\r\n").encode())
        status, answer = json_error(data)
        assert status == expected, answer
        if expected == 403:
            assert "is not this server" in answer["error"]
        assert get(port)[0] == 200


def test_an_origin_with_a_user_name_is_not_this_server():
    with serving() as port:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        c.request("POST", "/api/predict", png28(), {"Content-Type": "image/png", "Origin": f"http://evil@127.0.0.1:{port}"})
        r = c.getresponse()
        assert r.status == 403 and "cross-origin" in json.loads(r.read())["error"]
