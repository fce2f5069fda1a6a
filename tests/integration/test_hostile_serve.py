"""``mnistflow serve`` against hostile clients (issue 19, HOSTILE-INPUTS.md D2 and D5, and the
server part of D9): image work is bounded (a pixel cap before decoding, a cap on concurrent
decodes, a per-request deadline), slow or idle clients are timed out, a page of another
origin cannot make the server work, an oversized body is a 413 answer (not a reset), a tiny
image is a 400, every refusal is a JSON error, and the server keeps serving.

The server is the real one (``connection.server_config``: the guarded protocol, the connection
caps) in a thread, with a small synthetic model and short deadlines.
"""
from __future__ import annotations

import contextlib
import http.client
import io
import json
import logging
import socket
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from helpers.serving import guarded_server, softmax_predictor

pytest.importorskip("uvicorn")

from mnistflow.server.guard import LOCAL_HOSTS  # noqa: E402

FAST = dict(header_timeout=0.5, body_timeout=0.5, work_timeout=5.0)


predictor = softmax_predictor


def serving(pred=None, *, hosts=LOCAL_HOSTS, **limits):
    """The real server with this file's short timeouts (``helpers.serving.guarded_server``)."""
    return guarded_server(pred, hosts=hosts, **{**FAST, **limits})


def post(port: int, body: bytes, headers: dict, path: str = "/api/predict") -> tuple[int, dict]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("POST", path, body, headers)
        r = c.getresponse()
        data = r.read()
        assert r.getheader("content-type", "").startswith("application/json"), (r.status, data[:200])
        return r.status, json.loads(data)
    finally:
        c.close()


def healthy(port: int) -> bool:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", "/healthz")
        return c.getresponse().status == 200
    finally:
        c.close()


def png(a: np.ndarray, **kw) -> bytes:
    from PIL import Image

    b = io.BytesIO()
    Image.fromarray(a).save(b, format="PNG", **kw)
    return b.getvalue()


def ink_png(side: int) -> bytes:
    """The D2 picture: every pixel but a thin border is 'ink' (a small PNG, a big decode)."""
    a = np.zeros((side, side, 3), np.uint8)
    a[8:-8, 8:-8] = 128
    return png(a, optimize=True)


IMG = {"Content-Type": "image/png"}


# --- D2: bounded image work; who may POST ----------------------------------------------------

def test_d2_cross_origin_text_plain_is_refused_before_any_work():
    """The D2 request: 58 KB of PNG as text/plain from http://evil.example (a page in the
    user's browser can send it without a preflight) -> 403, no decode."""
    body = ink_png(4096)
    with serving() as port:
        t0 = time.perf_counter()
        status, err = post(port, body, {"Content-Type": "text/plain", "Origin": "http://evil.example"})
        assert status == 403 and "cross-origin request refused" in err["error"] and err["status"] == 403
        assert time.perf_counter() - t0 < 0.5  # the decode took 1.4 s before
        for headers in ({"Content-Type": "image/png", "Origin": "http://evil.example"},
                        {"Content-Type": "image/png", "Origin": "null"},
                        {"Content-Type": "image/png", "Origin": f"http://127.0.0.1:{port + 1}"},
                        {"Content-Type": "image/png", "Sec-Fetch-Site": "cross-site"}):
            assert post(port, body, headers)[0] == 403, headers
        for ct in ("text/plain", "application/x-www-form-urlencoded", ""):
            status, err = post(port, body, {"Content-Type": ct} if ct else {})
            assert status == 415 and "Content-Type" in err["error"], (ct, err)
        assert healthy(port)


def multipart(picture: bytes, boundary: str = "b0undary") -> tuple[bytes, dict]:
    """A multipart/form-data upload of one file, as a browser form or ``curl -F`` sends it."""
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="d.png"\r\n'
            f"Content-Type: image/png\r\n\r\n").encode() + picture + f"\r\n--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def test_d2_a_multipart_upload_is_taken_from_scripts_and_refused_from_other_sites():
    """A form on another site can post multipart/form-data to 127.0.0.1 without a preflight;
    the browser names the site in ``Origin`` / ``Sec-Fetch-Site``, and that is refused before
    the body is read. curl and requests send neither: accepted, as is the page's own origin."""
    digit = np.full((280, 280), 255, np.uint8)
    digit[60:220, 120:160] = 0
    body, headers = multipart(png(digit))
    with serving() as port:
        for foreign in ({"Origin": "http://evil.example"}, {"Origin": "null"},
                        {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                        {"Origin": f"http://127.0.0.1:{port + 1}", "Sec-Fetch-Site": "same-site"}):
            status, err = post(port, body, {**headers, **foreign})
            assert status == 403 and "cross-origin request refused" in err["error"], (foreign, err)
        for own in ({}, {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"}):
            status, res = post(port, body, {**headers, **own})
            assert status == 200 and res["preprocess"] == "mnist", (own, res)
        assert healthy(port)


def test_d2_an_oversized_multipart_upload_is_a_413_and_the_server_keeps_serving():
    big = np.random.default_rng(0).integers(0, 256, (1100, 1100), dtype=np.uint8)  # ~1.2 MB of PNG
    body, headers = multipart(png(big))
    with serving(max_body=1 << 20) as port:
        status, err = post(port, body, headers)
        assert status == 413 and f"request body of {len(body):,} bytes: at most 1,048,576" in err["error"]
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)  # no Content-Length: streamed
        try:
            c.putrequest("POST", "/api/predict")
            c.putheader("Content-Type", headers["Content-Type"])
            c.putheader("Transfer-Encoding", "chunked")
            c.endheaders()
            for i in range(0, len(body), 1 << 16):
                piece = body[i:i + (1 << 16)]
                c.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            c.send(b"0\r\n\r\n")
            r = c.getresponse()
            assert r.status == 413 and "over 1,048,576" in json.loads(r.read())["error"]
        except (BrokenPipeError, ConnectionResetError):  # the server answered and closed first
            pass
        finally:
            c.close()
        small, headers = multipart(png(np.zeros((28, 28), np.uint8)))
        status, res = post(port, small, headers)
        assert status == 200 and res["preprocess"] == "none"
        assert healthy(port)


def test_d2_same_origin_page_and_plain_clients_still_work():
    digit = np.zeros((280, 280), np.uint8) + 255
    digit[60:220, 120:160] = 0  # a black '1' on white, as the page draws
    with serving() as port:
        for headers in ({"Content-Type": "image/png", "Origin": f"http://127.0.0.1:{port}",
                         "Sec-Fetch-Site": "same-origin"},
                        {"Content-Type": "image/png", "Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"},
                        {"Content-Type": "application/octet-stream"}):
            status, res = post(port, png(digit), headers)
            assert status == 200 and res["preprocess"] == "mnist", (headers, res)
        status, res = post(port, json.dumps({"pixels": np.zeros((28, 28), int).tolist()}).encode(),
                           {"Content-Type": "application/json"})
        assert status == 200 and res["preprocess"] == "none"


def test_d2_pixel_cap_is_checked_before_decoding():
    body = ink_png(4096)
    with serving() as port:
        assert post(port, png(np.zeros((28, 28), np.uint8)), IMG)[0] == 200  # warm up (imports)
        t0 = time.perf_counter()
        status, err = post(port, body, IMG)
        assert status == 413 and "image of 4096x4096 pixels: at most 4,194,304 pixels" in err["error"]
        assert time.perf_counter() - t0 < 0.5
        assert healthy(port)
    with serving(max_pixels=10_000) as port:  # the cap is the server's setting (--max-pixels)
        status, err = post(port, png(np.zeros((101, 100), np.uint8)), IMG)
        assert status == 413 and "at most 10,000 pixels" in err["error"]
        assert post(port, png(np.zeros((100, 100), np.uint8)), IMG)[0] == 200


def test_d2_a_large_picture_costs_what_a_small_one_does():
    """A 2048x2048 'all ink' picture (at the cap) is reduced before it becomes an array: the
    arrays made while serving it stay far under the ~450 MB that D2 measured per request."""
    body = ink_png(2048)
    with serving() as port:
        assert post(port, body, IMG)[0] == 200  # warm up (imports, first-call allocations)
        tracemalloc.start()
        try:
            status, res = post(port, body, IMG)
            peak = tracemalloc.get_traced_memory()[1] / 2 ** 20
        finally:
            tracemalloc.stop()
        assert status == 200 and res["preprocess"] == "mnist"
        assert peak < 40, f"{peak:.0f} MB"


def test_d2_a_large_jpeg_photo_decodes_at_reduced_scale():
    from PIL import Image

    b = io.BytesIO()
    Image.fromarray(np.full((3000, 4000, 3), 220, np.uint8)).save(b, format="JPEG")  # 12 Mpx
    with serving() as port:
        status, res = post(port, b.getvalue(), {"Content-Type": "image/jpeg"})
        assert status == 200, res  # 12 Mpx declared, 0.75 Mpx decoded (draft at 1/4 scale)


def test_d2_concurrent_decodes_are_capped_and_slow_work_times_out():
    inner = predictor()
    lock = threading.Lock()
    state = {"now": 0, "max": 0, "sleep": 0.2}

    class Slow:
        info, backend, params = inner.info, inner.backend, inner.params

        def predict(self, batch):
            with lock:
                state["now"] += 1
                state["max"] = max(state["max"], state["now"])
            try:
                time.sleep(state["sleep"])
                return inner.predict(batch)
            finally:
                with lock:
                    state["now"] -= 1

    body = json.dumps({"pixels": np.zeros((28, 28), int).tolist()}).encode()
    js = {"Content-Type": "application/json"}
    with serving(Slow(), max_concurrent=2) as port:
        with ThreadPoolExecutor(8) as ex:
            codes = [s for s, _ in ex.map(lambda _: post(port, body, js), range(8))]
        assert codes == [200] * 8 and state["max"] == 2, (codes, state)
    state.update(sleep=1.0, max=0)
    with serving(Slow(), max_concurrent=1, work_timeout=0.3) as port:
        status, err = post(port, body, js)
        assert status == 503 and "took over 0.3 s" in err["error"]
        status, err = post(port, body, js)  # the first still holds the only slot
        assert status == 503 and "busy" in err["error"]
        assert healthy(port)
        time.sleep(1.2)
        state["sleep"] = 0
        assert post(port, body, js)[0] == 200



def test_r2_scan_bombs_are_refused_before_decoding_and_predictions_go_on():
    """R2: four progressive JPEGs of thousands of scans (each a pass over the picture) held
    every decode slot (48 s of CPU each at 2 MB); predictions sent meanwhile got 503. Now each
    is a 413 before decoding, and a prediction sent with them is answered."""
    from helpers.images import scan_bomb_jpeg

    bomb = scan_bomb_jpeg(1024, 20_000)
    jpeg = {"Content-Type": "image/jpeg"}
    with serving(max_concurrent=4) as port:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(5) as ex:
            bombs = [ex.submit(post, port, bomb, jpeg) for _ in range(4)]
            time.sleep(0.05)
            status, res = post(port, png(np.zeros((28, 28), np.uint8)), IMG)
            assert status == 200, res
            for f in bombs:
                status, err = f.result()
                assert status == 413 and "more than 100 scans" in err["error"], err
        assert time.perf_counter() - t0 < 5
        b = io.BytesIO()
        from PIL import Image

        Image.fromarray(np.full((4000, 5000), 128, np.uint8)).save(b, format="JPEG", progressive=True, quality=5)
        status, err = post(port, b.getvalue(), jpeg)  # 0.3 Mpx after the 1/8 draft, but decoded whole
        assert status == 413 and "a progressive JPEG of 5000x4000 pixels: at most 16,777,216" in err["error"], err

# --- tiny images, oversized bodies, every 4xx a JSON error -------------------------------------

def test_an_image_of_a_few_pixels_is_a_400():
    with serving() as port:
        for side in (1, 2, 3):
            status, err = post(port, png(np.zeros((side, side), np.uint8)), IMG)
            assert status == 400 and "too small to classify" in err["error"], err
        status, err = post(port, json.dumps({"pixels": [[0, 255], [255, 0]]}).encode(),
                           {"Content-Type": "application/json"})
        assert status == 400 and "too small" in err["error"]
        assert post(port, png(np.zeros((4, 4), np.uint8)), IMG)[0] == 200


def test_an_oversized_body_is_a_413_answer_not_a_reset():
    with serving() as port:
        for size in (3 << 20, 40 << 20):  # declared: answered at once, the rest discarded
            status, err = post(port, b"\x89PNG" + b"\0" * size, IMG)
            assert status == 413 and "at most 2,097,152" in err["error"], err
        s = socket.create_connection(("127.0.0.1", port))  # chunked: counted while reading
        s.sendall(b"POST /api/predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n" % 65536 + b"\0" * 65536 + b"\r\n"
        for _ in range(40):
            s.sendall(chunk)
        s.sendall(b"0\r\n\r\n")
        s.settimeout(10)
        head = b""
        while b"}" not in head:
            head += s.recv(65536)
        s.close()
        assert head.startswith(b"HTTP/1.1 413") and b"over 2,097,152" in head, head[:300]
        assert healthy(port)


def test_foreign_host_header_is_refused_when_serving_this_machine():
    """DNS rebinding: a page of evil.example whose name now points at 127.0.0.1."""
    with serving() as port:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for path in ("/healthz", "/api/model"):
            c.request("GET", path, headers={"Host": f"evil.example:{port}"})
            r = c.getresponse()
            assert r.status == 403 and "is not this server" in json.loads(r.read())["error"]
        status, _ = post(port, png(np.zeros((28, 28), np.uint8)),
                         {**IMG, "Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"})
        assert status == 403
    with serving(hosts=None) as port:  # --host 0.0.0.0: names unknown, any Host
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/healthz", headers={"Host": "my-machine.local"})
        assert c.getresponse().status == 200


# --- D5: slow and idle clients --------------------------------------------------------------

def closed_within(s: socket.socket, seconds: float) -> float:
    """Seconds until the server closes ``s`` (reads EOF), failing past ``seconds``."""
    s.settimeout(seconds)
    t0 = time.monotonic()
    try:
        while s.recv(4096):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    return time.monotonic() - t0


def test_d5_idle_and_slowloris_connections_are_closed_and_others_are_served():
    with serving() as port:
        idle = socket.create_connection(("127.0.0.1", port))  # sends nothing at all
        slow = socket.create_connection(("127.0.0.1", port))  # headers, one line at a time
        slow.sendall(b"POST /api/predict HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        t0 = time.monotonic()
        closed = False
        while time.monotonic() - t0 < 3:
            try:
                slow.sendall(b"X-a: b\r\n")
            except OSError:
                closed = True
                break
            assert healthy(port)  # others are served meanwhile
            time.sleep(0.1)
        assert closed and time.monotonic() - t0 < 2, "a trickling client was held open"
        assert closed_within(idle, 2) < 2
        # after one request, a new request's headers must arrive in time too
        keep = socket.create_connection(("127.0.0.1", port))
        keep.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert keep.recv(4096).startswith(b"HTTP/1.1 200")
        keep.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert closed_within(keep, 3) < 2.5


def test_d5_a_body_that_does_not_arrive_is_a_408():
    with serving() as port:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /api/predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n"
                  b"Content-Length: 1000\r\n\r\nx")
        s.settimeout(5)
        t0 = time.monotonic()
        data = s.recv(65536)
        assert time.monotonic() - t0 < 2
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower()
        assert "did not arrive within 0.5 s" in json.loads(body)["error"]
        assert healthy(port)


@pytest.mark.parametrize("request_bytes", [
    b"POST /api/predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -1\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0\x00.1\r\n\r\n",
    b"NOT HTTP AT ALL\r\n\r\n",
], ids=["negative-length", "nul-in-host", "garbage"])
def test_malformed_http_framing_is_a_json_400_and_the_server_keeps_serving(request_bytes):
    """uvicorn answers what it cannot parse itself; the guarded protocol makes it a JSON error."""
    with serving() as port:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(request_bytes)
        s.settimeout(5)
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), data[:300]
        assert b"content-type: application/json" in head.lower()
        err = json.loads(body)
        assert err["status"] == 400 and err["error"].startswith("malformed HTTP request: ")
        assert healthy(port)


@pytest.mark.parametrize("path", ["/", "/app.js"])
@pytest.mark.parametrize("rng", ["bytes=5-2", "bytes=999999-", "items=0-1", "bytes=0-3"])
def test_a_range_header_is_ignored_the_whole_file_is_served(path, rng):
    """Starlette answers a bad Range in plain text (400, or an empty 416); the server drops the
    header, so every GET of the page's files is the whole file."""
    with serving() as port:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", path)
        r = c.getresponse()
        whole = r.read()
        c.request("GET", path, headers={"Range": rng})
        r = c.getresponse()
        assert (r.status, r.read()) == (200, whole) and r.getheader("content-range") is None
        assert healthy(port)


def test_a_client_leaving_mid_body_logs_no_traceback():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep(logging.WARNING)
    log = logging.getLogger("uvicorn.error")  # uvicorn's own logger (it does not propagate)
    with serving() as port:
        log.addHandler(handler)
        try:
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /api/predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n"
                      b"Content-Length: 100000\r\n\r\n" + b"\0" * 5000)
            time.sleep(0.1)
            s.close()
            time.sleep(0.3)
            assert healthy(port)
        finally:
            log.removeHandler(handler)
    assert not [r for r in records if r.exc_info], [r.getMessage() for r in records]


def test_the_cli_serve_command_runs_the_guarded_server(monkeypatch):
    """``serve()`` (the verb) builds its uvicorn config with ``server_config``: the guarded
    protocol, the connection cap, and the pixel cap from ``max_pixels``."""
    import uvicorn

    from mnistflow.server import app as appmod

    seen = {}

    class FakeServer:
        def __init__(self, config):
            seen["config"] = config

        def run(self, sockets):
            seen["app"] = seen["config"].app

    monkeypatch.setattr(uvicorn, "Server", FakeServer)
    monkeypatch.setattr(appmod, "load_predictor", lambda model, threads, work_timeout=None: predictor())
    appmod.serve("unused", port=0, max_pixels=123_456)
    cfg = seen["config"]
    assert cfg.http == "mnistflow.server.connection:GuardedHTTPProtocol" and cfg.ws == "none"
    assert cfg.limit_concurrency is None  # uvicorn's cap counted idle sockets (R3): the protocol's own
    assert cfg.mnistflow_limits.max_connections == 256 and cfg.mnistflow_limits.header_timeout == 10.0
    assert seen["app"].state.limits.max_pixels == 123_456
    from mnistflow.server.connection import GuardedHTTPProtocol

    assert GuardedHTTPProtocol.__name__.startswith("Guarded")
