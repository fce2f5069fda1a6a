"""Time of one layers call (``artifacts.layers.layers``: every layer's activations for one
image) for ``seed-cnn`` on the CPU, and of what ``POST /api/layers`` does in its worker thread
(``server.app.layer_view``: body parsing, the layers call, rounding and JSON encoding).

    MNISTFLOW_DATA=../shared/data/mnist python benchmarks/bench_layers.py
    python benchmarks/bench_layers.py --model runs/seed-cnn-1 --calls 100

Random weights (``--model`` takes a trained run instead): the time does not depend on them.
The image is a real MNIST test digit when ``$MNISTFLOW_DATA`` has one, else random pixels.
Median and 90th percentile of ``--calls`` calls after 5 warm-up calls, at 1 and 2 intra-op
threads.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, table  # noqa: E402


def image() -> np.ndarray:
    """A real test digit (28, 28, 1) when the raw MNIST is at ``$MNISTFLOW_DATA``, else noise."""
    root = Path(os.environ.get("MNISTFLOW_DATA", ""))
    f = root / "t10k-images-idx3-ubyte.gz"
    if os.environ.get("MNISTFLOW_DATA") and f.exists():
        from mnistflow.data.formats.idx import read_idx

        return np.ascontiguousarray(read_idx(f)[0][..., None])
    return np.random.default_rng(0).integers(0, 256, (28, 28, 1), dtype=np.uint8)


def timed(fn, calls: int) -> tuple[float, float]:
    """(median, p90) milliseconds of ``calls`` calls of ``fn`` after 5 warm-up calls."""
    for _ in range(5):
        fn()
    ms = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ms.append(1000 * (time.perf_counter() - t0))
    ms.sort()
    return statistics.median(ms), ms[int(0.9 * (len(ms) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a trained run or model file (default: seed-cnn, random weights)")
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()

    import torch

    from mnistflow.artifacts.layers import layers
    from mnistflow.artifacts.model_info import ModelInfo
    from mnistflow.artifacts.predictor import TorchBackend
    from mnistflow.server.app import layer_view

    if args.model:
        from mnistflow.artifacts.load import load_any

        model, info = load_any(args.model)
    else:
        from mnistflow.models import create_model

        torch.manual_seed(0)
        model = create_model("seed-cnn", (1, 28, 28), 10).eval()
        info = ModelInfo(model="seed-cnn", in_shape=[1, 28, 28], class_names=[str(i) for i in range(10)],
                         mean=[33.3], std=[78.6], dataset="mnist")
    pred = TorchBackend(model, info)
    x = image()
    body = json.dumps({"pixels": x[..., 0].tolist()}).encode()
    found = layers(model, info, x)
    values = sum(layer.values.size for layer in found)
    print(machine().rsplit(", threads", 1)[0])  # (the threads are the table's column)
    rows = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        med, p90 = timed(lambda: layers(model, info, x), args.calls)
        rows.append({"threads": threads, "what": "layers()", "median ms": med, "p90 ms": p90})
        med, p90 = timed(lambda: json.dumps(layer_view(pred, body, "application/json", None)), args.calls)
        rows.append({"threads": threads, "what": "layer_view + JSON", "median ms": med, "p90 ms": p90})
    print(f"model {info.model}: {len(found)} layers, {values:,} values; {args.calls} calls each")
    print(table(rows, ["threads", "what", "median ms", "p90 ms"]))


if __name__ == "__main__":
    main()
