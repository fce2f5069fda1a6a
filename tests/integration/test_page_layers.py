"""The page's layers view in real headless Chromium (``helpers.browser``): every layer of the
served model for the drawing, live as it changes; a feature map's kernel on a click; the
dataset's words for an EMNIST-letters, a Fashion-MNIST and a CIFAR-10 model (small synthetic
record sets named after them, a model trained for two steps on each: the words and the views
depend on the dataset and the shapes, not on the accuracy).

The server runs in a thread of the test process (``create_app`` + uvicorn); the pages are saved
to ``test-artifacts/page-layers-*.png`` (1280x800 and a 390-pixel phone).
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
from helpers.browser import CHROMIUM_ARGS, draw, find_chromium, ink_runs, predicted, sync_api, watch
from helpers.cli import REPO
from helpers.images import png, real_digits

ARTIFACTS = REPO / "test-artifacts"
# what the page tells of each layer, read from the DOM in one go
LAYERS_JS = """() => Array.from(document.querySelectorAll('#layers .layer'), (el) => {
  const c = el.querySelector('canvas');
  return {name: el.dataset.name, kind: el.dataset.kind, head: el.querySelector('.layer-head').textContent,
          view: el.classList.contains('tiles') ? 'tiles' : el.classList.contains('strip') ? 'strip' : 'output',
          tiles: c && c.dataset.tiles ? +c.dataset.tiles : null, units: c && c.dataset.units ? +c.dataset.units : null,
          channels: c && c.dataset.channels ? c.dataset.channels.split(',').map(Number) : null,
          cols: el.querySelectorAll('.out-col').length};
})"""
# the pixels of every tile of one layer's canvas: [[r, g, b, ...] per tile]
TILES_JS = """(name) => {
  const c = document.querySelector(`#layers .layer[data-name="${name}"] canvas`), d = c.dataset;
  const tw = +d.tileW, th = +d.tileH, gap = +d.gap, cols = +d.cols, ctx = c.getContext('2d');
  return Array.from({length: +d.tiles}, (_, t) => Array.from(ctx.getImageData(
    (t % cols) * (tw + gap), Math.floor(t / cols) * (th + gap), tw, th).data));
}"""


@pytest.fixture(scope="module")
def browser():
    chromium = find_chromium()
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api().sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@contextlib.contextmanager
def served(run):
    """``run`` (a run directory or a ready predictor) served by the app ``mnistflow serve``
    runs, in a thread; yields its URL."""
    import uvicorn
    from helpers.serving import uvicorn_thread

    from mnistflow.server import create_app

    config = uvicorn.Config(create_app(run), log_level="warning", timeout_graceful_shutdown=2)
    with uvicorn_thread(config) as port:
        yield f"http://127.0.0.1:{port}/"


@contextlib.contextmanager
def opened(browser, url: str, width: int = 1280, height: int = 800, **kw):
    """A new page at ``url`` once its layers view is there (the layers of an empty picture, or
    why there are none)."""
    ctx = browser.new_context(viewport={"width": width, "height": height}, **kw)
    try:
        pg = ctx.new_page()
        watch(pg, url.rstrip("/"))
        pg.goto(url)
        pg.wait_for_function("() => document.getElementById('layers').childElementCount > 0")
        yield pg
        assert not pg.problems, pg.problems
    finally:
        ctx.close()


def painted(pg) -> int:
    return int(pg.locator("#layers").get_attribute("data-painted"))


def settle(pg, before: int) -> None:
    """Wait until a look after ``before`` is painted and the drawing is fully shown."""
    pg.wait_for_function(f"() => +document.getElementById('layers').dataset.painted > {before}"
                         " && document.getElementById('prediction').dataset.state === 'idle'", timeout=30_000)


@pytest.fixture(scope="module")
def mnist_url(serve_model):
    with served(serve_model) as url:
        yield url


def expected_layers(serve_model, digit: np.ndarray) -> list:
    from mnistflow.artifacts.layers import layers
    from mnistflow.artifacts.load import load_any

    model, info = load_any(serve_model)
    return layers(model, info, digit[..., None])


def test_the_layers_follow_the_stroke(browser, mnist_url, serve_model):
    """Every layer in order with its kind and shape; each feature map a tile (none blank for the
    first convolution), each unit of a 1-D layer a cell, the output as bars; a further stroke
    changes the tiles."""
    x, _ = real_digits(1, start=40)
    with opened(browser, mnist_url) as pg:
        runs = ink_runs(x[0])
        before = painted(pg)
        draw(pg, x[0], runs=runs[: len(runs) // 2])
        settle(pg, before)
        seen = np.array(pg.evaluate("() => Array.from(document.getElementById('seen').getContext('2d')"
                                    ".getImageData(0, 0, 28, 28).data)")).reshape(28, 28, 4)[..., 0]
        want = expected_layers(serve_model, seen.astype(np.uint8))
        shown = pg.evaluate(LAYERS_JS)
        assert [s["name"] for s in shown] == [w.name for w in want]
        for s, w in zip(shown, want):
            assert s["kind"] == w.kind and "×".join(map(str, w.shape)) in s["head"], s
            if s["view"] == "tiles":  # the first 128 maps (the most active), the rest behind a button
                assert s["tiles"] == min(w.shape[0], 128) == len(set(s["channels"])), s
                assert set(s["channels"]) <= set(range(w.shape[0])), s
            elif s["view"] == "strip":
                assert s["units"] == w.values.size, s
        assert shown[-1]["view"] == "output" and shown[-1]["cols"] == 10
        wide = next(w for w in want if len(w.shape) == 3 and w.shape[0] > 128)
        more = pg.locator(f'#layers .layer[data-name="{wide.name}"] button.more')
        assert more.inner_text() == f"show all {wide.shape[0]} channels"
        more.click()
        canvas = pg.locator(f'#layers .layer[data-name="{wide.name}"] canvas')
        assert int(canvas.get_attribute("data-tiles")) == wide.shape[0]
        assert sorted(map(int, canvas.get_attribute("data-channels").split(","))) == list(range(wide.shape[0]))
        first = pg.evaluate(TILES_JS, "features.0")
        assert len(first) == want[0].shape[0]
        assert all(np.ptp(np.array(t).reshape(-1, 4)[:, 0]) > 0 for t in first)  # no blank map
        before = painted(pg)
        draw(pg, x[0], runs=runs[len(runs) // 2:])
        settle(pg, before)
        after = pg.evaluate(TILES_JS, "features.0")
        changed = sum(a != b for a, b in zip(first, after))
        assert changed >= len(first) // 2, changed
        pg.screenshot(path=str(ARTIFACTS / "page-layers-1280.png"))


def test_a_click_on_a_map_shows_its_kernel(browser, mnist_url, serve_model):
    from mnistflow.artifacts.load import load_any

    model, _ = load_any(serve_model)
    x, _ = real_digits(1, start=41)
    with opened(browser, mnist_url) as pg:
        before = painted(pg)
        draw(pg, x[0])
        settle(pg, before)
        canvas = pg.locator('#layers .layer[data-name="features.0"] canvas')
        channels = [int(c) for c in canvas.get_attribute("data-channels").split(",")]
        tw, gap = int(canvas.get_attribute("data-tile-w")), int(canvas.get_attribute("data-gap"))
        canvas.click(position={"x": tw + gap + tw // 2, "y": tw // 2})  # the second tile
        panel = pg.locator('.layer[data-name="features.0"] .kernel')
        pg.wait_for_function("() => { const k = document.querySelector('.layer[data-name=\"features.0\"] .kernel');"
                             " return !k.hidden && k.dataset.state === 'idle'; }")
        assert panel.locator(".ktitle").inner_text() == f"features.0, channel {channels[1]}"
        w = dict(model.named_modules())["features.0"].weight[channels[1]].detach().numpy()
        tiles = panel.locator("canvas.kernel-tiles")
        assert int(tiles.get_attribute("data-tiles")) == w.shape[0]
        text = panel.inner_text()
        assert f"{w.shape[1]}×{w.shape[2]} weights" in text and "blue negative, red positive" in text
        # a pooling layer has no kernel: the page says so plainly
        pool = pg.locator('#layers .layer[data-name="features.1"] canvas')
        pool.scroll_into_view_if_needed()
        pool.click(position={"x": 3, "y": 3})
        plain = pg.locator('.layer[data-name="features.1"] .kernel .plain')
        plain.wait_for()
        assert "not a convolution" in plain.inner_text() and "no weights of its own" in plain.inner_text()
        assert pg.locator(".kernel:not([hidden])").count() == 1  # one panel open at a time
        pg.problems = [p for p in pg.problems if "422" not in p]  # the kernel asked of the pooling layer


def test_phone_width(browser, mnist_url):
    """At 390 pixels nothing is wider than the screen, and a finger's stroke updates the layers."""
    x, y = real_digits(1, start=42)
    with opened(browser, mnist_url, 390, 844, has_touch=True, is_mobile=True) as pg:
        before = painted(pg)
        draw(pg, x[0], touch=pg.context.new_cdp_session(pg))
        settle(pg, before)
        assert predicted(pg)[0] == y[0]
        assert pg.evaluate("document.documentElement.scrollWidth") <= 390
        wide = pg.evaluate("() => Array.from(document.querySelectorAll('#layers canvas'))"
                           ".filter((c) => c.getBoundingClientRect().right > 390).length")
        assert wide == 0
        pg.screenshot(path=str(ARTIFACTS / "page-layers-390.png"), full_page=True)


def test_an_onnx_model_predicts_without_layers(browser, serve_model, tmp_path):
    """ONNX Runtime has no layers to show: the page says so once and still predicts."""
    from helpers.cli import run_cli

    onnx = tmp_path / "m.onnx"
    proc = run_cli("export", str(serve_model), "--format", "onnx", "--out", str(onnx))
    assert proc.returncode == 0, proc.stderr
    x, y = real_digits(1, start=44)
    with served(onnx) as url, opened(browser, url) as pg:
        assert "No layers to show" in pg.locator("#layers").inner_text()
        draw(pg, x[0])
        assert predicted(pg)[0] == y[0]
        assert pg.locator("#m-backend").inner_text() == "ONNX Runtime"
        assert "No layers to show" in pg.locator("#layers").inner_text()
        assert pg.locator("#layers canvas").count() == 0
        assert len(pg.problems) == 1 and "501" in pg.problems[0], pg.problems  # asked once
        pg.problems = []


def test_an_ensemble_shows_each_member(browser):
    """``lenet5-x3`` (untrained: the layout does not depend on the weights): each member's
    layers under its own heading, named as in the model, then the ensemble's probabilities."""
    import torch

    from mnistflow.artifacts.model_info import ModelInfo
    from mnistflow.artifacts.predictor import TorchBackend
    from mnistflow.models import create_model

    torch.manual_seed(0)
    info = ModelInfo(model="lenet5-x3", in_shape=[1, 28, 28], class_names=[str(i) for i in range(10)],
                     mean=[33.3], std=[78.6], dataset="mnist")
    with served(TorchBackend(create_model("lenet5-x3", (1, 28, 28), 10), info)) as url, \
            opened(browser, url) as pg:
        members = pg.locator("#layers details.member")
        assert members.count() == 3
        for i in range(3):
            member = members.nth(i)
            assert member.locator("summary").inner_text() == f"member {i}"
            names = member.locator(".layer").evaluate_all("els => els.map((e) => e.dataset.name)")
            shown = member.locator(".layer .lname").evaluate_all("els => els.map((e) => e.textContent)")
            assert names and all(n == f"members.{i}.{s}" for n, s in zip(names, shown)), (names, shown)
        assert members.nth(0).evaluate("d => d.open") and not members.nth(1).evaluate("d => d.open")
        last = pg.locator("#layers > .layer")
        assert last.count() == 1 and last.get_attribute("data-name") == "probabilities"
        pg.screenshot(path=str(ARTIFACTS / "page-layers-ensemble.png"), full_page=True)


# --- the dataset's words --------------------------------------------------------------------

FAMILY = {  # name: (channels, size, class names)
    "emnist-letters": (1, 28, [chr(ord("a") + k) for k in range(26)]),
    "fashion-mnist": (1, 28, ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                              "Sneaker", "Bag", "Ankle boot"]),
    "cifar10": (3, 32, ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                        "truck"]),
}


@pytest.fixture(scope="module")
def family_run(tmp_path_factory):
    """``family_run(name)``: a ``fast`` model trained for two steps on synthetic records named
    ``name`` (made once per name)."""
    from helpers.synthetic import digits

    from mnistflow.data.formats.raw import RawDataset, RawSplit
    from mnistflow.data.write_records import write_records
    from mnistflow.training.api import train

    out, made = tmp_path_factory.mktemp("family"), {}

    def make(name: str) -> Path:
        if name not in made:
            c, size, names = FAMILY[name]
            xtr, ytr = digits(800, classes=len(names), size=size, channels=c)
            xte, yte = digits(100, classes=len(names), size=size, channels=c, seed=7)
            raw = RawDataset(name, names, RawSplit(xtr, ytr), RawSplit(xte, yte))
            data = write_records(raw, out / name, key=name, options={}, source_checksums={}, val_size=50)
            made[name] = out / f"{name}-run"
            train(recipe="fast", data=data, run_dir=made[name], max_steps=2, quiet=True, threads=1,
                  tensorboard=False)
        return made[name]

    return make


def test_emnist_letters_say_draw_a_letter(browser, family_run, tmp_path):
    import httpx

    with served(family_run("emnist-letters")) as url:
        m = httpx.get(url + "api/model").json()
        assert m["picture"] == "emnist" and m["class_names"] == FAMILY["emnist-letters"][2]
        with opened(browser, url) as pg:
            assert pg.locator("h1").inner_text() == "Draw a letter"
            assert "26 classes: a, b, c" in pg.locator("#subtitle").inner_text()
            assert pg.locator("#upload-first").is_hidden() and pg.locator("#pad").is_visible()
            assert "EMNIST" in pg.locator("#how").inner_text()
            x, _ = real_digits(1, start=43)
            before = painted(pg)
            draw(pg, x[0])
            settle(pg, before)
            label, text = predicted(pg)
            assert text in m["class_names"] and label == m["label_values"][m["class_names"].index(text)]
            assert pg.locator("#bars .bar-row").count() == 26
            assert pg.locator("#layers .layer.output .out-col").count() == 26


@pytest.mark.parametrize("name, title, drawable", [("fashion-mnist", "Upload a picture of clothing", True),
                                                   ("cifar10", "Upload a photo", False)])
def test_pictures_and_photos_are_uploaded_first(browser, family_run, tmp_path, name, title, drawable):
    import httpx

    c, size, names = FAMILY[name]
    with served(family_run(name)) as url:
        m = httpx.get(url + "api/model").json()
        assert m["picture"] == {"fashion-mnist": "fashion", "cifar10": "resize"}[name]
        with opened(browser, url) as pg:
            assert pg.locator("h1").inner_text() == title
            assert pg.locator("#upload-first").is_visible() and pg.locator("#upload-label").is_hidden()
            assert pg.locator("#polarity").is_visible() == drawable
            box = pg.locator("#pad").bounding_box()
            pg.mouse.move(box["x"] + 60, box["y"] + 60)  # a stroke: drawn for grey models only
            pg.mouse.down()
            pg.mouse.move(box["x"] + 200, box["y"] + 200, steps=5)
            pg.mouse.up()
            if drawable:
                assert predicted(pg)[1] in names
            else:
                pg.wait_for_timeout(500)
                assert pg.locator("#prediction").get_attribute("data-label") == "" and painted(pg) == 0
            rng = np.random.default_rng(0)
            picture = rng.integers(0, 256, (64, 48, 3) if c == 3 else (64, 48), dtype=np.uint8)
            f = tmp_path / "picture.png"
            f.write_bytes(png(picture))
            before = painted(pg)
            pg.set_input_files("#upload", str(f))
            settle(pg, before)
            assert pg.locator("#prediction").inner_text() in names
            first = pg.locator("#layers .layer").first
            assert first.get_attribute("data-name") == "features.0"
            assert int(first.locator("canvas").get_attribute("data-tiles")) > 0
            if c == 3:  # what the model sees is in colour
                seen = np.array(pg.evaluate("() => Array.from(document.getElementById('seen').getContext('2d')"
                                            f".getImageData(0, 0, {size}, {size}).data)")).reshape(size, size, 4)
                assert np.abs(seen[..., 0].astype(int) - seen[..., 1]).max() > 0
            pg.screenshot(path=str(ARTIFACTS / f"page-layers-{name}.png"))
