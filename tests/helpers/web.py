"""The exported web page (``mnistflow export --format web``) in Debian's Chromium: a folder served
by a plain static file server, and ``window.mnistflow`` driven from Python (the tests of
tests/integration/test_web_export.py and benchmarks/bench_web.py)."""
from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import threading
from pathlib import Path
from typing import Iterator

import numpy as np


@contextlib.contextmanager
def static_server(folder: Path) -> Iterator[str]:
    """``python -m http.server``'s handler, threaded, for ``folder`` on a free 127.0.0.1 port;
    yields its origin (``http://127.0.0.1:PORT``)."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(10)


def open_page(browser, url: str):
    """A new page at ``url`` once ``window.mnistflow`` is defined; ``page.requests`` lists every
    URL it asked for, ``page.problems`` its page errors."""
    page = browser.new_page()
    page.requests, page.problems = [], []
    page.on("request", lambda r: page.requests.append(r.url))
    page.on("pageerror", lambda e: page.problems.append(f"page error: {e}"))
    page.goto(url)
    page.wait_for_function("() => window.mnistflow !== undefined && window.mnistflowModel !== undefined")
    return page


_PREDICT_ALL = """async ([b64, n]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)), per = bytes.length / n, out = [];
  await window.mnistflow.predict(bytes.subarray(0, per));  // the weights decoded, the code compiled
  const t0 = performance.now();
  for (let i = 0; i < n; i++) out.push(await window.mnistflow.predict(bytes.subarray(i * per, (i + 1) * per)));
  return [out, performance.now() - t0];
}"""


def predict_all(page, images: np.ndarray, chunk: int = 1000) -> tuple[np.ndarray, float]:
    """``window.mnistflow.predict`` of every uint8 image (N, H, W, C): the probabilities (N, K)
    and the milliseconds the page spent per image (its own clock, after one warm-up call)."""
    probs, ms = [], 0.0
    for i in range(0, len(images), chunk):
        part = np.ascontiguousarray(images[i:i + chunk])
        got, t = page.evaluate(_PREDICT_ALL, [base64.b64encode(part.tobytes()).decode(), len(part)])
        probs.append(np.array(got, np.float64))
        ms += t
    return np.concatenate(probs), ms / len(images)


_LAYERS = """async (px) => (await window.mnistflow.layers(px)).map((l) => {
  const bytes = new Uint8Array(Float32Array.from(l.values).buffer);
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return {name: l.name, kind: l.kind, shape: l.shape, values: btoa(bin)};  // float32 bytes: fast to carry
})"""


def layers_of(page, image: np.ndarray) -> list[dict]:
    """``window.mnistflow.layers`` of one uint8 image: [{name, kind, shape, values (ndarray)}]."""
    got = page.evaluate(_LAYERS, image.ravel().tolist())
    for layer in got:
        layer["values"] = np.frombuffer(base64.b64decode(layer["values"]), "<f4").reshape(layer["shape"])
    return got


_TIMES = """async ([px, calls]) => {
  const t0 = performance.now();
  await window.mnistflow.predict(px);  // the first call decodes the weights
  const first = performance.now() - t0, predict = [], layers = [];
  for (let i = 0; i < calls; i++) {
    let t = performance.now();
    await window.mnistflow.predict(px);
    predict.push(performance.now() - t);
    t = performance.now();
    await window.mnistflow.layers(px);
    layers.push(performance.now() - t);
  }
  return {first, predict, layers};
}"""


def timings(page, image: np.ndarray, calls: int) -> dict:
    """Milliseconds (the page's clock) of the first ``predict`` call of a fresh page (it decodes
    the weights) and of ``calls`` more ``predict`` and ``layers`` calls each: {first, predict,
    layers}, the lists sorted."""
    got = page.evaluate(_TIMES, [image.ravel().tolist(), calls])
    return {"first": got["first"], "predict": sorted(got["predict"]), "layers": sorted(got["layers"])}
