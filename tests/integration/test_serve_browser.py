"""The draw-a-digit page in real headless Chromium: Debian's ``chromium`` driven by Playwright.

``mnistflow serve`` runs as a user starts it (a subprocess, a free 127.0.0.1 port) with the
model trained for the serve tests; ten real MNIST test digits are drawn onto the canvas with
mouse strokes, row by row along their ink, and the page must name at least nine of them.
The page is saved to ``test-artifacts/serve.png``.

Needs Debian's chromium and Playwright (``helpers.browser``).
"""
from __future__ import annotations

import signal
import subprocess

import numpy as np
import pytest

from helpers.browser import CHROMIUM_ARGS, draw, find_chromium, predicted, sync_api, watch
from helpers.cli import REPO, start_serve
from helpers.images import png, real_digits

ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium (checked before anything is trained or started)."""
    return find_chromium()


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
    with sync_api().sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        pg = browser.new_page(viewport={"width": 1100, "height": 900})
        watch(pg, server_url)  # console errors, page errors, requests leaving the server
        pg.goto(server_url)
        pg.wait_for_function("() => document.getElementById('m-name').textContent === 'fast'")
        yield pg
        browser.close()


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
