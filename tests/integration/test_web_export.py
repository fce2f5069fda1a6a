"""``mnistflow export RUN --format web`` in Debian's Chromium (Playwright), against PyTorch.

Every registered model (random weights, random batch-norm statistics) exported and served by a
plain static file server: ``window.mnistflow.predict`` equals ``torch_probabilities`` within
1e-4 and ``layers`` equals ``artifacts.layers.layers`` (names, kinds, shapes, values). The
trained ``fast`` model of the serve tests on the real MNIST test set: top-1 equal to
``predict``'s on at least 99.5% of the images, probabilities within 1e-4 (the worst case is
printed). The page asks nothing of any other origin, and works from disk (``file://``).
Needs ``apt-get install -y chromium`` (as tests/integration/test_serve_browser.py).
"""
from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from helpers.browser import CHROMIUM_ARGS, draw, find_chromium, predicted, sync_api, watch
from helpers.cli import run_cli
from helpers.images import png, real_digits
from helpers.web import layers_of, open_page, predict_all, static_server
from mnistflow.artifacts.layers import kernel, layers
from mnistflow.artifacts.model_info import ModelInfo
from mnistflow.artifacts.predictor import TorchBackend
from mnistflow.models import create_model, list_models

ACCEPTANCE_IMAGES = 10_000  # the whole MNIST test set (~35 s for fast on the 2-core CI machine)


@pytest.fixture(scope="module")
def browser():
    with sync_api().sync_playwright() as p:
        b = p.chromium.launch(executable_path=find_chromium(), args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


def random_model(name: str, shape: tuple[int, int, int]) -> torch.nn.Module:
    """Registered model ``name`` with random weights and random batch-norm statistics (so that
    batch norm is no identity), in eval mode."""
    from helpers.custom_models import Everything

    torch.manual_seed(0)
    model = (Everything() if name == "Everything" else create_model(name, shape, 10)).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return model


def write_page(model, info: ModelInfo, folder) -> None:
    from mnistflow.artifacts.web.folder import page_files, write_folder
    from mnistflow.artifacts.web.trace import trace
    from mnistflow.data.normalize import normalize

    c, h, w = info.in_shape
    write_folder(folder, page_files(trace(model, normalize(np.zeros((1, h, w, c), np.uint8), info.mean,
                                                           info.std)), model, info))


def close_layers(got: list[dict], want: list, tol: float = 1e-4) -> None:
    """The page's layers are ``artifacts.layers``' (none truncated here): names, kinds, shapes,
    and values within ``tol`` of each layer's scale."""
    assert [(g["name"], g["kind"], tuple(g["shape"])) for g in got] == [(w.name, w.kind, w.shape) for w in want]
    for g, w in zip(got, want):
        assert not w.truncated
        scale = max(1.0, float(np.abs(w.values).max(initial=0)))
        assert np.abs(g["values"] - w.values).max(initial=0) <= tol * scale, g["name"]


CASES = [(name, (1, 28, 28)) for name in list_models()] + [
    ("lenet5-x3", (1, 28, 28)), ("fast", (3, 32, 32)), ("resnet-small", (3, 32, 32)),
    ("Everything", (1, 28, 28))]  # a user's forward of functional operations (helpers.custom_models)


@pytest.mark.parametrize("name, shape", CASES, ids=[f"{n}-{'x'.join(map(str, s))}" for n, s in CASES])
def test_every_registered_model_matches_pytorch(name, shape, browser, tmp_path):
    c, h, w = shape
    model = random_model(name, shape)
    info = ModelInfo(model=name, in_shape=list(shape), class_names=[f"c{i}" for i in range(10)],
                     mean=[33.3, 120.0, 90.0][:c], std=[78.6, 60.0, 65.0][:c], dataset="mnist" if c == 1 else "cifar10")
    x = np.random.default_rng(0).integers(0, 256, (4, h, w, c), dtype=np.uint8)
    if c == 1:
        x = np.concatenate([real_digits(2, start=7)[0][..., None], x])
    write_page(model, info, tmp_path / "page")
    with static_server(tmp_path / "page") as origin:
        page = open_page(browser, f"{origin}/index.html")
        got, _ = predict_all(page, x)
        want = TorchBackend(model, info).predict(x)
        assert np.abs(got - want).max() <= 1e-4 and (got.argmax(1) == want.argmax(1)).all()
        close_layers(layers_of(page, x[0]), layers(model, info, x[0]))
        assert not page.problems, page.problems
        page.close()


@pytest.mark.parametrize("dataset, picture", [("emnist-letters", "emnist"), ("fashion-mnist", "fashion")])
def test_a_dataset_of_letters_or_clothes_speaks_its_words(dataset, picture, browser, tmp_path):
    """The page's info() carries the dataset's class names, label values and way of making a
    picture one of its images (an EMNIST-style and a Fashion-MNIST-style model)."""
    from mnistflow.artifacts.web.folder import model_json
    from mnistflow.data.known import KNOWN

    known = KNOWN[dataset]
    k = len(known.class_names)
    torch.manual_seed(0)
    model = create_model("lenet5", (1, 28, 28), k).eval()
    info = ModelInfo(model="lenet5", in_shape=[1, 28, 28], class_names=list(known.class_names), mean=[40.0],
                     std=[80.0], dataset=dataset, label_values=list(known.label_values) or None)
    write_page(model, info, tmp_path / "page")
    x = np.random.default_rng(1).integers(0, 256, (2, 28, 28, 1), dtype=np.uint8)
    with static_server(tmp_path / "page") as origin:
        page = open_page(browser, f"{origin}/index.html")
        got = page.evaluate("window.mnistflow.info()")
        probs, _ = predict_all(page, x)
        page.close()
    assert got == model_json(info, sum(p.numel() for p in model.parameters()))
    assert got["picture"] == picture and got["class_names"] == list(known.class_names) and got["num_classes"] == k
    assert got["label_values"] == (list(known.label_values) or list(range(k)))
    assert np.abs(probs - TorchBackend(model, info).predict(x)).max() <= 1e-4


@pytest.fixture(scope="module")
def exported(serve_model, tmp_path_factory):
    """The trained ``fast`` model exported by the CLI, as a user would."""
    out = tmp_path_factory.mktemp("web") / "fast-web"
    proc = run_cli("export", str(serve_model), "--format", "web", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "verified on" in proc.stdout and sorted(p.name for p in out.iterdir()) == [
        "app.js", "backend.js", "index.html", "model.js", "style.css"]
    return out


@pytest.fixture(scope="module")
def trained(serve_model):
    from mnistflow.artifacts.load import load_any

    return load_any(serve_model)


def test_the_trained_model_matches_predict_on_the_mnist_test_set(exported, trained, browser, capsys):
    from mnistflow.artifacts.predictor import predict_arrays

    model, info = trained
    x, _ = real_digits(ACCEPTANCE_IMAGES)
    x = x[..., None]
    with static_server(exported) as origin:
        page = open_page(browser, f"{origin}/index.html")
        got, ms = predict_all(page, x)
        others = [u for u in page.requests if not u.startswith((origin + "/", "data:", "blob:"))]
        assert not others and not page.problems, (others, page.problems)
        page.close()
    want = predict_arrays(model, info, x)
    agree = float((got.argmax(1) == want.argmax(1)).mean())
    diff = np.abs(got - want).max(1)
    worst = int(diff.argmax())
    with capsys.disabled():
        print(f"\nweb export vs predict on {len(x):,} MNIST test images: top-1 agrees on {100 * agree:.2f}%, "
              f"max |prob diff| {diff[worst]:.2e} (image {worst}), {ms:.2f} ms/image in Chromium")
    assert agree >= 0.995 and diff[worst] <= 1e-4


def test_the_page_answers_look_kernel_info_and_refuses_bad_input(exported, trained, browser):
    from mnistflow.artifacts.web.folder import model_json

    model, info = trained
    digit = real_digits(1, start=42)[0][0]
    with static_server(exported) as origin:
        page = open_page(browser, f"{origin}/index.html")
        assert page.evaluate("window.mnistflow.info()") == model_json(info, sum(p.numel() for p in model.parameters()))
        looked = page.evaluate("""async (b64) => {
            const blob = new Blob([Uint8Array.from(atob(b64), (c) => c.charCodeAt(0))], {type: "image/png"});
            const [a, b] = [await window.mnistflow.look(blob), await window.mnistflow.look(blob, "as-is")];
            const p = await window.mnistflow.predict(a.input);
            return [a, b].map((r) => ({input: Array.from(r.input), preprocess: r.preprocess, p: r.probabilities,
                                      layers: r.layers.map((l) => l.name), same: p.every((v, i) => v === r.probabilities[i])}));
        }""", base64.b64encode(png(digit)).decode())
        for r, how in zip(looked, ("none", "as-is")):  # a test image as a PNG is one of the dataset's images
            assert np.array_equal(np.array(r["input"]), digit.ravel()) and r["preprocess"] == how and r["same"]
            assert r["layers"] == [layer.name for layer in layers(model, info, digit[..., None])]
        k = page.evaluate("async () => { const k = await window.mnistflow.kernel('features.0', 5);"
                          " return {...k, values: Array.from(k.values)}; }")
        weights, inputs = kernel(model, "features.0", 5)
        assert k["shape"] == list(weights.shape) and k["input_channels"] == inputs and k["layer"] == "features.0"
        assert np.array_equal(np.array(k["values"], np.float32), weights.ravel())
        errors = page.evaluate("""async () => {
            const tries = [() => window.mnistflow.kernel('features.1', 0), () => window.mnistflow.kernel('nope', 0),
                           () => window.mnistflow.kernel('features.0', 32), () => window.mnistflow.predict([1, 2]),
                           () => window.mnistflow.predict(new Array(784).fill(256)), () => window.mnistflow.look('x')];
            const out = [];
            for (const t of tries) { try { await t(); out.push(null); } catch (e) { out.push(e.message); } }
            return out;
        }""")
        assert errors == [
            "layer 'features.1' is a MaxPool2x2, not a convolution: only convolutions have kernels",
            "no layer named 'nope' in this model", "layer 'features.0' has channels 0..31, not 32",
            "pixels must hold 784 values (28x28x1, row-major), got 2", "pixels must be integers 0..255; value 0 is 256",
            "look takes a picture: a Blob (a PNG of the canvas, or a file)"]
        page.close()


def test_the_page_works_from_disk(exported, browser):
    digit = real_digits(1, start=3)[0][0][..., None]
    with static_server(exported) as origin:
        page = open_page(browser, f"{origin}/index.html")
        served, _ = predict_all(page, digit[None])
        page.close()
    page = open_page(browser, (exported / "index.html").as_uri())
    from_disk, _ = predict_all(page, digit[None])
    assert np.array_equal(from_disk, served) and all(u.startswith("file://") or u.startswith("data:")
                                                     for u in page.requests)
    page.close()


def test_the_exported_page_draws_predicts_and_shows_layers(exported, trained, browser):
    """The same page as `serve`'s, with no server: a digit drawn on the pad is named as
    `predict` names the picture the page prepared, and every layer is painted."""
    digit = real_digits(1, start=0)[0][0]
    with static_server(exported) as origin:
        pg = browser.new_page(viewport={"width": 1280, "height": 800})
        watch(pg, origin)
        pg.goto(f"{origin}/index.html")
        pg.wait_for_function("() => document.getElementById('layers').childElementCount > 0")
        draw(pg, digit)
        label, _ = predicted(pg)
        seen = np.array(pg.evaluate("() => Array.from(document.getElementById('seen').getContext('2d')"
                                    ".getImageData(0, 0, 28, 28).data)"), np.uint8).reshape(28, 28, 4)[..., :1]
        names = pg.evaluate("() => Array.from(document.querySelectorAll('#layers .layer'))"
                            ".map((e) => e.dataset.name)")
        assert not pg.problems, pg.problems
        pg.close()
    model, info = trained
    expected = layers(model, info, seen)
    assert label == info.label(int(expected[-1].values.argmax()))
    assert names == [layer.name for layer in expected]  # every layer, the probabilities last
