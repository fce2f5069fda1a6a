"""``mnistflow serve``: the JSON API on a real uvicorn server (127.0.0.1, a free port).

A ``fast`` model is trained once for every serve test (this file and test_serve_browser.py);
each bad input gets a 4xx with a JSON error and the server keeps serving.
"""
from __future__ import annotations

import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx  # the dev extra
import numpy as np
import pytest
from helpers.cli import assert_one_line_error, run_cli, start_serve
from helpers.images import png, real_digits
from helpers.serving import uvicorn_thread


@contextlib.contextmanager
def running(app):
    """Serve ``app`` with uvicorn in a thread on a free 127.0.0.1 port; yields the base URL."""
    import uvicorn

    with uvicorn_thread(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2)) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def client(serve_model):
    from mnistflow.server import create_app

    with running(create_app(serve_model)) as url, httpx.Client(base_url=url, timeout=30) as c:
        yield c


def drawing(digit: np.ndarray, size: int = 280) -> np.ndarray:
    """A 28x28 MNIST digit as a user's drawing: black ink on white, ``size`` pixels square."""
    from PIL import Image

    return 255 - np.asarray(Image.fromarray(digit).resize((size, size), Image.BILINEAR))


def assert_ok(r) -> dict:
    assert r.status_code == 200, (r.status_code, r.text)
    d = r.json()
    assert {"label", "class_name", "probabilities", "model", "latency_ms", "preprocess"} <= set(d)
    assert abs(sum(d["probabilities"]) - 1) < 1e-3 and d["latency_ms"] > 0
    return d


# --- what works -------------------------------------------------------------------------

def test_health_and_model(client):
    assert client.get("/healthz").json()["status"] == "ok"
    m = client.get("/api/model").json()
    assert m["model"] == "fast" and m["backend"] == "pytorch" and m["dataset"] == "mnist"
    assert m["in_shape"] == [1, 28, 28] and m["input_size"] == "28x28x1"
    assert m["class_names"] == [str(i) for i in range(10)] and m["params"] > 10_000
    assert 0.97 < m["test_acc"] <= 1 and m["background"] == "dark" and m["picture"] == "mnist"


def test_page_and_static_files(client):
    r = client.get("/")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    assert "default-src 'self'" in r.headers["content-security-policy"]
    for name in ("backend.js", "app.js", "style.css"):  # beside the page, as in a web export
        assert f'"{name}"' in r.text
        f = client.get(f"/{name}")
        assert f.status_code == 200 and "default-src 'self'" in f.headers["content-security-policy"]
        assert "http://" not in f.text and "https://" not in f.text  # nothing from the network
    assert r.text.index('"backend.js"') < r.text.index('"app.js"')  # window.mnistflow first
    assert "http://" not in r.text and "https://" not in r.text
    for name in ("/static/app.js", "/nothing.js", "/index.htm", "/..%2Fapp.py", "/web"):
        r = client.get(name)
        assert r.status_code == 404 and r.json()["error"], name
    assert client.post("/app.js", content=b"x").status_code == 405


def test_pixels_at_model_size_used_as_is(client):
    x, y = real_digits(20)
    labels = []
    for a in x:
        d = assert_ok(client.post("/api/predict?input=1", json={"pixels": a.tolist()}))
        assert d["preprocess"] == "none" and d["input"] == a.tolist() and d["model"] == "fast"
        assert d["class_name"] == str(d["label"])
        labels.append(d["label"])
    assert (np.array(labels) == y).sum() >= 19


def test_drawings_get_mnist_preprocessing(client):
    """Black-on-white pictures of any size: cropped, 20x20, centred by mass, inverted."""
    x, y = real_digits(20, start=100)
    labels = []
    for a in x:
        d = assert_ok(client.post("/api/predict?input=1", content=png(drawing(a)),
                                  headers={"Content-Type": "image/png"}))
        seen = np.array(d["input"], np.float64)
        assert d["preprocess"] == "mnist" and seen.shape == (28, 28)
        assert seen[0].max() == 0 and seen[:, 0].max() == 0  # white on black, like MNIST
        iy, ix = np.indices(seen.shape)
        assert abs((seen * iy).sum() / seen.sum() - 14) < 1 and abs((seen * ix).sum() / seen.sum() - 14) < 1
        labels.append(d["label"])
    assert (np.array(labels) == y).sum() >= 18
    # the same drawing as JSON pixels (another size than the model's) is treated the same way
    d = assert_ok(client.post("/api/predict", json={"pixels": drawing(x[0], 56).tolist()}))
    assert d["preprocess"] == "mnist" and d["label"] == y[0]
    assert "input" not in d  # only with ?input=1


def test_jpeg_transparent_png_and_white_on_black(client):
    x, y = real_digits(3, start=200)
    d = assert_ok(client.post("/api/predict", content=png(drawing(x[0]), "JPEG", quality=90),
                              headers={"Content-Type": "image/jpeg"}))
    assert d["label"] == y[0]
    rgba = np.zeros((140, 140, 4), np.uint8)  # black ink on a transparent canvas
    rgba[..., 3] = 255 - drawing(x[1], 140)
    d = assert_ok(client.post("/api/predict", content=png(rgba), headers={"Content-Type": "image/png"}))
    assert d["label"] == y[1]
    d = assert_ok(client.post("/api/predict?preprocess=mnist&input=true",
                              content=png(255 - drawing(x[2])), headers={"Content-Type": "application/octet-stream"}))
    assert d["label"] == y[2] and np.array(d["input"])[0].max() == 0


def test_requests_are_handled_concurrently(serve_model):
    """8 requests to a predictor that takes 0.3 s each finish in well under 8 x 0.3 s."""
    from mnistflow.server import create_app, load_predictor

    class Slow:
        def __init__(self, inner):
            self.inner, self.info, self.backend, self.params = inner, inner.info, inner.backend, inner.params

        def predict(self, batch):
            time.sleep(0.3)
            return self.inner.predict(batch)

    x, _ = real_digits(8)
    with running(create_app(Slow(load_predictor(serve_model)))) as url, \
            httpx.Client(base_url=url, timeout=30, limits=httpx.Limits(max_connections=8)) as c:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as ex:
            codes = list(ex.map(lambda a: c.post("/api/predict", json={"pixels": a.tolist()}).status_code, x))
        wall = time.perf_counter() - t0
    assert codes == [200] * 8 and wall < 1.5, wall


# --- uploads from scripts (multipart/form-data), the docstring's example --------------------

def test_a_multipart_upload_is_accepted_as_curl_and_requests_send_it(client, tmp_path):
    """``curl -F file=@digit.png`` and ``requests.post(files=...)`` (httpx sends the same):
    the file part is the picture, whatever its field name; a ``preprocess`` field is honoured."""
    import shutil
    import subprocess

    x, y = real_digits(3, start=300)
    d = assert_ok(client.post("/api/predict", files={"file": ("d.png", png(drawing(x[0])), "image/png")}))
    assert d["label"] == y[0] and d["preprocess"] == "mnist"
    d = assert_ok(client.post("/api/predict", files={"upload": png(drawing(x[1]))}))  # no part type
    assert d["label"] == y[1]
    d = assert_ok(client.post("/api/predict", files={"file": ("x.png", png(x[2]))}, data={"preprocess": "none"}))
    assert d["label"] == y[2] and d["preprocess"] == "none"
    pixels = json.dumps({"pixels": drawing(x[0], 40).tolist()}).encode()
    assert assert_ok(client.post("/api/predict", files={"file": ("p.json", pixels, "text/plain")}))["label"] == y[0]
    if shutil.which("curl"):
        (tmp_path / "digit.png").write_bytes(png(drawing(x[0])))
        url = str(client.base_url).rstrip("/") + "/api/predict"
        out = subprocess.run(["curl", "-sS", "--noproxy", "*", "-F", f"file=@{tmp_path / 'digit.png'}", url],
                             capture_output=True, text=True, timeout=60)
        assert json.loads(out.stdout)["label"] == y[0], out


FIELD_ONLY = b'--b\r\nContent-Disposition: form-data; name="preprocess"\r\n\r\nmnist\r\n--b--\r\n'
UNFINISHED = b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\n\r\n\x89PNG'


@pytest.mark.parametrize("files, data, fragment", [
    ({"a": ("a.png", b"1"), "b": ("b.png", b"2")}, None, "Too many files"),
    (FIELD_ONLY, None, "no complete file part"),
    (UNFINISHED, None, "no complete file part"),
    (b"no boundary here", None, "bad multipart/form-data body"),
    ({"file": ("empty.png", b"")}, None, "the uploaded file is empty"),
    ({"file": ("x.png", b"not a picture", "image/png")}, None, "not a decodable image"),
    ({"file": ("x.png", png(np.zeros((28, 28), np.uint8)))}, {"preprocess": "magic"}, "preprocess must be one of"),
    ({"file": ("x.png", b"1")}, {f"f{i}": "x" for i in range(20)}, "Too many fields"),
])
def test_a_bad_upload_is_a_json_4xx(client, files, data, fragment):
    if isinstance(files, bytes):  # a body made by hand
        ct = "multipart/form-data" + ("" if files.startswith(b"no") else "; boundary=b")
        r = client.post("/api/predict", content=files, headers={"Content-Type": ct})
    else:
        r = client.post("/api/predict", files=files, data=data)
    assert 400 <= r.status_code < 500 and fragment in r.json()["error"], (r.status_code, r.text)
    assert r.json()["status"] == r.status_code and client.get("/healthz").status_code == 200


def test_the_docstrings_json_example_works_as_written(client):
    """``server/app.py``'s docstring: its JSON curl line (a 4x5 vertical bar: a one)."""
    import mnistflow.server.app as app

    doc = app.__doc__
    line = next(ln for ln in doc.splitlines() if "-d '" in ln)
    body = line.split("-d '", 1)[1].rsplit("'", 1)[0]
    d = assert_ok(client.post("/api/predict", content=body.encode(), headers={"Content-Type": "application/json"}))
    assert d["label"] == 1 and d["preprocess"] == "mnist"
    assert "curl -s -F file=@digit.png" in doc


# --- what is refused ----------------------------------------------------------------------

def _bad_png_bomb() -> bytes:
    """A small PNG that claims 20000 x 20000 pixels."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 20000, 20000, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 1000)) + chunk(b"IEND", b""))


JSON = {"Content-Type": "application/json"}
IMG = {"Content-Type": "image/png"}
BAD = [
    ("empty body", b"", IMG, 400, "empty"),
    ("empty json body", b"", JSON, 400, "empty"),
    ("not an image", b"hello, world", IMG, 400, "not a decodable image"),
    ("truncated png", None, IMG, 400, "could not be decoded"),
    ("png bomb", None, IMG, 413, "pixels"),
    ("invalid json", b'{"pixels": [[1, 2]', JSON, 400, "not valid JSON"),
    ("an integer of 5,000 digits", b'{"pixels": [[' + b"9" * 5000 + b']]}', JSON, 400, "not valid JSON"),
    ("json without pixels", b'{"image": [[1]]}', JSON, 422, "pixels"),
    ("json list", b"[[1, 2], [3, 4]]", JSON, 422, "pixels"),
    ("ragged rows", b'{"pixels": [[1, 2], [3]]}', JSON, 422, "ragged"),
    ("1-d", b'{"pixels": [1, 2, 3]}', JSON, 422, "shape"),
    ("4-d", b'{"pixels": [[[[1]]]]}', JSON, 422, "shape"),
    ("5 channels", json.dumps({"pixels": np.zeros((28, 28, 5), int).tolist()}).encode(), JSON, 422, "channels"),
    ("empty rows", b'{"pixels": [[], []]}', JSON, 422, "shape"),
    ("empty list", b'{"pixels": []}', JSON, 422, "non-empty"),
    ("nan", b'{"pixels": [[NaN, 0], [0, 0]]}', JSON, 422, "NaN"),
    ("infinity", b'{"pixels": [[Infinity, 0], [0, 0]]}', JSON, 422, "NaN or infinite"),
    ("huge number", b'{"pixels": [[1e999, 0], [0, 0]]}', JSON, 422, "NaN or infinite"),
    ("negative", b'{"pixels": [[-1, 0], [0, 0]]}', JSON, 422, "0..255"),
    ("over 255", b'{"pixels": [[256, 0], [0, 0]]}', JSON, 422, "0..255"),
    ("null values", b'{"pixels": [[null, 0], [0, 0]]}', JSON, 422, "numbers"),
    ("text values", b'{"pixels": [["a", "b"], ["c", "d"]]}', JSON, 422, "numbers"),
    ("booleans", b'{"pixels": [[true, false]]}', JSON, 422, "numbers"),
    ("too large array", json.dumps({"pixels": [[0] * 1025]}).encode(), JSON, 422, "per side"),
    ("bad preprocess", json.dumps({"pixels": [[0]], "preprocess": "magic"}).encode(), JSON, 422, "preprocess"),
    ("none at wrong size", json.dumps({"pixels": [[0] * 5] * 5, "preprocess": "none"}).encode(), JSON, 422,
     "28x28x1"),
]


@pytest.mark.parametrize("name,body,headers,status,fragment", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_json_4xx(client, name, body, headers, status, fragment):
    if name == "truncated png":
        body = png(drawing(real_digits(1)[0][0]))[:300]
    elif name == "png bomb":
        body = _bad_png_bomb()
    r = client.post("/api/predict", content=body, headers=headers)
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()
    assert fragment in err["error"] and err["status"] == status
    assert client.get("/healthz").status_code == 200  # still serving


def test_body_over_2mb_is_413_declared_or_streamed(client):
    big = b"\x89PNG" + b"\0" * (2 * 1024 * 1024)
    r = client.post("/api/predict", content=big, headers=IMG)
    assert r.status_code == 413 and "at most 2,097,152" in r.json()["error"]

    def chunks():  # no Content-Length: chunked transfer, the limit is counted while reading
        for _ in range(40):
            yield b"\0" * 65536

    r = client.post("/api/predict", content=chunks(), headers=IMG)
    assert r.status_code == 413 and "over 2,097,152" in r.json()["error"]
    x, y = real_digits(1)
    assert assert_ok(client.post("/api/predict", json={"pixels": x[0].tolist()}))["label"] == y[0]


def test_unknown_route_and_wrong_method_are_json(client):
    r = client.get("/api/nothing")
    assert r.status_code == 404 and r.json()["error"]
    r = client.get("/api/predict")
    assert r.status_code == 405 and r.json()["error"]


def test_preprocess_query_none_needs_model_size(client):
    r = client.post("/api/predict?preprocess=none", content=png(np.zeros((30, 30), np.uint8)), headers=IMG)
    assert r.status_code == 422 and "28x28x1" in r.json()["error"]
    r = client.post("/api/predict?preprocess=none", content=png(np.zeros((28, 28), np.uint8)), headers=IMG)
    assert assert_ok(r)["preprocess"] == "none"


# --- other models: colour, 32x32, ONNX ------------------------------------------------------

@pytest.mark.parametrize("in_shape,mode", [((3, 32, 32), "resize"), ((1, 32, 32), "mnist")])
def test_colour_and_32x32_models(in_shape, mode):
    """Any model mnistflow trains: the input is prepared at its size and channel count."""
    from mnistflow.artifacts.model_info import ModelInfo
    from mnistflow.artifacts.predictor import TorchBackend
    from mnistflow.models import create_model
    from mnistflow.server import create_app

    c, h, w = in_shape
    names = ["plane", "car", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    info = ModelInfo(model="softmax", in_shape=list(in_shape), class_names=names, mean=[120.0] * c,
                     std=[60.0] * c, dataset="test")
    pred = TorchBackend(create_model("softmax", in_shape, 10).eval(), info)
    with running(create_app(pred)) as url, httpx.Client(base_url=url, timeout=30) as cl:
        m = cl.get("/api/model").json()
        assert m["input_size"] == f"{h}x{w}x{c}" and m["class_names"] == names
        d = assert_ok(cl.post("/api/predict?input=1", content=png(drawing(real_digits(1)[0][0], 200)),
                              headers=IMG))
        assert d["preprocess"] == mode and np.array(d["input"]).shape == ((h, w, c) if c == 3 else (h, w))
        assert d["class_name"] == names[d["label"]]
        pixels = np.zeros((h, w, c) if c == 3 else (h, w), np.uint8).tolist()
        assert assert_ok(cl.post("/api/predict", json={"pixels": pixels}))["preprocess"] == "none"


def test_onnx_export_is_served_with_onnxruntime(serve_model, tmp_path):
    """``mnistflow export --format onnx`` output runs in ONNX Runtime and agrees with PyTorch."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from mnistflow.artifacts.model_file import load_model
    from mnistflow.artifacts.onnx import to_onnx
    from mnistflow.server import create_app, load_predictor

    path = tmp_path / "model.onnx"
    path.write_bytes(to_onnx(*load_model(serve_model)))
    pred, ref = load_predictor(path), load_predictor(serve_model)
    assert pred.backend == "onnxruntime" and pred.params == ref.params
    x, _ = real_digits(16, start=300)
    p_ref = ref.predict(x[..., None])
    assert np.abs(pred.predict(x[..., None]) - p_ref).max() < 1e-4
    with running(create_app(path)) as url, httpx.Client(base_url=url, timeout=30) as c:
        m = c.get("/api/model").json()
        assert m["backend"] == "onnxruntime" and m["model"] == "fast" and m["params"] == ref.params
        d = assert_ok(c.post("/api/predict", json={"pixels": x[0].tolist()}))
        assert d["label"] == int(p_ref[0].argmax())


# --- the command --------------------------------------------------------------------------

def test_cli_bad_model_is_one_line_error(tmp_path):
    proc = run_cli("serve", str(tmp_path / "missing"), "--port", "0")
    assert_one_line_error(proc, "missing", "no such file")
    proc = run_cli("serve", str(tmp_path / "missing"), "--port", "70000")
    assert_one_line_error(proc, "--port must be in 0..65535")


def test_host_other_than_localhost_warns(serve_model, capsys, monkeypatch):
    """--host 0.0.0.0 prints a warning (checked without opening the port)."""
    from mnistflow.core.errors import MnistflowError
    from mnistflow.server import app as appmod

    def no_bind(host, port):
        raise MnistflowError(f"not binding {host} in tests")

    monkeypatch.setattr(appmod, "_bind", no_bind)
    import mnistflow

    with pytest.raises(MnistflowError, match="not binding 0.0.0.0"):
        mnistflow.serve(serve_model, host="0.0.0.0", port=0)  # the public API twin of the verb
    assert "warning: --host 0.0.0.0" in capsys.readouterr().err
    with pytest.raises(MnistflowError):
        appmod.serve(serve_model, host="127.0.0.1", port=0)
    assert "warning" not in capsys.readouterr().err


def test_cli_serves_until_stopped(serve_model):
    """``mnistflow serve RUN --port 0`` prints its URL, answers, and stops on SIGINT."""
    import signal

    proc, line = start_serve(serve_model)
    try:
        assert "serving fast (pytorch) at http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() else "")
        url = line.split(" at ")[1].split()[0]
        assert httpx.get(url + "healthz", timeout=30).json()["status"] == "ok"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
        assert proc.stdout.read().strip() == "stopped" and not proc.stderr.read().strip()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
