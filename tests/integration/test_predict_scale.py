"""``predict`` and ``eval`` in memory bounded by the batch, not by the number of images (issue
43): 60,000 synthetic images in an IDX file (and in records), classified by a small model in a
subprocess whose peak resident memory (VmHWM) must stay within a few MB of the same command on
1,000 images. Holding every decoded image, one forward pass over all of them, the whole JSON
text, or a resident copy of the split would each add tens to hundreds of MB.
"""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from helpers.idx_files import idx_bytes
from helpers.memory import run_measured
from helpers.synthetic import digits

from mnistflow.artifacts.model_file import save_model
from mnistflow.artifacts.model_info import ModelInfo
from mnistflow.artifacts.predictor import predict_arrays
from mnistflow.models import create_model

N = 60_000
MiB_KB = 1024
GROWTH_KB = 24 * MiB_KB  # what 59,000 more images may add: allocator noise, not a copy of them (47 MB)

INFO = ModelInfo("softmax", [1, 28, 28], [str(i) for i in range(10)], [33.0], [78.0], dataset="synthetic")


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scale")
    torch.manual_seed(0)
    model = save_model(tmp / "model.safetensors", create_model("softmax"), INFO)
    x, y = digits(1_000)
    x, y = np.tile(x[..., 0], (N // 1_000, 1, 1)), np.tile(y, N // 1_000)
    (tmp / "many-idx3-ubyte").write_bytes(idx_bytes(x))
    (tmp / "few-idx3-ubyte").write_bytes(idx_bytes(x[:1_000]))
    return tmp, model, x, y


def _records(out, x, y):
    from mnistflow.data.formats.raw import RawDataset, RawSplit
    from mnistflow.data.write_records import write_records

    raw = RawDataset("synthetic", [str(k) for k in range(10)], RawSplit(x[..., None], y),
                     RawSplit(x[:100, ..., None], y[:100]))
    return write_records(raw, out, key="synthetic", options={}, source_checksums={}, val_size=0)


def test_predict_60000_images_in_memory_flat_in_n(big):
    tmp, model, x, _ = big
    few, few_kb = run_measured("predict", str(model), str(tmp / "few-idx3-ubyte"), "--json")
    assert few.returncode == 0, few.stderr
    t0 = time.perf_counter()
    many, many_kb = run_measured("predict", str(model), str(tmp / "many-idx3-ubyte"), "--json", timeout=300)
    took = time.perf_counter() - t0
    assert many.returncode == 0, many.stderr
    preds = json.loads(many.stdout)
    assert len(preds) == N and preds[-1]["image"] == f"many-idx3-ubyte[{N - 1}]"
    assert many_kb - few_kb <= GROWTH_KB, (f"60,000 images peaked at {many_kb / 1024:.0f} MB, 1,000 at "
                                           f"{few_kb / 1024:.0f} MB ({took:.1f} s)")
    from mnistflow.artifacts.load import load_any

    net, info = load_any(model)
    want = predict_arrays(net, info, x[..., None]).argmax(1)
    assert [p["index"] for p in preds] == want.tolist()


def test_eval_of_60000_images_in_memory_flat_in_n(big, tmp_path):
    """``eval`` reads the records' split a batch at a time on a CPU: only the pages of their
    memory map (the page cache, counted in the resident size: 46 MB for 60,000 images) grow
    with the split."""
    _, model, x, y = big
    few, many = _records(tmp_path / "few", x[:1_000], y[:1_000]), _records(tmp_path / "many", x, y)
    runs = {}
    for name, rec in (("few", few), ("many", many)):
        proc, kb = run_measured("eval", str(model), "--data", str(rec), "--split", "train", "--json", timeout=300)
        assert proc.returncode == 0, proc.stderr
        runs[name] = (json.loads(proc.stdout), kb)
    assert runs["many"][0]["n"] == N and runs["few"][0]["n"] == 1_000
    mapped_kb = N * 28 * 28 // 1024
    assert runs["many"][1] - runs["few"][1] <= GROWTH_KB + mapped_kb, (runs["few"][1], runs["many"][1])


def test_a_long_predict_shows_a_bar_with_the_time_left_on_a_terminal(big):
    """On a terminal: a bar (count, rate, time left) on stderr while the rows come, the rows
    written above it, and no bar left at the end; the bar fits the terminal."""
    from helpers.terminal import run_in_pty, screen, segments

    tmp, model, _, _ = big
    # (the terminal pauses 2 s: a quiet machine classifies and writes the rows in less than the
    # bar's 1 s delay, and a bar shows only for a run that lasts longer)
    code, raw = run_in_pty(["predict", str(model), str(tmp / "many-idx3-ubyte"), "--format", "csv"], pause_s=2.0)
    assert code == 0, raw[-500:]
    bars = [s for s in segments(raw) if s.startswith("predict:")]
    assert bars and any("img/s" in s and "<" in s for s in bars), segments(raw)[:5]
    assert all(len(s) <= 80 for s in bars)
    rows = [s for s in segments(raw) if s.startswith("many-idx3-ubyte[")]
    assert len(rows) == N and rows[-1].startswith(f"many-idx3-ubyte[{N - 1}],none,")
    assert not any("predict:" in line for line in screen(raw, cols=1000))
