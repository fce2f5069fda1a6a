"""The results file has one writer (benchmarks/results.py, called by frontier.py and family.py)
and the docs are rendered from it (benchmarks/render_docs.py): the shipped file is in the
writer's form, what the writer records is what ``--target-acc`` reads, and README.md and
BENCHMARKS.md hold exactly what the file renders to."""
from __future__ import annotations

import json
import sys

import pytest
import torch
from helpers.cli import REPO

from mnistflow.training import recipes

sys.path.insert(0, str(REPO / "benchmarks"))
import render_docs  # noqa: E402
import results  # noqa: E402

PROV = {"machine": "Test CPU (family 1 model 2) [avx2], 2 cores", "torch": "2.13.0+cpu",
        "commit": "a" * 40, "date": "2026-12-01"}


def _summaries(accs: list[float], walls: list[float]) -> list[dict]:
    return [{"test_acc": a, "wall_s": w, "precision": "fp32"} for a, w in zip(accs, walls)]


def test_the_docs_are_rendered_from_the_shipped_results_file():
    assert render_docs.main(["--check"]) == 0, "run: python benchmarks/render_docs.py"


def test_a_doc_out_of_date_is_found_and_a_missing_block_is_an_error(tmp_path):
    data = recipes.measured()
    text = (REPO / "README.md").read_text()
    current = render_docs.render(text, data, ("readme",))
    assert current == text
    stale = text.replace("99.03-99.12%", "99.00-99.12%")
    assert stale != text and render_docs.render(stale, data, ("readme",)) == text
    with pytest.raises(SystemExit, match="missing blocks"):
        render_docs.render("no markers here\n", data, ("readme",))


def test_the_shipped_file_is_in_the_writers_form():
    text = recipes.MEASURED_FILE.read_text()
    assert results.dumps(json.loads(text)) == text
    assert results.RESULTS == recipes.MEASURED_FILE


def test_a_run_recorded_replaces_what_it_measured_and_keeps_the_rest(tmp_path, monkeypatch):
    path = tmp_path / "measured.json"
    runs = {"fast": results.recipe_result(PROV, [0, 1, 2], _summaries([0.9907, 0.9903, 0.9912], [2.2, 2.1, 2.3])),
            "mid": results.recipe_result(PROV, [0, 1, 2], _summaries([0.9959, 0.9956, 0.9959], [78.0, 76.0, 77.0]))}
    base = {"accs": [0.985, 0.9902, 0.9905], "times": [40.0, 80.0, 120.0], "epochs": 3}
    baselines = {"A": results.baseline_result(PROV, 300, base, results.LEVELS)}
    results.record("cpu", "fp32", "mnist", runs, baselines, path=path)
    later = dict(PROV, commit="b" * 40)
    results.record("cpu", "fp32", "mnist", {"fast": results.recipe_result(
        later, [0, 1, 2], _summaries([0.9910, 0.9905, 0.9911], [2.0, 2.0, 2.0]))}, path=path)
    data = json.loads(path.read_text())
    entry = data["machines"]["cpu"]["datasets"]["mnist"]
    assert data["version"] == 1 and data["machines"]["cpu"]["precision"] == "fp32"
    assert entry["recipes"]["fast"]["commit"] == "b" * 40 and entry["recipes"]["mid"]["commit"] == "a" * 40
    assert entry["baselines"]["A"]["reached_s"] == {"0.990": 80.0} and entry["baselines"]["A"]["best_acc"] == 0.9905
    assert path.read_text() == results.dumps(data)
    # what --target-acc reads: every seed of mid reached 99.56%, fast's worst 99.05%
    monkeypatch.setattr(recipes, "measured", lambda: data)
    assert recipes.summary("cpu", "mnist") == {"fast": (0.9905, 0.991, 0.9911, 2.0),
                                               "mid": (0.9956, 0.9959, 0.9959, 77.0)}
    assert recipes.pick_for_target(0.995, "mnist", "cpu")[0] == "mid"
    assert recipes.pick_for_target(0.99, "mnist", "gpu")[0] == "fast"  # no GPU figures: the CPU's
    # and the docs render it: per seed, and the frontier
    assert "| fast | 0 / 1 / 2 | 99.10 / 99.05 / 99.11 | 99.10 | 2.00 / 2.00 / 2.00 | 2.00 |" \
        in render_docs.seeds(data)
    assert "| 99.5% | `mid` 77.0 s |" in render_docs.frontier(data)


@pytest.mark.parametrize("device,precision,kind", [("cpu", "fp32", "cpu"), ("cpu", "bf16", "cpu-bf16"),
                                                   ("cuda", "bf16", "gpu"), ("cuda:1", "fp16", "gpu")])
def test_the_kind_of_machine_is_the_device_and_the_precision_the_runs_trained_in(device, precision, kind):
    assert results.machine_kind(device, precision) == kind
    assert kind in recipes.MACHINES


def _fake_training(monkeypatch, tmp_path, precision: str = "bf16") -> list[dict]:
    """mnistflow.prepare/train and the records stand-ins: each call a run of seed s with test
    accuracy 0.99 + s / 1e3 and s + 1 seconds (the benchmarks' own code runs as written)."""
    import mnistflow
    from mnistflow.data import records

    calls = []

    def train(**kw):
        calls.append(kw)
        return {"test_acc": 0.99 + kw["seed"] / 1e3, "wall_s": kw["seed"] + 1.0, "precision": precision}

    monkeypatch.setattr(mnistflow, "prepare", lambda *a, **k: tmp_path / "rec")
    monkeypatch.setattr(mnistflow, "train", train)
    monkeypatch.setattr(records, "open_records", lambda p: type("R", (), {"path": p})())
    return calls


def test_frontier_records_every_seed_for_the_machine_it_ran_on(monkeypatch, tmp_path):
    import frontier

    calls = _fake_training(monkeypatch, tmp_path)
    monkeypatch.setattr(frontier, "provenance", lambda device: PROV)
    fake_base = {"accs": [0.98, 0.991], "times": [10.0, 20.0], "epochs": 2}
    monkeypatch.setattr(frontier, "baseline_a", lambda *a, **k: fake_base)
    monkeypatch.setattr(frontier, "baseline_b", lambda *a, **k: fake_base)
    path = tmp_path / "measured.json"
    threads = str(torch.get_num_threads())  # main() sets it: leave it as it is
    monkeypatch.setattr(sys, "argv", ["frontier.py", "--threads", threads, "--recipes", "fast", "mid", "--seeds", "0", "2",
                                      "--png", str(tmp_path / "f.png"), "--results", str(path)])
    frontier.main()
    assert len(calls) == 4
    entry = json.loads(path.read_text())["machines"]["cpu-bf16"]["datasets"]["mnist"]
    assert entry["recipes"]["mid"] == {**PROV, "seeds": [0, 2], "test_acc": [0.99, 0.992], "wall_s": [1.0, 3.0]}
    assert entry["baselines"]["B"]["reached_s"] == {"0.990": 20.0}


def test_family_records_each_dataset_it_measured(monkeypatch, tmp_path):
    import family

    _fake_training(monkeypatch, tmp_path, precision="fp32")
    monkeypatch.setattr(family, "provenance", lambda device: PROV)
    (tmp_path / "fashion-mnist").mkdir()
    path = tmp_path / "measured.json"
    threads = str(torch.get_num_threads())
    monkeypatch.setattr(sys, "argv", ["family.py", "--threads", threads, "--data-root", str(tmp_path), "--datasets", "fashion-mnist",
                                      "kmnist", "--recipes", "fast", "--no-baseline", "--results", str(path)])
    family.main()
    datasets = json.loads(path.read_text())["machines"]["cpu"]["datasets"]
    assert list(datasets) == ["fashion-mnist"]  # kmnist: no files, not measured, nothing recorded
    assert datasets["fashion-mnist"]["recipes"]["fast"]["test_acc"] == [0.99, 0.991, 0.992]
