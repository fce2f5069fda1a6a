"""``mnistflow summary``: layer table, totals, MACs and variables, checked against hand counts."""
from __future__ import annotations

import re

import pytest

from helpers.cli import assert_one_line_error, run_cli
from mnistflow.core.errors import MnistflowError
from mnistflow.models import create_model
from mnistflow.summary import layer_table, summarize, totals


def _rows(text: str) -> dict[str, list[str]]:
    """layer name -> the columns after it, from the table part of a summary."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\S+)\s{2,}(\S+)\s{2,}(\(.*?\)|\d+|\(not called\))\s{2,}([\d,]+)\s{2,}(\S+)\s{2,}([\d,]+)$", line)
        if m:
            out[m.group(1)] = list(m.groups()[1:])
    return out


def test_seed_cnn_shapes_params_and_macs_by_hand():
    # The tutorial's CNN on 28x28x1: conv5x5x32 (same) -> pool -> conv5x5x64 -> pool -> fc1024 -> fc10
    conv1_p, conv2_p = 5 * 5 * 1 * 32 + 32, 5 * 5 * 32 * 64 + 64
    fc1_p, fc2_p = 7 * 7 * 64 * 1024 + 1024, 1024 * 10 + 10
    assert conv1_p + conv2_p + fc1_p + fc2_p == 3_274_634
    conv1_mac = 28 * 28 * 32 * (5 * 5 * 1)
    conv2_mac = 14 * 14 * 64 * (5 * 5 * 32)
    fc1_mac, fc2_mac = 3136 * 1024, 1024 * 10
    total_mac = conv1_mac + conv2_mac + fc1_mac + fc2_mac
    assert total_mac == 13_883_904

    text = summarize("seed-cnn")
    rows = _rows(text)
    shapes = [(name, r[1]) for name, r in rows.items()]
    # ReLU runs after the max-pool it fed (the same function; see models/spec.py).
    assert shapes == [("conv1", "(32, 28, 28)"), ("maxpool1", "(32, 14, 14)"), ("relu1", "(32, 14, 14)"),
                      ("conv2", "(64, 14, 14)"), ("maxpool2", "(64, 7, 7)"), ("relu2", "(64, 7, 7)"),
                      ("flatten1", "3136"), ("fc1", "1024"), ("relu3", "1024"), ("dropout1", "1024"),
                      ("fc2", "10")]
    assert rows["conv1"][0] == "Conv2d" and rows["fc1"][0] == "Linear"
    assert [int(rows[n][2].replace(",", "")) for n in ("conv1", "conv2", "fc1", "fc2")] == \
        [conv1_p, conv2_p, fc1_p, fc2_p]
    assert [int(rows[n][4].replace(",", "")) for n in ("conv1", "conv2", "fc1", "fc2")] == \
        [conv1_mac, conv2_mac, fc1_mac, fc2_mac]
    assert rows["conv1"][3] == "yes" and rows["relu1"][3] == "-"
    assert "total params:         3,274,634" in text
    assert "trainable params:     3,274,634" in text
    assert "non-trainable params: 0" in text
    assert f"size:                 {3_274_634 * 4:,} bytes" in text
    assert f"multiply-accumulates: {total_mac:,} per image" in text


def test_batch_norm_buffers_are_non_trainable_and_frozen_params_are_flagged():
    model = create_model("fast")
    for p in model.features[0].parameters():
        p.requires_grad_(False)
    t = totals(model)
    assert t["frozen"] == 32 * 4 * 3 * 3  # the first conv sees 4 channels (space-to-depth)
    assert t["buffers"] == 2 * (32 + 48 + 192) + 3  # running mean/var + num_batches_tracked
    rows = {r.name: r for r in layer_table(model, (1, 28, 28))}
    # stages: conv, pool, batch norm + ReLU (features.0-2, 3-5); VALID conv, batch norm + ReLU (6-7)
    assert rows["features.0"].trainable == "no" and rows["features.3"].trainable == "yes"
    assert rows["features.4"].shape == (48, 4, 4)  # ceil-mode pool: 7 -> 4 (input 14x14 after space-to-depth)
    assert rows["features.6"].shape == (192, 2, 2)  # VALID 3x3: 4 -> 2
    text = summarize(model, variables=True)
    assert "features.0.weight" not in text.split("trainable variables")[1]  # frozen: not listed
    assert "head.weight" in text
    everything = summarize(model, all_variables=True)
    assert re.search(r"features\.0\.weight\s+\(32, 4, 3, 3\)\s+float32\s+1,?152\s+frozen", everything)
    assert re.search(r"features\.2\.running_mean\s+32\s+float32\s+32\s+buffer", everything)


def test_cli_spec_with_input_size_and_variables():
    proc = run_cli("summary", "conv3x3x8-s2-relu,maxpool2,fc10", "--input", "32x32", "--channels", "3",
                   "--variables")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "input: 3x32x32" in out
    rows = _rows(out)
    assert rows["conv1"][1] == "(8, 16, 16)" and rows["maxpool1"][1] == "(8, 8, 8)"
    assert int(rows["conv1"][4].replace(",", "")) == 16 * 16 * 8 * 3 * 3 * 3
    assert re.search(r"conv1\.weight\s+\(8, 3, 3, 3\)\s+float32\s+216", out)
    assert re.search(r"fc1\.weight\s+\(10, 512\)\s+float32\s+5,120", out)


def test_summary_of_a_trained_run_and_its_exports(mnist_records, tmp_path):
    from mnistflow.training.api import train

    run = tmp_path / "run"
    train(model="softmax", data=mnist_records, run_dir=run, max_steps=3, tensorboard=False, quiet=True,
          threads=1)
    text = summarize(run, variables=True)
    assert "model: softmax" in text and "total params:         7,850" in text
    assert re.search(r"fc1\.weight\s+\(10, 784\)", text)
    ckpt = next((run / "checkpoints").glob("step-*.pt"))
    assert "total params:         7,850" in summarize(ckpt)
    with pytest.raises(MnistflowError, match="does not take a 1x20x20 input"):
        summarize(run, input_size="20x20")  # trained weights fix the input size


@pytest.mark.parametrize("args,fragment", [
    (["nope"], "neither a file"),
    (["conv5x5x4-valid,fc10", "--input", "3x3"], "does not fit input"),
    (["seed-cnn", "--input", "28"], "expected HxW"),
])
def test_bad_input_is_one_line(args, fragment):
    assert_one_line_error(run_cli("summary", *args), fragment)
