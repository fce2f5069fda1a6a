"""Every layer's activations for one input (``artifacts.layers``) and ``/api/layers`` /
``/api/kernel`` over HTTP, on real MNIST digits and the ``fast`` model trained once for the
serve tests (``serve_model``)."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers.images import real_digits

from mnistflow.artifacts.layers import bound, budget, kernel, layers
from mnistflow.core.errors import MnistflowError


def digit(i: int = 0) -> np.ndarray:
    return real_digits(1, start=i)[0][0][..., None]  # (28, 28, 1)


def info_for(name: str, classes: int = 10):
    from mnistflow.artifacts.model_info import ModelInfo

    return ModelInfo(model=name, in_shape=[1, 28, 28], class_names=[str(i) for i in range(classes)],
                     mean=[33.3], std=[78.6], dataset="mnist")


def summary_shapes(model: nn.Module) -> dict[str, tuple]:
    from mnistflow.summary import layer_table

    return {r.name: r.shape for r in layer_table(model, (1, 28, 28)) if r.shape is not None}


@pytest.fixture(scope="module")
def trained(serve_model):
    from mnistflow.artifacts.load import load_any

    return load_any(serve_model)


def test_probabilities_equal_predict(serve_model, trained):
    import mnistflow

    model, info = trained
    x, _ = real_digits(5, start=300)
    for a in x:
        got = layers(model, info, a[..., None])
        want = mnistflow.predict(serve_model, a[None, ..., None])[0]["probabilities"]
        assert got[-1].name == "probabilities" and got[-1].kind == "softmax"
        assert np.abs(got[-1].values - np.array(want)).max() <= 1e-6


def test_trained_fast_layers_in_order_with_summary_shapes(trained):
    model, info = trained
    found = layers(model, info, digit())
    shapes = summary_shapes(model)
    names = [layer.name for layer in found[:-1]]
    assert names[:3] == ["features.0", "features.1", "features.2"]  # conv, pool, BN-ReLU
    assert [layer.kind for layer in found[:3]] == ["FastConv2d", "MaxPool2x2", "BatchNormReLU2d"]
    assert names[-1] == "head" and found[-2].shape == (10,)
    for layer in found[:-1]:
        assert layer.shape == shapes[layer.name] == layer.values.shape
        assert layer.values.dtype == np.float32 and not layer.truncated
    assert set(names) == set(shapes)
    # the last stage's BN-ReLU is non-negative; a conv map is not
    assert found[2].values.min() >= 0 and found[0].values.min() < 0


def test_seed_cnn_matches_summary_and_a_plain_forward():
    from mnistflow.models import create_model

    torch.manual_seed(0)
    model = create_model("seed-cnn", (1, 28, 28), 10).eval()
    found = layers(model, info_for("seed-cnn"), digit(1))
    shapes = summary_shapes(model)
    assert [layer.name for layer in found[:-1]] == list(shapes)  # every leaf, in call order
    assert all(layer.shape == shapes[layer.name] for layer in found[:-1])
    kinds = [layer.kind for layer in found]
    assert kinds[0].endswith("Conv2d") and "Linear" in kinds and kinds[-1] == "softmax"
    # the first conv's map is the convolution of the normalized input, recomputed here
    conv = dict(model.named_modules())[found[0].name]
    x = (torch.from_numpy(digit(1).copy()).permute(2, 0, 1)[None].float() - 33.3) / 78.6
    with torch.no_grad():
        want = conv(x)[0].numpy()
    assert np.abs(found[0].values - want).max() < 1e-5


@pytest.mark.parametrize("name", __import__("mnistflow.models", fromlist=["list_models"]).list_models())
def test_every_registered_model(name):
    """Every leaf module the forward calls, with summary's output shapes; the probabilities are
    the predictor's, bit for bit."""
    from mnistflow.artifacts.predictor import TorchBackend
    from mnistflow.models import create_model

    torch.manual_seed(0)
    model, info = create_model(name, (1, 28, 28), 10).eval(), info_for(name)
    predictor = TorchBackend(model, info)
    found = layers(predictor, info, digit(4))
    shapes, modules = summary_shapes(model), dict(model.named_modules())
    assert [layer.name for layer in found[:-1]] == [n for n in shapes if not any(modules[n].children())]
    assert all(layer.shape == shapes[layer.name] == layer.values.shape for layer in found[:-1])
    assert found[-1].kind == "softmax"
    assert np.array_equal(found[-1].values, predictor.predict(digit(4)[None])[0])
    assert np.abs(found[-1].values - layers(model, info, digit(4))[-1].values).max() < 1e-6


def test_ensemble_shows_every_member():
    from mnistflow.models import create_model

    model = create_model("lenet5-x3", (1, 28, 28), 10).eval()
    found = layers(model, info_for("lenet5-x3"), digit(2))
    members = {layer.name.split(".")[1] for layer in found[:-1]}
    assert members == {"0", "1", "2"}
    assert all(layer.name.startswith("members.") for layer in found[:-1])
    per = [[layer.name.split(".", 2)[2] for layer in found[:-1] if layer.name.split(".")[1] == k]
           for k in "012"]
    assert per[0] == per[1] == per[2] and len(per[0]) >= 5
    with torch.no_grad():
        x = (torch.from_numpy(digit(2).copy()).permute(2, 0, 1)[None].float() - 33.3) / 78.6
        want = model(x).float().softmax(1)[0].numpy()
    assert np.abs(found[-1].values - want).max() < 1e-6


def test_a_users_own_module_and_a_reused_relu():
    from helpers.custom_models import TinyNet

    class Reuses(nn.Module):  # one ReLU module called twice; an in-place ReLU after a conv
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3, padding=1)
            self.act = nn.ReLU(inplace=True)
            self.fc = nn.Linear(4 * 28 * 28, 10)

        def forward(self, x):
            return self.act(self.fc(self.act(self.conv(x)).flatten(1)))

    found = layers(TinyNet().eval(), info_for("tiny"), digit(3))
    assert [(layer.name, layer.kind, layer.shape) for layer in found] == [
        ("conv", "Conv2d", (8, 28, 28)), ("pool", "MaxPool2d", (8, 7, 7)), ("fc", "Linear", (10,)),
        ("probabilities", "softmax", (10,))]
    found = layers(Reuses().eval(), info_for("reuses"), digit(3))
    assert [layer.name for layer in found] == ["conv", "act", "fc", "act#2", "probabilities"]
    assert found[0].values.min() < 0  # the conv's own output, before the in-place ReLU
    assert np.array_equal(found[1].values, np.maximum(found[0].values, 0))


def test_other_threads_forwards_are_not_recorded(trained):
    """A server runs other requests on the same model while one asks for its layers: only the
    asking thread's forward is recorded."""
    import threading

    model, info = trained
    want = [(layer.name, layer.shape) for layer in layers(model, info, digit())]
    stop = threading.Event()

    def busy():
        x = torch.zeros(3, 1, 28, 28)
        with torch.inference_mode():
            while not stop.is_set():
                model(x)

    other = threading.Thread(target=busy)
    other.start()
    try:
        for i in range(10):
            assert [(layer.name, layer.shape) for layer in layers(model, info, digit(i))] == want
    finally:
        stop.set()
        other.join()


def test_bound_keeps_the_most_active_channels_of_the_widest_layers():
    from mnistflow.artifacts.layers import Layer

    assert budget([10, 20, 30], 100) == 30 and budget([10, 20, 30], 45) == 17
    maps = np.zeros((8, 4, 4), np.float32)
    maps[[1, 6]] = 5  # the two most active channels
    maps[3] = -2
    found = [Layer("small", "ReLU", (4,), np.ones(4, np.float32)),
             Layer("wide", "Conv2d", (8, 4, 4), maps.copy())]
    kept = bound(found, 4 + 50)  # 'wide' may keep 50 values: 3 channels of 16
    assert not kept[0].truncated and kept[0].values.size == 4
    assert kept[1].truncated and kept[1].channels == [1, 3, 6]
    assert np.array_equal(kept[1].values, maps[[1, 3, 6]])
    assert sum(layer.values.size for layer in kept) <= 54

    model = __import__("mnistflow.models", fromlist=["x"]).create_model("seed-cnn", (1, 28, 28), 10).eval()
    small = layers(model, info_for("seed-cnn"), digit(), max_values=20_000)
    assert sum(layer.values.size for layer in small) <= 20_000
    assert any(layer.truncated for layer in small) and not small[-1].truncated
    for layer in small:
        if layer.truncated:
            assert layer.values.shape == (len(layer.channels), *layer.shape[1:])


def test_kernel_and_its_errors(trained):
    model, info = trained
    conv = dict(model.named_modules())["features.0"]
    w, inputs = kernel(model, "features.0", 5)
    assert np.array_equal(w, conv.weight[5].detach().numpy()) and inputs == list(range(conv.in_channels))
    for name, k, why in [("nope", 0, "no layer named 'nope'"), ("head", 0, "not a convolution"),
                         ("features.0", conv.out_channels, "has channels 0.."),
                         ("features.0", -1, "has channels 0..")]:
        with pytest.raises(MnistflowError, match=why):
            kernel(model, name, k)


def test_onnx_and_a_wrong_image_are_refused(serve_model, trained, tmp_path):
    from mnistflow.artifacts.load import load_any
    from mnistflow.exporting import export

    model, info = trained
    with pytest.raises(MnistflowError, match="one uint8 28x28x1 image"):
        layers(model, info, digit()[..., 0])
    export(serve_model, "onnx", tmp_path / "m.onnx")
    backend, info = load_any(tmp_path / "m.onnx")
    with pytest.raises(MnistflowError, match="layers need the PyTorch model .*not an ONNX model"):
        layers(backend, info, digit())
    from mnistflow.artifacts.pt2 import ExportedModel

    with pytest.raises(MnistflowError, match="kernels need the PyTorch model .*not a .pt2 program"):
        kernel(ExportedModel(model), "program.features.0", 0)


def test_non_finite_activations_are_json_null():
    """A layer may overflow while the output stays finite (a clamp after it): its values are
    null in the answer, which stays valid JSON."""
    from mnistflow.artifacts.predictor import TorchBackend
    from mnistflow.server.app import layer_view

    class Overflows(nn.Module):
        def __init__(self):
            super().__init__()
            self.big = nn.Linear(784, 4)
            nn.init.constant_(self.big.weight, 1e38)  # 784 terms: past float32's range
            self.fc = nn.Linear(4, 10)

        def forward(self, x):
            return self.fc(torch.nan_to_num(self.big(x.flatten(1)), posinf=1.0, neginf=-1.0))

    pred = TorchBackend(Overflows().eval(), info_for("overflows"))
    d = layer_view(pred, json.dumps({"pixels": digit()[..., 0].tolist()}).encode(), "application/json", None)
    json.loads(json.dumps(d, allow_nan=False))  # what the server's JSONResponse does
    assert d["layers"][0]["name"] == "big" and None in d["layers"][0]["values"]
    assert abs(sum(d["probabilities"]) - 1) < 1e-5
    # float16: an infinity is float16's largest value, the answer still valid JSON
    import base64

    d = layer_view(pred, json.dumps({"pixels": digit()[..., 0].tolist()}).encode(), "application/json", None,
                   encoding="f16")
    json.loads(json.dumps(d, allow_nan=False))
    big = np.frombuffer(base64.b64decode(d["layers"][0]["values"]), "<f2")
    assert np.isin(np.abs(big[np.isfinite(big)]), [65504]).all() and len(big) == 4


# --- over HTTP ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def client(serve_model):
    import uvicorn
    from helpers.serving import uvicorn_thread

    from mnistflow.server import create_app

    app = create_app(serve_model)
    with uvicorn_thread(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2)) as port, \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
        yield c


def test_layers_endpoint(client, serve_model, trained):
    model, info = trained
    a = digit(7)[..., 0]
    r = client.post("/api/layers", json={"pixels": a.tolist()})
    assert r.status_code == 200, r.text
    d = r.json()
    want = layers(model, info, a[..., None])
    assert [x["name"] for x in d["layers"]] == [x.name for x in want]
    for got, exp in zip(d["layers"], want):
        assert got["kind"] == exp.kind and tuple(got["shape"]) == exp.shape
        assert len(got["values"]) == exp.values.size
        assert np.abs(np.array(got["values"]) - exp.values.ravel()).max() <= 5e-5 + 1e-6
    pred = client.post("/api/predict", json={"pixels": a.tolist()}).json()
    assert d["probabilities"] == pred["probabilities"] and d["preprocess"] == "none"
    assert d["truncated"] is False and d["latency_ms"] > 0


def test_layers_endpoint_gives_the_input_and_float16(client):
    """``?input=1``: the picture the model saw, as ``/api/predict?input=1`` gives it; the page's
    ``?encoding=f16``: each layer's values as base64 float16, equal to the JSON floats within
    float16's precision; the probabilities stay JSON numbers."""
    import base64

    from helpers.images import png

    a = digit(11)[..., 0]
    picture = png(255 - np.kron(a, np.ones((10, 10), np.uint8)))  # a 280x280 drawing, ink on paper
    img = {"Content-Type": "image/png"}
    seen = client.post("/api/predict?input=1", content=picture, headers=img).json()
    plain = client.post("/api/layers?input=1", content=picture, headers=img).json()
    assert plain["input"] == seen["input"] and plain["preprocess"] == seen["preprocess"] == "mnist"
    assert plain["probabilities"] == seen["probabilities"] and plain["encoding"] == "json"
    assert "input" not in client.post("/api/layers", content=picture, headers=img).json()
    half = client.post("/api/layers?input=1&encoding=f16", content=picture, headers=img).json()
    assert half["encoding"] == "f16" and half["input"] == seen["input"]
    assert half["probabilities"] == plain["probabilities"] == half["layers"][-1]["values"]
    for h, j in zip(half["layers"][:-1], plain["layers"][:-1]):
        assert (h["name"], h["kind"], h["shape"]) == (j["name"], j["kind"], j["shape"])
        got = np.frombuffer(base64.b64decode(h["values"]), "<f2").astype(np.float64)
        want = np.array(j["values"])
        assert got.shape == want.shape and np.allclose(got, want, rtol=1e-3, atol=1e-3), h["name"]
    r = client.post("/api/layers?encoding=f32", content=picture, headers=img)
    assert r.status_code == 422 and "json, f16" in r.json()["error"]


def test_kernel_endpoint_and_bad_requests(client, trained):
    model, _ = trained
    r = client.get("/api/kernel", params={"layer": "features.0", "channel": "3"})
    assert r.status_code == 200, r.text
    d = r.json()
    w = dict(model.named_modules())["features.0"].weight[3].detach().numpy()
    assert d["shape"] == list(w.shape) and np.abs(np.array(d["values"]) - w.ravel()).max() < 1e-6
    for params in ({"layer": "nope", "channel": "0"}, {"layer": "head", "channel": "0"},
                   {"layer": "features.0", "channel": "999"}, {"layer": "features.0", "channel": "x"},
                   {"layer": "features.0"}, {"layer": "x" * 5000, "channel": "1"}):
        r = client.get("/api/kernel", params=params)
        assert 400 <= r.status_code < 500 and r.json()["error"], (params, r.status_code)
    r = client.post("/api/layers", content=b"{" + b" " * (3 << 20) + b"}",
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "error" in r.json()
    r = client.post("/api/layers", json={"pixels": [[300]]})
    assert r.status_code == 422
    assert client.post("/api/layers", json={"pixels": digit()[..., 0].tolist()}).status_code == 200
