"""The exported web page (``mnistflow export RUN --format web``) in Chromium: the size of each
file, milliseconds per image, and agreement with ``predict`` on the whole MNIST test set.

    MNISTFLOW_DATA=../shared/data/mnist python benchmarks/bench_web.py --run runs/fast-1
    python benchmarks/bench_web.py --models seed-cnn fast --calls 50

Each model of ``--models`` (random weights: the time does not depend on them) and the trained
``--run`` are exported to a temporary folder, served by a static file server and opened in
Debian's Chromium (as tests/integration/test_web_export.py does). Times are the page's own
clock on a real test digit: the first ``predict`` of a fresh page (it decodes the weights),
then the median and 90th percentile of ``--calls`` ``predict`` and ``layers`` calls. The
page's clock is wall time, which counts the time other processes hold the cores (the machine's
load average is printed); the CPU columns are the renderer's own CPU time per call, over ten
times as many calls. With ``--run``: the top-1 agreement with ``predict``
(``artifacts.predictor``) and the largest probability difference over the ``--images`` first
test images (all 10,000 by default).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from common import cpu_line, table  # noqa: E402
from helpers.browser import CHROMIUM_ARGS, find_chromium  # noqa: E402
from helpers.web import open_page, predict_all, static_server, timings  # noqa: E402


def test_images(n: int) -> np.ndarray:
    """The first ``n`` real MNIST test images (N, 28, 28, 1), from ``$MNISTFLOW_DATA``."""
    from mnistflow.data.formats.idx import read_idx

    f = Path(os.environ.get("MNISTFLOW_DATA", "")) / "t10k-images-idx3-ubyte.gz"
    if not f.is_file():
        sys.exit("set MNISTFLOW_DATA to the raw MNIST's folder (t10k-images-idx3-ubyte.gz)")
    return np.ascontiguousarray(read_idx(f)[:n][..., None])


def export_model(name: str, out: Path):
    """Registered model ``name`` (random weights) or a trained run, exported to ``out``; returns
    (model, info)."""
    import torch

    from mnistflow.artifacts.model_info import ModelInfo
    from mnistflow.artifacts.web.folder import page_files, write_folder
    from mnistflow.artifacts.web.trace import trace
    from mnistflow.data.normalize import normalize

    if Path(name).exists():
        from mnistflow.artifacts.load import load_any

        model, info = load_any(name)
    else:
        from mnistflow.models import create_model

        torch.manual_seed(0)
        model = create_model(name, (1, 28, 28), 10).eval()
        info = ModelInfo(model=name, in_shape=[1, 28, 28], class_names=[str(i) for i in range(10)],
                         mean=[33.3], std=[78.6], dataset="mnist")
    c, h, w = info.in_shape
    graph = trace(model.eval(), normalize(np.zeros((1, h, w, c), np.uint8), info.mean, info.std))
    write_folder(out, page_files(graph, model, info))
    return model, info


_LOOP = """async ([px, calls, what]) => {
  for (let i = 0; i < calls; i++) await window.mnistflow[what](px);
}"""


def cpu_ms(browser, page, image: np.ndarray, calls: int, what: str) -> float:
    """CPU milliseconds per ``what`` call (``predict`` or ``layers``): the renderer processes' CPU
    time (DevTools' SystemInfo.getProcessInfo) over ``calls`` calls: unlike the page's clock,
    it does not count the time other processes hold the cores."""
    cdp = browser.new_browser_cdp_session()

    def cpu() -> float:
        return sum(p["cpuTime"] for p in cdp.send("SystemInfo.getProcessInfo")["processInfo"] if p["type"] == "renderer")

    before = cpu()
    page.evaluate(_LOOP, [image.ravel().tolist(), calls, what])
    return 1000 * (cpu() - before) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["seed-cnn", "fast"])
    ap.add_argument("--run", help="a trained run (or model file) to time and check on the test set")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--images", type=int, default=10_000)
    args = ap.parse_args()
    from playwright import sync_api

    digit = test_images(1)[0]
    sizes, speed, agreement = [], [], []
    print(f"{cpu_line()}, {len(os.sched_getaffinity(0))} cores, load average "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=find_chromium(), args=CHROMIUM_ARGS, headless=True)
        for name in [*args.models, *([args.run] if args.run else [])]:
            folder = Path(tmp) / f"m{len(sizes)}"
            model, info = export_model(name, folder)
            label = f"{info.model} (trained)" if name == args.run else info.model
            files = {f.name: f.stat().st_size for f in folder.iterdir()}
            sizes.append({"model": label, **files, "total": sum(files.values())})
            with static_server(folder) as origin:
                page = open_page(browser, f"{origin}/index.html")
                t = timings(page, digit, args.calls)
                speed.append({"model": label, "first predict ms": t["first"],
                              "predict ms": statistics.median(t["predict"]),
                              "p90": t["predict"][int(0.9 * (len(t["predict"]) - 1))],
                              "layers ms": statistics.median(t["layers"]),
                              "predict CPU ms": cpu_ms(browser, page, digit, 10 * args.calls, "predict"),
                              "layers CPU ms": cpu_ms(browser, page, digit, 10 * args.calls, "layers")})
                if name == args.run:
                    agreement.append(agree(page, model, info, test_images(args.images), label))
                page.close()
        browser.close()
    print(table(sizes, ["model", "index.html", "app.js", "style.css", "backend.js", "model.js", "total"]))
    print(table(speed, ["model", "first predict ms", "predict ms", "p90", "layers ms", "predict CPU ms",
                        "layers CPU ms"]))
    if agreement:
        print(table(agreement, ["model", "images", "top-1 agrees", "max prob diff", "ms/image"]))


def agree(page, model, info, x: np.ndarray, label: str) -> dict:
    """The page's probabilities for ``x`` against ``predict``'s."""
    from mnistflow.artifacts.predictor import predict_arrays

    got, ms = predict_all(page, x)
    want = predict_arrays(model, info, x)
    return {"model": label, "images": len(x), "top-1 agrees": f"{100 * float((got.argmax(1) == want.argmax(1)).mean()):.2f}%",
            "max prob diff": f"{float(np.abs(got - want).max()):.2e}", "ms/image": ms}


if __name__ == "__main__":
    main()
