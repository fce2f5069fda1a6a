"""Property: whatever a client sends to ``POST /api/predict`` -- random bytes, a mutated PNG,
JPEG, GIF or BMP, mutated JSON pixels, a mutated multipart upload, under any accepted or refused Content-Type, with any
``preprocess`` -- the answer is a prediction (200) or a 4xx with a JSON error, never a 5xx or
a dropped connection, and the request's peak memory growth stays under
``helpers.memory.bound`` of the body's size (issue 19, D2: a 58 KB PNG cost ~450 MB).

Two levels: the body parsers in ``server.inputs`` (``parse_json``, ``decode_image`` and
``to_input``, which must give the model's input or a ``BadInput`` with a 4xx status), and the
whole Starlette app through ``starlette.testclient.TestClient`` (the guard's Content-Type and
Origin checks, the body reader, the worker slots, the model).

Deterministic in CI (100 examples per target); MNISTFLOW_FUZZ_EXAMPLES=N runs a longer,
random hunt by hand.
"""
from __future__ import annotations

import io
import json
import warnings

import numpy as np
import pytest
from helpers.memory import assert_bounded
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("starlette")
pytest.importorskip("httpx")  # starlette's TestClient

from helpers.fuzz import FUZZ, mutated
from mnistflow.artifacts.model_info import ModelInfo
from mnistflow.artifacts.predictor import TorchBackend
from mnistflow.models import create_model
from mnistflow.server import create_app
from mnistflow.server.guard import BadInput, Limits
from mnistflow.server.inputs import MODES, decode_image, parse_json, to_input


INFO = ModelInfo("softmax", [1, 28, 28], [str(i) for i in range(10)], [33.0], [78.0], dataset="synthetic")
LIMITS = Limits()  # the server's defaults: what `mnistflow serve` runs with


# --- seeds -----------------------------------------------------------------------------------

def _picture(fmt: str, side: int = 28, mode: str = "L") -> bytes:
    from PIL import Image

    a = np.zeros((side, side), np.uint8)
    a[side // 5: -side // 5, side // 2 - side // 10: side // 2 + side // 10] = 255  # a '1'
    im = Image.fromarray(a).convert(mode)
    b = io.BytesIO()
    im.save(b, format=fmt)
    return b.getvalue()


SEEDS = {
    "png": _picture("PNG"),
    "png-rgba": _picture("PNG", 64, "RGBA"),
    "jpeg": _picture("JPEG", 40, "RGB"),
    "gif": _picture("GIF", 32),
    "bmp": _picture("BMP", 16),
    "json": json.dumps({"pixels": (np.arange(28 * 28) % 256).reshape(28, 28).tolist()}).encode(),
    "json-rgb": json.dumps({"pixels": np.full((6, 6, 3), 200).tolist(), "preprocess": "resize"}).encode(),
}
SEEDS["multipart"] = (  # an upload (boundary x, as CONTENT_TYPES' multipart type names it)
    b'--x\r\nContent-Disposition: form-data; name="preprocess"\r\n\r\nauto\r\n'
    b'--x\r\nContent-Disposition: form-data; name="file"; filename="d.png"\r\nContent-Type: image/png\r\n\r\n'
    + SEEDS["png"] + b"\r\n--x--\r\n")
CONTENT_TYPES = ["image/png", "image/jpeg", "image/gif", "application/json", "application/octet-stream",
                 "application/vnd.x+json", "text/plain", "", "multipart/form-data; boundary=x",
                 "image/png; charset=utf-8", "application/json; charset=latin-1"]




def json_values():
    """JSON documents of any shape, most of them near ``{"pixels": ...}``."""
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-300, 300), st.integers(),
                        st.floats(allow_nan=False, allow_subnormal=False), st.text(max_size=8))
    anything = st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=6), inner, max_size=4)), max_leaves=60)
    rows = st.lists(st.lists(st.one_of(st.integers(-2, 300), st.floats(-1, 300, allow_subnormal=False)), min_size=1, max_size=40),
                    min_size=1, max_size=40)
    return st.one_of(anything, st.fixed_dictionaries(
        {"pixels": st.one_of(rows, anything)},
        optional={"preprocess": st.one_of(st.sampled_from([*MODES, "bogus"]), anything)}))


def bodies():
    return st.one_of(
        st.binary(max_size=2048),
        st.sampled_from(sorted(SEEDS)).flatmap(lambda k: mutated(SEEDS[k])),
        json_values().map(lambda v: json.dumps(v).encode()),
    )


@pytest.fixture(scope="module")
def pred():
    import torch

    torch.manual_seed(0)
    return TorchBackend(create_model("softmax", (1, 28, 28), 10).eval(), INFO)


# --- the body parsers --------------------------------------------------------------------------

def parse(body: bytes, as_json: bool, mode: str | None):
    """What ``classify`` does before the model: the model's input, or BadInput."""
    if as_json:
        img, json_mode = parse_json(body)
        mode = json_mode or mode
    else:
        img = decode_image(body, LIMITS)
    return to_input(img, INFO, mode, LIMITS.min_side)


def test_inputs(pred):
    parse(SEEDS["png"], False, None)  # imports Pillow's plugins: not measured

    @FUZZ
    @given(bodies(), st.booleans(), st.sampled_from([None, *MODES]))
    def run(body, as_json, mode):
        with warnings.catch_warnings(record=True) as seen:  # no raw warning in the server's log
            warnings.simplefilter("always")
            try:
                x, used = assert_bounded(lambda: parse(body, as_json, mode), len(body), "parse")
            except BadInput as e:
                assert 400 <= e.status < 500 and e.message, (e.status, e.message)
                return
            finally:
                assert not seen, [f"{w.category.__name__}: {w.message}" for w in seen]
        assert x.dtype == np.uint8 and x.shape == (28, 28, 1) and used in MODES, (x.shape, used)
        assert pred.predict(x[None]).shape == (1, 10)

    run()


# --- the app -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def client(pred):
    with warnings.catch_warnings():  # starlette 1.x prefers httpx2; httpx still works
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    with TestClient(create_app(pred, limits=LIMITS), raise_server_exceptions=False) as c:
        assert c.post("/api/predict", content=SEEDS["png"], headers={"Content-Type": "image/png"}).status_code == 200
        yield c


def test_app(client):
    @FUZZ
    @given(bodies(), st.sampled_from(CONTENT_TYPES), st.sampled_from([None, *MODES, "x"]),
           st.sampled_from([None, "1"]), st.sampled_from([None, "http://testserver", "http://evil.example"]))
    def run(body, content_type, mode, with_input, origin):
        headers = {"Content-Type": content_type} if content_type else {}
        if origin:
            headers["Origin"] = origin
        params = {k: v for k, v in (("preprocess", mode), ("input", with_input)) if v is not None}
        r = assert_bounded(lambda: client.post("/api/predict", content=body, headers=headers, params=params),
                           len(body), "POST /api/predict")
        assert r.headers["content-type"].startswith("application/json"), (r.status_code, r.content[:200])
        res = r.json()
        if r.status_code == 200:
            assert 0 <= res["label"] < 10 and len(res["probabilities"]) == 10 and res["preprocess"] in MODES
            assert abs(sum(res["probabilities"]) - 1) < 1e-3
        else:
            assert 400 <= r.status_code < 500, (r.status_code, res)
            assert res["status"] == r.status_code and res["error"], res

    run()
