"""The public API: every name resolves lazily; a user's own nn.Module, trained with a callback
on real MNIST, works with every later verb (eval, predict, export, report, serve)."""
from __future__ import annotations

import importlib
import json
import os

import numpy as np
import pytest

import mnistflow
from helpers.cli import REPO, assert_one_line_error, run_cli
from helpers.custom_models import TinyNet
from helpers.images import png, real_digits

# the CLI (another process) imports the user's model module from here, as a user's would
TESTS_ON_PATH = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")]))}


def test_api_names_are_not_shadowed_by_submodules():
    for name, (mod, _) in mnistflow._API.items():
        importlib.import_module(mod)  # importing a submodule binds its name on the package
    for name in mnistflow._API:
        obj = getattr(mnistflow, name)
        assert callable(obj) and not isinstance(obj, type(mnistflow)), name


def test_public_names():
    from mnistflow.training import api, callbacks, hooks

    assert mnistflow.train is api.train
    assert mnistflow.EarlyStopping is callbacks.EarlyStopping and mnistflow.CSVLogger is callbacks.CSVLogger
    assert mnistflow.StopTraining is hooks.StopTraining
    assert {"train", "EarlyStopping", "CSVLogger", "StopTraining"} <= set(dir(mnistflow))
    with pytest.raises(AttributeError):
        mnistflow.no_such_name


@pytest.fixture(scope="module")
def custom_run(mnist_records, tmp_path_factory):
    """A user's TinyNet trained for 120 steps with a callback: (run directory, summary, what
    the callback saw)."""
    run = tmp_path_factory.mktemp("custom") / "run"

    class BestSoFar:  # a callback may be local: only the model must be importable
        def __init__(self):
            self.seen = []

        def on_validation_end(self, step, logs):
            if logs["split"] == "val":
                self.seen.append((step, logs["val_acc"]))
                return {"best_val_acc": max(acc for _, acc in self.seen)}

    cb = BestSoFar()
    s = mnistflow.train(TinyNet, mnist_records, model_kwargs={"width": 8}, callbacks=[cb], run_dir=run,
                        max_steps=120, eval_every=60, batch_size=128, lr=3e-3, quiet=True, threads=1,
                        tensorboard=False, keep_checkpoints=0, device="cpu")  # eval below: --device cpu
    return run, s, cb.seen


def test_custom_model_trains_with_a_callback(custom_run):
    run, s, seen = custom_run
    assert s["steps"] == 120 and s["test_acc"] > 0.8, s
    assert s["model"] == "helpers.custom_models:TinyNet" and not s["warnings"]
    assert [step for step, _ in seen] == [60, 120]
    metrics = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    best = {r["step"]: r["best_val_acc"] for r in metrics if "best_val_acc" in r}
    assert best == {60: seen[0][1], 120: max(seen[0][1], seen[1][1])}


def test_eval_predict_export_report_from_the_cli(custom_run, tmp_path):
    run, s, _ = custom_run
    proc = run_cli("eval", str(run), "--json", "--device", "cpu", env=TESTS_ON_PATH)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["acc"] == pytest.approx(s["test_acc"], abs=1e-9)

    x, y = real_digits(4)
    files = []
    for i, a in enumerate(x):
        (tmp_path / f"d{i}.png").write_bytes(png(a))
        files.append(str(tmp_path / f"d{i}.png"))
    proc = run_cli("predict", str(run), *files, "--json", env=TESTS_ON_PATH)
    assert proc.returncode == 0, proc.stderr
    preds = json.loads(proc.stdout)
    from mnistflow.artifacts.predictor import predict_arrays

    model, info = mnistflow.load_model(run)  # in this process: the same answers
    expect = predict_arrays(model, info, x[..., None]).argmax(1)
    assert [p["label"] for p in preds] == expect.tolist()

    proc = run_cli("export", str(run), "--format", "onnx", "--out", str(tmp_path / "m.onnx"), "--json",
                   env=TESTS_ON_PATH)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "m.onnx").is_file()
    proc = run_cli("report", str(run), env=TESTS_ON_PATH)
    assert proc.returncode == 0, proc.stderr


def test_without_the_module_the_cli_says_what_to_do(custom_run):
    run, _, _ = custom_run
    proc = run_cli("eval", str(run), env={"PYTHONPATH": os.environ.get("PYTHONPATH")})
    assert_one_line_error(proc, "helpers.custom_models")
    assert "PYTHONPATH" in proc.stderr


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
def test_the_server_answers(custom_run):
    from starlette.testclient import TestClient

    from mnistflow.server import create_app

    run, _, _ = custom_run
    x, y = real_digits(10, start=300)
    with TestClient(create_app(run)) as client:
        m = client.get("/api/model").json()
        assert m["model"] == "helpers.custom_models:TinyNet" and m["in_shape"] == [1, 28, 28]
        labels = []
        for a in x:
            r = client.post("/api/predict", json={"pixels": a.tolist()})
            assert r.status_code == 200, r.text
            assert abs(sum(r.json()["probabilities"]) - 1) < 1e-3
            labels.append(r.json()["label"])
    assert (np.array(labels) == y).sum() >= 7
