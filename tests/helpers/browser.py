"""Debian's chromium driven by Playwright, for the browser tests.

Needs ``apt-get install -y chromium chromium-driver`` (scripts/test.sh installs it); without it
a test FAILS rather than skips. ``playwright install`` (the browser download) is not used and
does not work offline.
"""
from __future__ import annotations

import contextlib
import shutil
from typing import Iterator

import pytest

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


def chromium_path() -> str:
    """Debian's chromium, or the test fails saying how to install it."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Debian's chromium is not installed: run 'apt-get update && apt-get install -y "
                    "chromium chromium-driver' (scripts/test.sh does it); 'playwright install' does not work here")
    return path


@contextlib.contextmanager
def blank_page() -> Iterator:
    """A blank page (about:blank) in headless chromium; its console errors and page errors are
    collected in ``page.problems``."""
    try:
        from playwright import sync_api
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[dev]' (scripts/test.sh does it)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            page.problems = []
            page.on("console", lambda m: m.type == "error" and page.problems.append(f"console: {m.text}"))
            page.on("pageerror", lambda e: page.problems.append(f"page error: {e}"))
            yield page
        finally:
            browser.close()
