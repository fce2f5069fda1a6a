"""The draw-a-digit page in real headless Chromium: Debian's ``chromium`` driven by Playwright.

``mnistflow serve`` runs as a user starts it (a subprocess, a free 127.0.0.1 port) with the
model trained for the serve tests; ten real MNIST test digits are drawn onto the canvas with
mouse strokes, row by row along their ink, and the page must name at least nine of them.
The page is saved to ``test-artifacts/serve.png``.

Needs ``apt-get install -y chromium chromium-driver`` (scripts/test.sh installs it); without
it this test FAILS rather than skips. ``playwright install`` (the browser download) is not
used and does not work offline.
"""
from __future__ import annotations

import shutil
import signal
import subprocess

import numpy as np
import pytest

from helpers.cli import REPO, start_serve
from helpers.images import png, real_digits

ARTIFACTS = REPO / "test-artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
INK = 128  # MNIST pixels above this are stroked


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium (checked before anything is trained or started)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Debian's chromium is not installed: run 'apt-get update && apt-get install -y "
                    "chromium chromium-driver' (scripts/test.sh does it); 'playwright install' does not work here")
    return path


@pytest.fixture(scope="module")
def server_url(serve_model):
    """``mnistflow serve RUN --port 0`` in a subprocess; its URL from the first line it prints."""
    proc, line = start_serve(serve_model)
    try:
        if " at http://127.0.0.1:" not in line:
            proc.kill()
            pytest.fail(f"mnistflow serve did not start: {line}{proc.stderr.read()}")
        yield line.split(" at ")[1].split()[0]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def page(chromium, server_url):
    try:
        from playwright import sync_api
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[dev]' (scripts/test.sh does it)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        pg = browser.new_page(viewport={"width": 1100, "height": 900})
        pg.problems = []  # console errors, page errors, requests leaving the server
        pg.on("console", lambda m: m.type == "error" and pg.problems.append(f"console: {m.text}"))
        pg.on("pageerror", lambda e: pg.problems.append(f"page error: {e}"))
        pg.on("request", lambda r: r.url.startswith(("data:", server_url)) or pg.problems.append(f"request: {r.url}"))
        pg.goto(server_url)
        pg.wait_for_function("() => document.getElementById('m-name').textContent === 'fast'")
        yield pg
        browser.close()


def ink_runs(digit: np.ndarray) -> list[tuple[int, int, int]]:
    """(row, first column, last column) of each horizontal run of ink pixels."""
    runs = []
    for y, row in enumerate(digit > INK):
        x = 0
        while x < len(row):
            if row[x]:
                x0 = x
                while x + 1 < len(row) and row[x + 1]:
                    x += 1
                runs.append((y, x0, x))
            x += 1
    return runs


def draw(pg, digit: np.ndarray, touch=None) -> None:
    """Stroke the digit's ink onto #pad, one stroke per run of ink in a row: with the mouse,
    or with a finger when ``touch`` is a CDP session of a touch-enabled page."""
    box = pg.locator("#pad").bounding_box()
    s = box["width"] / digit.shape[1]
    at = lambda x, y: (box["x"] + (x + 0.5) * s, box["y"] + (y + 0.5) * s)  # noqa: E731
    for y, x0, x1 in ink_runs(digit):
        steps = max(1, (x1 - x0) // 2)
        if touch is None:
            pg.mouse.move(*at(x0, y))
            pg.mouse.down()
            pg.mouse.move(*at(x1, y), steps=steps)
            pg.mouse.up()
            continue
        for i in range(steps + 1):
            px, py = at(x0 + (x1 - x0) * i / steps, y)
            touch.send("Input.dispatchTouchEvent", {"type": "touchStart" if i == 0 else "touchMove",
                                                    "touchPoints": [{"x": px, "y": py}]})
        touch.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})


def predicted(pg) -> tuple[int, str]:
    """The label the page shows once it has predicted the whole drawing."""
    pg.wait_for_function("() => { const p = document.getElementById('prediction');"
                         " return p.dataset.state === 'idle' && p.dataset.label !== ''; }", timeout=30_000)
    el = pg.locator("#prediction")
    return int(el.get_attribute("data-label")), el.inner_text()


def test_drawn_mnist_digits_are_recognised(page):
    x, y = real_digits(10)
    got = []
    for digit in x:
        page.click("#clear")
        assert page.locator("#prediction").get_attribute("data-label") == ""
        draw(page, digit)
        label, text = predicted(page)
        assert text == str(label)  # MNIST's class names are the digits
        got.append(label)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "serve.png"), full_page=True)
    right = int((np.array(got) == y).sum())
    print(f"\nbrowser: {right}/10 drawn digits recognised (true {y.tolist()}, page {got})")
    assert right >= 9, (y.tolist(), got)
    # the page shows the probabilities and the 28x28 image the model saw
    widths = page.eval_on_selector_all("#bars .fill", "els => els.map(e => parseFloat(e.style.width))")
    assert len(widths) == 10 and abs(sum(widths) - 100) < 2 and int(np.argmax(widths)) == got[-1]
    seen = page.evaluate("() => { const c = document.getElementById('seen');"
                         " return Array.from(c.getContext('2d').getImageData(0, 0, 28, 28).data); }")
    seen = np.array(seen).reshape(28, 28, 4)[..., 0]
    assert seen[0].max() == 0 and seen.max() > 200  # MNIST's white on black
    assert page.locator("#m-params").inner_text().replace(",", "").isdigit()
    assert page.locator("#m-acc").inner_text().endswith("%")
    assert page.locator("#m-input").inner_text() == "28×28 grey"
    assert not page.problems, page.problems


def test_white_on_black_and_upload(page, tmp_path):
    x, y = real_digits(2, start=10)
    page.click("#polarity")  # white ink on black paper
    draw(page, x[0])
    assert predicted(page)[0] == y[0]
    corner = page.evaluate("() => Array.from(document.getElementById('pad').getContext('2d')"
                           ".getImageData(1, 1, 1, 1).data)")
    assert corner[:3] == [0, 0, 0]
    page.click("#polarity")
    page.click("#clear")
    from PIL import Image

    big = 255 - np.asarray(Image.fromarray(x[1]).resize((200, 200), Image.BILINEAR))  # a photo-like upload
    f = tmp_path / "digit.png"
    f.write_bytes(png(big))
    page.set_input_files("#upload", str(f))
    assert predicted(page)[0] == y[1]
    assert "MNIST-style" in page.locator("#latency").inner_text()
    f.write_bytes(b"not an image")
    page.set_input_files("#upload", str(f))
    page.wait_for_selector("#error:not([hidden])")
    assert "not a decodable image" in page.locator("#error").inner_text()
    page.problems = [p for p in page.problems if "400" not in p]  # the refused upload is expected
    assert not page.problems, page.problems


def test_touch_drawing_on_a_phone(page, server_url):
    """A phone-sized page with touch input: strokes of a finger draw and get predicted."""
    ctx = page.context.browser.new_context(viewport={"width": 390, "height": 844}, has_touch=True,
                                           is_mobile=True)
    try:
        pg = ctx.new_page()
        pg.goto(server_url)
        pg.wait_for_function("() => document.getElementById('m-name').textContent === 'fast'")
        x, y = real_digits(1, start=20)
        draw(pg, x[0], touch=ctx.new_cdp_session(pg))
        assert predicted(pg)[0] == y[0]
    finally:
        ctx.close()
