"""Stroke to picture on ``mnistflow serve``'s page: from a pointer event on the drawing pad to
every layer's pictures painted, in headless Chromium (Debian's, driven by Playwright).

    python benchmarks/bench_page.py --model runs/seed-cnn-1              # a trained seed-cnn run
    python benchmarks/bench_page.py --model runs/seed-cnn-1 --encoding json --strokes 100

The server is ``mnistflow serve MODEL --port 0`` in its own process; browser and server share
the machine's cores. The page itself times each picture (app.js: ``#layers``' ``data-ms``, from
the pointer event's time stamp to the task after the frame that shows its layers); the
benchmark only collects the numbers. Two ways of drawing, each with ``--strokes`` samples:

* one segment: the pen down, one move at a time, waiting for its pictures before the next
  (the time of one change alone);
* live: the pen moved every 16 ms (a 60 Hz pointer), as a hand draws; each picture's time is
  from the newest event it shows, so it includes waiting for the answer already in flight.

``--encoding json`` makes the page read JSON floats instead of its float16 answer (the
benchmark rewrites the page's requests; the page has no switch for it). Median and 95th
percentile, after 5 warm-up segments.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, table  # noqa: E402

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
# every painted picture's time, collected as the page writes it
COLLECT = """
window.__times = [];
window.__steps = {};  // the page's own measures of its steps (STEPS)
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) {
    if (e.name.startsWith("mnistflow ")) (window.__steps[e.name.slice(10)] ||= []).push(e.duration);
  }
}).observe({ type: "measure" });
document.addEventListener("DOMContentLoaded", () => {
  const el = document.getElementById("layers");
  new MutationObserver(() => window.__times.push(parseFloat(el.dataset.ms)))
    .observe(el, { attributes: true, attributeFilter: ["data-painted"] });
});
"""
STEPS = ("wait", "png", "look", "paint", "frame")
AS_JSON = """
const plainFetch = window.fetch;
window.fetch = (url, init) => plainFetch(String(url).replace("&encoding=f16", ""), init);
"""


def path(n: int) -> list[tuple[float, float]]:
    """``n`` points (0..1 of the pad) along a looping path, so that every move adds ink."""
    import math

    return [(0.5 + 0.3 * math.cos(2.1 * t) * math.cos(0.37 * t), 0.5 + 0.3 * math.sin(1.3 * t))
            for t in (i * 0.15 for i in range(n))]


def painted(page) -> int:
    return int(page.locator("#layers").get_attribute("data-painted") or 0)


def collected(page, n: int, last: bool) -> dict[str, list[float]]:
    """The last (or first) ``n`` pictures' times, and the page's steps for them."""
    got = page.evaluate("({total: window.__times, ...window.__steps})")
    return {k: (v[-n:] if last else v[:n]) for k, v in got.items()}


def one_segment(page, at, strokes: int) -> dict[str, list[float]]:
    """The pen down, then ``strokes`` moves, each waited for."""
    page.click("#clear")
    page.evaluate("window.__times = []; window.__steps = {}")
    pts = path(strokes + 1)
    page.mouse.move(*at(pts[0]))
    page.mouse.down()
    for p in pts[1:]:
        before = painted(page)
        page.mouse.move(*at(p))
        page.wait_for_function(f"() => +document.getElementById('layers').dataset.painted > {before}"
                               " && document.getElementById('prediction').dataset.state === 'idle'")
    page.mouse.up()
    page.wait_for_function("() => document.getElementById('prediction').dataset.state === 'idle'")
    return collected(page, strokes, last=True)


def live(page, at, strokes: int) -> dict[str, list[float]]:
    """The pen moved every 16 ms until ``strokes`` pictures are painted."""
    page.click("#clear")
    page.evaluate("window.__times = []; window.__steps = {}")
    pts = path(20 * strokes)
    page.mouse.move(*at(pts[0]))
    page.mouse.down()
    for p in pts[1:]:
        page.mouse.move(*at(p))
        time.sleep(0.016)
        if len(page.evaluate("window.__times")) >= strokes:
            break
    page.mouse.up()
    page.wait_for_function("() => document.getElementById('prediction').dataset.state === 'idle'")
    return collected(page, strokes, last=False)


def measure(url: str, strokes: int, encoding: str, chromium: str) -> dict[str, dict[str, list[float]]]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.add_init_script(COLLECT + (AS_JSON if encoding == "json" else ""))
        page.goto(url)
        page.wait_for_function("() => document.querySelectorAll('#layers canvas').length > 0")
        box = page.locator("#pad").bounding_box()
        at = lambda q: (box["x"] + q[0] * box["width"], box["y"] + q[1] * box["height"])  # noqa: E731
        one_segment(page, at, 5)  # warm-up
        out = {"one segment": one_segment(page, at, strokes), "live": live(page, at, strokes)}
        browser.close()
    return out


def p95(v: list[float]) -> float:
    return sorted(v)[max(0, round(0.95 * len(v)) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a trained run or model file (e.g. a seed-cnn run)")
    ap.add_argument("--strokes", type=int, default=50, help="samples of each way of drawing")
    ap.add_argument("--encoding", choices=["f16", "json"], default="f16",
                    help="the layers answer the page reads (default: f16, what the page asks for)")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("bench_page.py: Debian's chromium is not installed (apt-get install chromium)")
    proc = subprocess.Popen([sys.executable, "-m", "mnistflow", "serve", str(args.model), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        if " at http://127.0.0.1:" not in line:
            sys.exit(f"bench_page.py: mnistflow serve did not start: {line.strip()}")
        times = measure(line.split(" at ")[1].split()[0], args.strokes, args.encoding, chromium)
    finally:
        proc.terminate()
        proc.wait(20)
    print(machine().rsplit(", threads", 1)[0] + f"; Chromium, 1280x800; {line.split()[1]}, encoding {args.encoding}")
    rows = [{"drawing": k, "pictures": len(v["total"]), "median ms": statistics.median(v["total"]),
             "p95 ms": p95(v["total"]), **{f"{s} ms": statistics.median(v[s]) for s in STEPS if v.get(s)}}
            for k, v in times.items()]
    print(table(rows, ["drawing", "pictures", "median ms", "p95 ms", *(f"{s} ms" for s in STEPS)]))
    print("(the medians of the page's own steps: wait, from the pointer event to its turn; png, the "
          "canvas to PNG; look, the backend's answer; paint, drawing every layer; frame, until the "
          "frame that shows them)")


if __name__ == "__main__":
    main()
