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
    assert inference._precision_for("auto", run, CPU) == want


def test_a_model_file_or_an_unreadable_summary_is_evaluated_in_fp32(tmp_path, bf16_cpu):
    assert inference._precision_for("auto", tmp_path / "model.safetensors", CPU) == "fp32"
    assert inference._precision_for("auto", _run(tmp_path, "{not json"), CPU) == "fp32"


def test_a_precision_given_is_used(tmp_path, bf16_cpu):
    run = _run(tmp_path, json.dumps({"precision": "bf16"}))
    assert inference._precision_for("fp32", run, CPU) == "fp32"
    bf16_cpu["bf16"] = False
    assert inference._precision_for("bf16", run, CPU) == "bf16"


# --- a summary.json that cannot be used (sweep 2, D3): one warning, eval goes on in fp32 ---------

@pytest.mark.parametrize("text,why", [
    ("[1, 2]", "is a list, not a JSON object of the run's figures"),
    ("null", "is null, not a JSON object of the run's figures"),
    ('"bf16"', "is a string, not a JSON object"),
    ('{"precision": "bf16", "wall_s": "soon"}', "'wall_s' is a string, not a number"),
    ("{not json", "is not valid JSON"),
])
def test_a_summary_that_is_not_an_object_of_figures_is_ignored_with_one_warning(
        tmp_path, bf16_cpu, capsys, text, why):
    """Was an AttributeError traceback for a list or null (``json.loads(...).get``)."""
    run = _run(tmp_path, text)
    assert inference._precision_for("auto", run, CPU) == "fp32"
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"mnistflow: warning: {run / 'summary.json'}: {why}"), err
    assert err[0].endswith("evaluating in fp32 (--precision chooses)"), err


def test_a_huge_summary_is_refused_from_its_size_not_read(tmp_path, bf16_cpu, capsys):
    """A sparse 256 MiB summary.json costs nothing on disk: the old reader loaded all of it (and
    its decoded text: 2.4 GB RSS for 1 GiB); the run files' capped reader never reads it."""
    from helpers import memory

    run = _run(tmp_path, None)
    with open(run / "summary.json", "wb") as f:
        f.truncate(256 << 20)
    got, grew = memory.peak_growth(lambda: inference._precision_for("auto", run, CPU))
    assert got == "fp32"
    assert grew < 32 << 20, f"{grew / 2**20:.0f} MiB ({memory.METHOD})"
    err = capsys.readouterr().err
    assert "a run file of 268,435,456 bytes is over the 4,194,304-byte limit" in err, err


def test_eval_and_report_share_one_summary_reader(tmp_path):
    """``runlog.read_summary``: None without a file, the object when it is one, else one error
    naming the file (report refuses the run with it; eval warns and goes on)."""
    from mnistflow import inference, reporting
    from mnistflow.artifacts import runlog
    from mnistflow.core.errors import MnistflowError

    assert inference.read_summary is runlog.read_summary  # eval's reader
    assert reporting.load_run is runlog.load_run  # report's: it reads summary.json with read_summary
    path = tmp_path / "summary.json"
    assert runlog.read_summary(path) is None
    path.write_text(json.dumps({"precision": "bf16", "wall_s": 1.5}))
    assert runlog.read_summary(path) == {"precision": "bf16", "wall_s": 1.5}
    path.write_text("[1, 2]")
    with pytest.raises(MnistflowError, match=r"summary\.json: is a list, not a JSON object"):
        runlog.read_summary(path)
    path.unlink()
    path.mkdir()
    with pytest.raises(MnistflowError, match=r"summary\.json: not a regular file \(a folder\)"):
        runlog.read_summary(path)
