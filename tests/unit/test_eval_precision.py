"""``mnistflow eval --precision auto``: the precision the run's own evaluations used (its
summary.json) where this device runs it fast, so that eval repeats the run's test figure (bf16
and fp32 disagree on a few of MNIST's images); fp32 otherwise."""
from __future__ import annotations

import json

import pytest
import torch

from mnistflow import inference

CPU = torch.device("cpu")


@pytest.fixture
def bf16_cpu(monkeypatch):
    """Whether this 'CPU' has bf16 units: set the returned dict's value."""
    fast = {"bf16": True}
    real = inference.pick_precision
    monkeypatch.setattr(inference, "pick_precision",
                        lambda name, dev: ("bf16" if fast["bf16"] else "fp32") if name == "auto" else real(name, dev))
    return fast


def _run(tmp_path, summary: str | None):
    run = tmp_path / "run"
    run.mkdir()
    if summary is not None:
        (run / "summary.json").write_text(summary)
    return run


@pytest.mark.parametrize("ran,bf16_units,want", [
    ("bf16", True, "bf16"),   # trained and tested in bf16 here: eval repeats the run's figure
    ("bf16", False, "fp32"),  # a bf16 run on a CPU without bf16 units: emulated bf16 would crawl
    ("fp32", True, "fp32"),   # an fp32 run (an fp32 CPU's, or --precision fp32)
    (None, True, "fp32"),     # no precision recorded
])
def test_auto_takes_the_runs_own_precision_where_it_runs_fast(tmp_path, bf16_cpu, ran, bf16_units, want):
    bf16_cpu["bf16"] = bf16_units
    run = _run(tmp_path, json.dumps({"precision": ran} if ran else {}))
    assert inference._eval_precision("auto", run, CPU) == want


def test_a_model_file_or_an_unreadable_summary_is_evaluated_in_fp32(tmp_path, bf16_cpu):
    assert inference._eval_precision("auto", tmp_path / "model.safetensors", CPU) == "fp32"
    assert inference._eval_precision("auto", _run(tmp_path, "{not json"), CPU) == "fp32"


def test_a_precision_given_is_used(tmp_path, bf16_cpu):
    run = _run(tmp_path, json.dumps({"precision": "bf16"}))
    assert inference._eval_precision("fp32", run, CPU) == "fp32"
    bf16_cpu["bf16"] = False
    assert inference._eval_precision("bf16", run, CPU) == "bf16"
