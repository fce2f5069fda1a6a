"""Draw a digit on ``mnistflow serve``'s page in headless Chromium and save a screenshot: the
README's picture (docs/serve.png) is made by it.

    python scripts/screenshot_serve.py runs/fast docs/serve.png --digit 3

Starts ``mnistflow serve RUN --port 0`` (the page and the model are the real ones), strokes the
digit with the mouse as a person would, waits for the page's prediction and its layers view,
prints the prediction, and saves the browser window (the drawing, the prediction and the first
layers' feature maps; 1280x800 by default) as a small palette PNG. Needs Debian's ``chromium``
and the ``playwright`` package (the dev extra), as the browser tests do; ``playwright install``
(a browser download) is not used.
"""
from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
from pathlib import Path

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
# Each digit as strokes of (x, y) points on the canvas, 0..1 (a hand's path, not a font).
STROKES = {
    "2": [[(0.30, 0.33), (0.38, 0.22), (0.52, 0.18), (0.65, 0.24), (0.68, 0.37), (0.60, 0.50),
           (0.45, 0.63), (0.30, 0.78), (0.50, 0.77), (0.72, 0.78)]],
    "3": [[(0.32, 0.24), (0.45, 0.17), (0.60, 0.19), (0.66, 0.30), (0.58, 0.43), (0.46, 0.47),
           (0.60, 0.51), (0.68, 0.63), (0.62, 0.76), (0.47, 0.81), (0.32, 0.75)]],
    "7": [[(0.28, 0.22), (0.50, 0.21), (0.72, 0.21), (0.62, 0.40), (0.52, 0.60), (0.45, 0.80)]],
}


def smooth(points: list[tuple[float, float]], per_segment: int = 8) -> list[tuple[float, float]]:
    """A Catmull-Rom curve through ``points``: a pen's round path rather than straight segments."""
    ends = [points[0], *points, points[-1]]
    out = [points[0]]
    for i in range(1, len(ends) - 2):
        (x0, y0), (x1, y1), (x2, y2), (x3, y3) = ends[i - 1:i + 3]
        for k in range(1, per_segment + 1):
            t = k / per_segment
            a, b, c = -t**3 + 2 * t**2 - t, 3 * t**3 - 5 * t**2 + 2, -3 * t**3 + 4 * t**2 + t
            d = t**3 - t**2
            out.append(((a * x0 + b * x1 + c * x2 + d * x3) / 2, (a * y0 + b * y1 + c * y2 + d * y3) / 2))
    return out


def draw(page, strokes: list[list[tuple[float, float]]]) -> None:
    box = page.locator("#pad").bounding_box()
    for stroke in strokes:
        pts = [(box["x"] + x * box["width"], box["y"] + y * box["height"]) for x, y in smooth(stroke)]
        page.mouse.move(*pts[0])
        page.mouse.down()
        for p in pts[1:]:
            page.mouse.move(*p)
        page.mouse.up()


def screenshot(run: Path, out: Path, digit: str, width: int = 1280, height: int = 800, colors: int = 64) -> str:
    """Serve ``run``, draw ``digit``, save the window to ``out``; the label the page shows."""
    from PIL import Image
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("screenshot_serve.py: Debian's chromium is not installed (apt-get install chromium)")
    proc = subprocess.Popen([sys.executable, "-m", "mnistflow", "serve", str(run), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        if " at http://127.0.0.1:" not in line:
            sys.exit(f"screenshot_serve.py: mnistflow serve did not start: {line.strip()}")
        url = line.split(" at ")[1].split()[0]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(url)
            page.wait_for_function("() => document.getElementById('m-acc').textContent.endsWith('%')"
                                   " && document.querySelector('#layers .layer')")
            draw(page, STROKES[digit])
            page.wait_for_function("() => { const p = document.getElementById('prediction');"
                                   " return p.dataset.state === 'idle' && p.dataset.label !== ''"
                                   " && +document.getElementById('layers').dataset.painted > 0; }")
            label = page.locator("#prediction").inner_text()
            png = page.screenshot()
            browser.close()
    finally:
        proc.terminate()
        proc.wait(20)
    img = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors, method=Image.Quantize.MEDIANCUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    img.save(out, optimize=True)
    return label


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run directory or model file mnistflow serve takes")
    ap.add_argument("out", type=Path, help="the PNG to write")
    ap.add_argument("--digit", choices=sorted(STROKES), default="3")
    ap.add_argument("--width", type=int, default=1280, help="the browser window's width in pixels")
    ap.add_argument("--height", type=int, default=800, help="the browser window's height in pixels")
    args = ap.parse_args()
    label = screenshot(args.run, args.out, args.digit, args.width, args.height)
    print(f"drew {args.digit}, the page says {label}; {args.out} ({args.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
