"""``server/static/web/prepare.js`` (the exported page's way from a picture to the model's input)
in Debian's chromium against the server's Python (``inputs.decode_image``, then
``data.picture.prepare`` or ``as_is``): the same pixels and the same ``preprocess`` word for
drawings made with Pillow, colour pictures, a blank one, real MNIST test images, a picture over
``WORK_SIDE``, for every style and for grey and colour targets; and the same prediction by a
trained model.

prepare.js ports Pillow's LANCZOS resize and box reduce with their fixed-point arithmetic and
pass order (Pillow 13's, the one ``scripts/setup.sh`` installs), so its pixels are expected to
equal Python's: the worst difference measured here is 0 everywhere. ``MAX_DIFF`` still allows
one grey level: JS's ``Math.sin`` may differ from C's in its last bit, which can move a
fixed-point filter weight by one unit, and chromium keeps a decoded picture's colour
premultiplied by its alpha (a half-transparent pixel may come back one level off before it is
flattened). Each picture reaches prepare.js twice: as its own RGBA (prepare.js alone) and
decoded by chromium from its PNG, as the exported page does (``createImageBitmap``).
"""
from __future__ import annotations

import base64
import io
import zlib
from pathlib import Path

import numpy as np
import pytest
from helpers.browser import blank_page
from helpers.images import drawn_digit, png, real_digits

import mnistflow.server
from mnistflow.data.picture import Target, as_is, prepare
from mnistflow.server.inputs import decode_image

PREPARE_JS = Path(mnistflow.server.__file__).parent / "static" / "web" / "prepare.js"
MAX_DIFF = 1  # grey levels at any pixel, prepare.js vs Python (measured: 0)
MAX_MEAN_DIFF = 0.05  # mean |diff| over one input, same (measured: 0)

# (channels, height, width), picture style, dark background: every style, a light-background
# dataset, a larger and a non-square grey model, and a colour one.
TARGETS = [((1, 28, 28), "mnist", True), ((1, 28, 28), "emnist", True), ((1, 28, 28), "fashion", True),
           ((1, 28, 28), "resize", True), ((1, 28, 28), "mnist", False), ((1, 32, 32), "mnist", True),
           ((1, 28, 20), "emnist", True), ((3, 32, 32), "resize", True)]
# the other modes: as-is (``predict --as-is``) for a grey and a colour model, and a forced style
MODES = [((1, 28, 28), "mnist", True, "as-is"), ((3, 32, 32), "resize", True, "as-is"),
         ((1, 28, 28), "mnist", True, "fashion"), ((1, 28, 28), "fashion", True, "resize")]


def _coloured(grey: np.ndarray, ink=(20, 40, 200), paper=(255, 255, 255)) -> np.ndarray:
    """A grey drawing (dark ink on white) in colour: ink and paper blended by darkness."""
    t = (255 - grey.astype(np.float32))[..., None] / 255
    return np.clip(np.array(paper) * (1 - t) + np.array(ink) * t + 0.5, 0, 255).astype(np.uint8)


def _photo(rng, h: int, w: int) -> np.ndarray:
    """A colour picture with no ink: smooth random colour fields plus noise."""
    from PIL import Image

    smooth = np.asarray(Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((w, h)))
    return np.clip(smooth.astype(int) + rng.integers(-12, 13, smooth.shape), 0, 255).astype(np.uint8)


def _pictures() -> dict[str, np.ndarray]:
    """Every picture the browser is given: uint8 (H, W) grey, (H, W, 3) or (H, W, 4)."""
    rng = np.random.default_rng(39)
    mnist, _ = real_digits(2, start=7)
    canvas = drawn_digit(3)
    stroke = drawn_digit(4, canvas=(280, 280), box=(100, 60, 200, 240))
    transparent = np.zeros((280, 280, 4), np.uint8)
    transparent[..., 3] = 255 - stroke  # black ink on a transparent canvas, antialiased edges
    return {
        "black on white, off-centre": canvas,
        "canvas PNG (RGBA, opaque)": np.dstack([canvas] * 3 + [np.full_like(canvas, 255)]),
        "white on black": drawn_digit(2, ink=255, paper=0),
        "grey paper": drawn_digit(5, ink=40, paper=170, canvas=(300, 300), box=(150, 150, 280, 290)),
        "tall stroke": drawn_digit(1, canvas=(200, 400), box=(90, 20, 110, 380), width=14),
        "wide stroke": drawn_digit(7, canvas=(500, 200), box=(20, 80, 480, 120), width=12),
        "small and thin": drawn_digit(6, canvas=(40, 30), box=(8, 4, 30, 26), width=3),
        "blue ink (RGB)": _coloured(drawn_digit(8, canvas=(320, 240), box=(200, 10, 300, 200))),
        "transparent canvas": transparent,
        "half-transparent blue": np.dstack([_coloured(stroke), 255 - (stroke.astype(int) * 7 // 8).astype(np.uint8)]),
        "photo-like colour": _photo(rng, 113, 150),
        "blank": np.full((280, 280), 255, np.uint8),
        "MNIST test image": mnist[0],
        "MNIST test image, inverted": 255 - mnist[1],
        "colour 32x32": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
        "over WORK_SIDE (RGB)": _coloured(drawn_digit(9, canvas=(2100, 400), box=(300, 30, 600, 380), width=40),
                                          ink=(0, 0, 0), paper=(250, 240, 230)),
    }


JS_RUN = """async ({cases, targets}) => {
  const bytes = async (s) => new Uint8Array(await (await fetch("data:;base64," + s)).arrayBuffer());
  const inflate = async (s) => new Uint8Array(await new Response(
    new Blob([await bytes(s)]).stream().pipeThrough(new DecompressionStream("deflate"))).arrayBuffer());
  const b64 = (a) => { let s = ""; for (let i = 0; i < a.length; i += 8192)
    s += String.fromCharCode(...a.subarray(i, i + 8192)); return btoa(s); };
  const out = [];
  for (const c of cases) {
    const raw = new ImageData(new Uint8ClampedArray((await inflate(c.rgba)).buffer), c.w, c.h);
    const bmp = await createImageBitmap(new Blob([await bytes(c.png)], {type: "image/png"}));
    const ctx = new OffscreenCanvas(bmp.width, bmp.height).getContext("2d");
    ctx.drawImage(bmp, 0, 0);
    const decoded = ctx.getImageData(0, 0, bmp.width, bmp.height);
    for (const t of targets) {
      const [r, d] = [raw, decoded].map((im) => {
        const got = window.mnistflowPrepare(im, t.target, t.mode);
        return {pixels: b64(got.pixels), preprocess: got.preprocess};
      });
      out.push({raw: r, decoded: d});
    }
  }
  return out;
}"""


def _b64(a: bytes) -> str:
    return base64.b64encode(a).decode()


def _js_target(shape, style, dark) -> dict:
    c, h, w = shape
    return {"height": h, "width": w, "channels": c, "picture": style, "background": "dark" if dark else "light"}


def _python(data: bytes, shape: tuple[int, int, int], style: str, dark: bool, mode: str | None):
    img = decode_image(data)
    if mode == "as-is":
        return as_is(img, shape), "none"
    return prepare(img, Target(shape, style, dark), mode or "auto")


@pytest.fixture(scope="module")
def page():
    with blank_page() as pg:
        pg.add_script_tag(content=PREPARE_JS.read_text())
        yield pg
        assert not pg.problems, pg.problems


def _run(page, pictures: dict[str, np.ndarray], targets: list) -> list[dict]:
    """Every picture x target through Python and prepare.js (the picture's own RGBA, and its PNG
    decoded by chromium): one row per pair, with Python's (pixels, preprocess) and the JS ones."""
    from PIL import Image

    cases, rows = [], []
    for name, a in pictures.items():
        data = png(a)
        rgba = np.asarray(Image.open(io.BytesIO(data)).convert("RGBA"))
        cases.append({"png": _b64(data), "rgba": _b64(zlib.compress(rgba.tobytes(), 1)),
                      "w": rgba.shape[1], "h": rgba.shape[0]})
        rows += [{"picture": name, "target": t, "python": _python(data, *t)} for t in targets]
    js = page.evaluate(JS_RUN, {"cases": cases, "targets": [
        {"target": _js_target(*t[:3]), "mode": t[3]} for t in targets]})
    for row, got in zip(rows, js):
        c, h, w = row["target"][0]
        for which in ("raw", "decoded"):
            got[which]["pixels"] = np.frombuffer(base64.b64decode(got[which]["pixels"]), np.uint8).reshape(h, w, c)
        row.update(got)
    return rows


def _worst(rows: list[dict], which: str) -> tuple[float, int]:
    """The largest mean and max |JS - Python| over ``rows``; the shapes and ``preprocess``
    words must be equal."""
    mean, most = 0.0, 0
    for row in rows:
        want, used = row["python"]
        got = row[which]
        assert got["pixels"].shape == want.shape, (row["picture"], row["target"])
        assert got["preprocess"] == used, (row["picture"], row["target"], got["preprocess"], used)
        d = np.abs(got["pixels"].astype(int) - want.astype(int))
        mean, most = max(mean, float(d.mean())), max(most, int(d.max()))
    return mean, most


def test_prepare_js_matches_python_for_every_picture_and_target(page):
    """Every picture x every target (auto, and the other modes): the same shape, pixels and
    ``preprocess`` word as Python."""
    rows = _run(page, _pictures(), [(*t, None) for t in TARGETS] + MODES)
    worst = {which: _worst(rows, which) for which in ("raw", "decoded")}
    print("\nprepare.js vs Python, worst (mean |diff|, max |diff|):", worst)
    for mean, most in worst.values():
        assert mean <= MAX_MEAN_DIFF and most <= MAX_DIFF, worst
    used = {(r["picture"], r["target"][0], r["target"][1], r["python"][1]) for r in rows if r["target"][3] is None}
    for expected in [("MNIST test image", (1, 28, 28), "mnist", "none"),  # a dataset image is used as is
                     ("colour 32x32", (3, 32, 32), "resize", "none"),
                     ("MNIST test image, inverted", (1, 28, 28), "mnist", "mnist"),  # wrong polarity: made again
                     ("blank", (1, 28, 28), "emnist", "emnist"),
                     ("photo-like colour", (3, 32, 32), "resize", "resize")]:
        assert expected in used, expected
    blank = next(r for r in rows if r["picture"] == "blank" and r["target"][1] == "mnist")
    assert not blank["raw"]["pixels"].any()


def test_prepare_js_resizes_as_pillow_at_any_size(page):
    """Random pictures of random sizes, grey and colour, each resized whole ("resize", and as-is):
    both of Pillow's pass orders, upscaling and downscaling, all equal to Python's."""
    rng = np.random.default_rng(7)
    pictures = {}
    for i in range(24):
        h, w = (int(v) for v in rng.integers(5, 260, 2))
        photo = _photo(rng, h, w)
        pictures[f"random {h}x{w} #{i}"] = photo if i % 2 else photo.mean(-1).astype(np.uint8)
    sizes = [a.shape[:2] for a in pictures.values()]
    vertical_first = [(h, w) for h, w in sizes if h > 28 and 2 * (w - 28) < h - 28]  # Pillow 13's rule
    assert len(vertical_first) >= 3 and sum(h < 28 or w < 28 for h, w in sizes) >= 3, sizes
    rows = _run(page, pictures, [((1, 28, 28), "resize", True, None), ((3, 32, 32), "resize", True, None),
                                 ((1, 28, 28), "resize", True, "as-is"), ((1, 20, 36), "resize", False, None)])
    mean, most = _worst(rows, "raw")
    assert mean <= MAX_MEAN_DIFF and most <= MAX_DIFF, (mean, most)


def test_prepare_js_refuses_in_one_line(page):
    """A picture too small to classify: an Error with the server's words for its 400; an
    unknown mode or target: an Error of one line."""
    from mnistflow.artifacts.model_info import ModelInfo
    from mnistflow.server.guard import BadInput
    from mnistflow.server.inputs import to_input

    def error(w, h, target, mode=None):
        return page.evaluate("""([w, h, target, mode]) => {
            try { window.mnistflowPrepare(new ImageData(w, h), target, mode); return null; }
            catch (e) { return e.message; } }""", [w, h, target, mode])

    info = ModelInfo(model="m", in_shape=[1, 28, 28], class_names=list("0123456789"), mean=[33.3], std=[78.6],
                     dataset="mnist")
    with pytest.raises(BadInput) as server:
        to_input(np.zeros((50, 3), np.uint8), info)
    grey = _js_target((1, 28, 28), "mnist", True)
    assert error(3, 50, grey) == server.value.message == \
        "image of 3x50 pixels is too small to classify: at least 4 pixels a side"
    assert error(4, 4, grey) is None and error(28, 28, grey) is None
    modes = "mode must be auto, as-is or one of mnist, emnist, fashion, resize"
    assert error(40, 40, grey, "sideways") == f"{modes}, got sideways"
    assert "target picture must be one of" in error(40, 40, {**grey, "picture": "cifar"})
    assert "target channels must be 1 or 3" in error(40, 40, {**grey, "channels": 2})
    assert all("\n" not in error(40, 40, t) for t in ({}, {**grey, "background": "grey"}, {**grey, "height": 0}))


def test_a_trained_model_predicts_the_same_from_either_preparation(page, serve_model):
    """The ``fast`` model trained for the serve tests, on drawings prepared by the server's own
    ``to_input`` and by prepare.js with the target the model's info gives: the same top class
    for every drawing, the probabilities within float noise (the inputs are equal)."""
    from mnistflow.artifacts.load import load_any
    from mnistflow.artifacts.predictor import predict_arrays
    from mnistflow.server.inputs import to_input

    model, info = load_any(serve_model)
    target = Target.of(info.in_shape, info.mean, info.dataset)
    shape = tuple(info.in_shape)
    drawings = {f"{d} drawn": drawn_digit(d) for d in range(10)}
    drawings.update({f"{d} white on black, small": drawn_digit(d, ink=255, paper=0, canvas=(200, 150),
                                                              box=(20, 10, 90, 130), width=9) for d in (0, 4, 7)})
    rows = _run(page, drawings, [(shape, target.style, target.dark_background, None)])
    want = np.stack([to_input(decode_image(png(a)), info)[0] for a in drawings.values()])
    assert all(np.array_equal(r["python"][0], w) for r, w in zip(rows, want))  # prepare() is to_input's way
    got = np.stack([r["decoded"]["pixels"] for r in rows])
    p_py, p_js = predict_arrays(model, info, want), predict_arrays(model, info, got)
    assert (p_py.argmax(1) == p_js.argmax(1)).all()
    assert np.abs(p_py - p_js).max() <= 1e-6
    assert (p_py.argmax(1)[:10] == np.arange(10)).sum() >= 8  # the drawings are digits the model reads
