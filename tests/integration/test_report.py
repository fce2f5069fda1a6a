"""``mnistflow report``: every PNG of a short real run, one self-contained HTML page, --compare."""
from __future__ import annotations

import base64
import re
import shutil
import sys

import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, run_cli
from mnistflow.core.errors import MnistflowError

pytest.importorskip("matplotlib")

from mnistflow.reporting import COMPARE_SIZE, HTML_FILE, PLOT_SIZES, predict_split, report  # noqa: E402


@pytest.fixture(scope="module")
def runs(mnist_records, tmp_path_factory):
    """Two short real runs: softmax (evaluated every 40 steps) and an MLP to compare with."""
    from mnistflow.training.api import train

    root = tmp_path_factory.mktemp("report_runs")
    common = dict(data=str(mnist_records), quiet=True, threads=1, tensorboard=False)
    train(recipe="softmax", run_dir=str(root / "softmax"), max_steps=120, log_every=20, eval_every=40,
          checkpoint_every=60, **common)
    train(model="mlp", run_dir=str(root / "mlp"), max_steps=40, log_every=10, batch_size=100,
          keep_checkpoints=0, **common)
    return root / "softmax", root / "mlp"


def test_every_plot_and_one_self_contained_page(runs, tmp_path):
    run, other = runs
    html = report(run, out=tmp_path / "rep", compare=[other])
    assert html == tmp_path / "rep" / HTML_FILE
    page = html.read_text()
    expected = {**PLOT_SIZES, "compare.png": COMPARE_SIZE}
    for name, size in expected.items():
        png = (tmp_path / "rep" / name).read_bytes()
        assert len(png) > 5000, name  # not an empty canvas
        with Image.open(tmp_path / "rep" / name) as im:
            assert im.format == "PNG" and im.size == size, (name, im.size)
            assert len(np.unique(np.asarray(im.convert("L")))) > 10, name  # something was drawn
        # the page embeds exactly this file, inline
        assert "data:image/png;base64," + base64.b64encode(png).decode() in page, name
    # self-contained: no scripts, no links or sources other than data: URIs
    assert "<script" not in page.lower()
    refs = re.findall(r'(?:src|href)\s*=\s*["\']([^"\']*)', page, re.I)
    assert refs and all(r.startswith("data:image/png;base64,") for r in refs), refs[:3]
    assert "http://" not in page and "https://" not in page
    # the configuration and the end-of-run table
    assert "test accuracy" in page and "wall time" in page
    assert "<td>schedule</td><td>&quot;linear&quot;</td>" in page
    assert "mlp" in page and "softmax" in page  # the comparison table names both runs


def test_default_folder_and_no_compare(runs):
    run, _ = runs
    html = report(run)
    assert html == run / "report" / HTML_FILE
    assert sorted(p.name for p in (run / "report").glob("*.png")) == sorted(PLOT_SIZES)


def test_confusion_and_predictions_agree_with_eval(runs):
    from mnistflow.inference import evaluate

    run, _ = runs
    res = predict_split(run)
    ev = evaluate(run, "test")
    assert res.split == "test" and len(res.labels) == 10_000 and res.images.shape == (10_000, 28, 28, 1)
    assert res.confusion.tolist() == ev["confusion"]
    assert res.acc == pytest.approx(ev["acc"], abs=1e-9)
    assert np.allclose(res.probs.sum(1), 1, atol=1e-4)


def test_an_unfinished_run_is_reported_from_its_checkpoint(runs, tmp_path):
    run, _ = runs
    cut = tmp_path / "cut"
    shutil.copytree(run, cut, ignore=shutil.ignore_patterns("report"))
    (cut / "model.safetensors").unlink()
    (cut / "summary.json").unlink()
    page = report(cut).read_text()
    assert "did not finish" in page and "data:image/png;base64," in page


def test_cli_prints_the_files_and_page_last(runs, tmp_path):
    run, other = runs
    proc = run_cli("report", str(run), "--compare", str(other), "--out", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].endswith(HTML_FILE) and len(lines) == len(PLOT_SIZES) + 2
    assert (tmp_path / "r" / "compare.png").is_file()


def test_bad_run_directories_are_one_line_errors(runs, tmp_path):
    assert_one_line_error(run_cli("report", str(tmp_path / "nope")), "no such run directory")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run_cli("report", str(tmp_path / "empty")), "empty", "no metrics.jsonl")
    half = tmp_path / "half"
    half.mkdir()
    (half / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 2.3}\n')
    with pytest.raises(MnistflowError, match=r"half: no model\.safetensors and no valid checkpoint"):
        report(half)
    with pytest.raises(MnistflowError, match="no metrics.jsonl"):
        report(runs[0], compare=[tmp_path / "empty"])


def test_missing_matplotlib_says_what_to_install(runs, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(MnistflowError, match=r"pip install 'mnistflow\[report\]'"):
        report(runs[0])


def test_layers_follow_mistakes_first_through_each_stage(runs):
    """layers.png's columns: the most confident mistakes, then right images; its rows: the last
    layer of each run of same-shaped layers (a stage's output), from the real model's layers."""
    from mnistflow.artifacts.layers import layers
    from mnistflow.reporting.plots import layer_examples, stage_outputs

    res = predict_split(runs[1], threads=1)  # the 40-step MLP: it makes mistakes
    picks = layer_examples(res)
    wrong = [i for i in picks if res.pred[i] != res.labels[i]]
    assert len(picks) == 4 and len(set(picks)) == 4 and picks[:2] == wrong[:2] and len(wrong) == 2
    conf = res.probs.max(1)
    mistakes = np.flatnonzero(res.pred != res.labels)
    assert conf[picks[0]] == conf[mistakes].max()  # the most confident mistake leads
    right = np.flatnonzero(res.pred == res.labels)
    assert conf[picks[2]] == conf[right].max() and conf[picks[3]] == conf[right].min()
    found = layers(res.predictor, res.predictor.info, res.images[picks[0]])[:-1]
    rows = stage_outputs(found)
    names = [layer.name for layer in found]
    assert rows and rows[-1] is found[-1]
    for layer in rows:  # each row ends a run of same-shaped layers
        n = names.index(layer.name)
        assert n + 1 == len(found) or found[n + 1].shape != layer.shape
    assert len(stage_outputs(found * 5, rows=3)) == 3  # a deep model: at most `rows`, spread
