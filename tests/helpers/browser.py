"""The page in real headless Chromium: Debian's ``chromium`` driven by Playwright.

Needs ``apt-get install -y chromium chromium-driver`` (scripts/test.sh installs it); without it
a browser test FAILS rather than skips. ``playwright install`` (the browser download) is not
used and does not work offline.
"""
from __future__ import annotations

import contextlib
import shutil
from typing import Iterator

import numpy as np
import pytest

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
INK = 128  # MNIST pixels above this are stroked


def find_chromium() -> str:
    """Debian's chromium, or the test fails saying how to install it."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Debian's chromium is not installed: run 'apt-get update && apt-get install -y "
                    "chromium chromium-driver' (scripts/test.sh does it); 'playwright install' does not work here")
    return path


def sync_api():
    """Playwright's sync API, or the test fails saying how to install it."""
    try:
        from playwright import sync_api as api
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[dev]' (scripts/test.sh does it)")
    return api


def watch(pg, origin: str) -> None:
    """Collect in ``pg.problems`` console errors, page errors and requests leaving ``origin``."""
    pg.problems = []
    pg.on("console", lambda m: m.type == "error" and pg.problems.append(f"console: {m.text}"))
    pg.on("pageerror", lambda e: pg.problems.append(f"page error: {e}"))
    pg.on("request", lambda r: r.url.startswith(("data:", origin)) or pg.problems.append(f"request: {r.url}"))


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


def draw(pg, digit: np.ndarray, touch=None, runs: list | None = None) -> None:
    """Stroke the digit's ink onto #pad, one stroke per run of ink in a row (``runs``: those of
    ``ink_runs``, all by default): with the mouse, or with a finger when ``touch`` is a CDP
    session of a touch-enabled page."""
    pg.locator("#pad").scroll_into_view_if_needed()
    box = pg.locator("#pad").bounding_box()
    s = box["width"] / digit.shape[1]
    at = lambda x, y: (box["x"] + (x + 0.5) * s, box["y"] + (y + 0.5) * s)  # noqa: E731
    for y, x0, x1 in ink_runs(digit) if runs is None else runs:
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


@contextlib.contextmanager
def blank_page() -> Iterator:
    """A blank page (about:blank) in headless chromium; its console errors and page errors are
    collected in ``page.problems``."""
    with sync_api().sync_playwright() as p:
        browser = p.chromium.launch(executable_path=find_chromium(), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            watch(page, "about:")
            yield page
        finally:
            browser.close()
