"""Runs logged to MLflow (``--mlflow URI``, ``mnistflow.MLflowLogger``), read back with MLflow's
own client from a file store in the test's folder: the settings as params, the curves at their
steps, the figures the run's own files hold, its files as artifacts; a resume continues its
MLflow run; and the failures a user meets: MLflow not installed, a store that does not answer
(one line, exit 2, before the first step), a store lost mid-run (one warning, the run goes on).
MLflow 3 keeps its file store behind MLFLOW_ALLOW_FILE_STORE (mlflow-skinny has no sqlite
store and no server): the tests set it."""
from __future__ import annotations

import json
import shutil
import socket
import time

import pytest

from helpers import inject
from helpers.cli import assert_one_line_error, run_cli
from mnistflow.core.errors import MnistflowError

ALLOW = {"MLFLOW_ALLOW_FILE_STORE": "true"}


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A file store in tmp_path (its URI), and MLflow's client reading it."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    for k, v in ALLOW.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = (tmp_path / "mlruns").as_uri()
    return uri, MlflowClient(uri)


def only_run(client, experiment: str = "mnistflow"):
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


def history(client, run, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]


def jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_cli_run_is_logged_and_a_resume_continues_it(mnist_records, tmp_path, store):
    uri, client = store
    run = tmp_path / "run"
    args = ("--recipe", "softmax", "--data", str(mnist_records), "--run-dir", str(run), "--threads", "1",
            "--log-every", "20", "--no-tensorboard")
    proc = run_cli("train", *args, "--max-steps", "60", "--lr", "0.25", "--mlflow", uri, env=ALLOW)
    assert proc.returncode == 0, proc.stderr
    r = only_run(client)
    assert r.info.status == "FINISHED" and r.info.run_name == "run"
    assert r.data.tags["mnistflow.run_dir"] == str(run)
    # the params are the run's settings (as config.toml holds them), less how it is watched
    p = r.data.params
    assert p["batch_size"] == "100" and p["lr"] == "0.25" and p["model"] == "softmax" and p["max_steps"] == "60"
    assert "mlflow" not in p and "run_dir" not in p and "quiet" not in p
    # the curves at the logged steps, the numbers metrics.jsonl holds; the test figure summary.json's
    recs = jsonl(run / "metrics.jsonl")
    train = [(x["step"], x["loss"]) for x in recs if x["kind"] == "train"]
    assert [s for s, _ in train] == [20, 40, 60]
    assert history(client, r, "train/loss") == [(s, pytest.approx(v)) for s, v in train]
    assert [s for s, _ in history(client, r, "lr")] == [20, 40, 60]
    summary = json.loads((run / "summary.json").read_text())
    assert history(client, r, "test/acc") == [(60, pytest.approx(summary["test_acc"]))]
    assert history(client, r, "val/acc") == [(60, pytest.approx(summary["val_acc"]))]
    assert r.data.metrics["run/wall_s"] == pytest.approx(summary["wall_s"])
    # its files: the model uploaded is the model file written
    assert {a.path for a in client.list_artifacts(r.info.run_id)} == {"config.toml", "model.safetensors",
                                                                       "summary.json"}
    got = client.download_artifacts(r.info.run_id, "model.safetensors", str(tmp_path))
    assert open(got, "rb").read() == (run / "model.safetensors").read_bytes()

    # resumed (config.toml replays --mlflow): the same MLflow run goes on to step 120
    proc = run_cli("train", "--resume", "--run-dir", str(run), "--max-steps", "120", env=ALLOW)
    assert proc.returncode == 0, proc.stderr
    r2 = only_run(client)
    assert r2.info.run_id == r.info.run_id and r2.info.status == "FINISHED"
    assert [s for s, _ in history(client, r2, "train/loss")] == [20, 40, 60, 80, 100, 120]
    assert r2.data.params == p  # the params it started with (MLflow keeps a param once)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 120
    assert r2.data.metrics["test/acc"] == pytest.approx(summary["test_acc"])


def test_callback_logs_to_its_experiment_a_lost_store_is_one_warning(mnist_records, tmp_path, store):
    """MLflowLogger as a callback, with its own experiment; the store removed mid-run (after
    step 40 was logged): one warning, and the run goes on to its end."""
    import mnistflow

    uri, client = store

    class LoseTheStore:
        def on_step_end(self, step, logs):
            if step == 60:  # before MLflowLogger (callbacks run in order) logs step 60
                shutil.rmtree(tmp_path / "mlruns")

    logger = mnistflow.MLflowLogger(uri, experiment="mine", run_name="first", tags={"who": "test"})
    s = mnistflow.train(recipe="softmax", data=mnist_records, run_dir=tmp_path / "run", max_steps=100,
                        log_every=20, threads=1, quiet=True, tensorboard=False,
                        callbacks=[LoseTheStore(), logger])
    assert s["steps"] == 100 and s["stop_reason"] == "max_steps"
    lost = [w for w in s["warnings"] if w.startswith("MLflow:")]
    assert len(lost) == 1 and "the run goes on without MLflow" in lost[0], s["warnings"]
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_a_failed_run_is_marked_failed(mnist_records, tmp_path, store):
    """An MLflow run of a run that fails is marked FAILED (the mlflow setting ends it)."""
    import mnistflow

    uri, client = store

    class Crash:
        def on_step_end(self, step, logs):
            if step == 30:
                raise RuntimeError("a bug in a callback")

    with pytest.raises(RuntimeError, match="a bug in a callback"):
        mnistflow.train(recipe="softmax", data=mnist_records, run_dir=tmp_path / "run", max_steps=100,
                        log_every=10, threads=1, quiet=True, tensorboard=False, mlflow=uri,
                        callbacks=[Crash()])
    r = only_run(client)
    assert r.info.status == "FAILED"
    assert [s for s, _ in history(client, r, "train/loss")] == [10, 20]
    # given as a callback, the logger is closed as the run ends too: its MLflow run is FAILED
    from mnistflow import MLflowLogger

    logger = MLflowLogger(uri, experiment="as-a-callback")
    with pytest.raises(RuntimeError, match="a bug in a callback"):
        mnistflow.train(recipe="softmax", data=mnist_records, run_dir=tmp_path / "run2", max_steps=100,
                        log_every=10, threads=1, quiet=True, tensorboard=False, callbacks=[logger, Crash()])
    exp = client.get_experiment_by_name("as-a-callback")
    (r2,) = client.search_runs([exp.experiment_id])
    assert r2.info.status == "FAILED"
    # interrupted (SIGINT: a checkpoint, then TrainingInterrupted): KILLED, which a resume continues
    import os
    import signal

    from mnistflow.training.checkpointing import TrainingInterrupted

    class Interrupt:
        def on_step_end(self, step, logs):
            if step == 30:
                os.kill(os.getpid(), signal.SIGINT)  # the run's handler takes it: it stops at the next point

    logger = MLflowLogger(uri, experiment="interrupted")
    with pytest.raises(TrainingInterrupted):
        mnistflow.train(recipe="softmax", data=mnist_records, run_dir=tmp_path / "run3", max_steps=100,
                        log_every=10, threads=1, quiet=True, tensorboard=False, callbacks=[logger, Interrupt()])
    exp = client.get_experiment_by_name("interrupted")
    (r3,) = client.search_runs([exp.experiment_id])
    assert r3.info.status == "KILLED"


def test_an_unreachable_store_is_one_line_before_training(mnist_records, tmp_path, store):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = ("--recipe", "softmax", "--data", str(mnist_records), "--max-steps", "20", "--threads", "1")
    t = time.monotonic()
    proc = run_cli("train", *common, "--run-dir", str(tmp_path / "run"), "--mlflow", f"http://127.0.0.1:{port}")
    assert_one_line_error(proc, f"MLflow at http://127.0.0.1:{port}: no answer from the server")
    assert time.monotonic() - t < 60  # not MLflow's four minutes of retries
    assert not (tmp_path / "run").exists()  # nothing trained, nothing left
    # MLflow 3's file store without its variable: what to do, in the line
    proc = run_cli("train", *common, "--run-dir", str(tmp_path / "run"), "--mlflow", store[0],
                   env={"MLFLOW_ALLOW_FILE_STORE": None})
    assert_one_line_error(proc, "MLFLOW_ALLOW_FILE_STORE=true")
    assert not (tmp_path / "run").exists()


def test_mlflow_not_installed_is_one_line_before_anything(mnist_records, tmp_path, monkeypatch):
    run = tmp_path / "run"
    proc = run_cli("train", "--recipe", "softmax", "--data", str(mnist_records), "--run-dir", str(run),
                   "--mlflow", "http://127.0.0.1:5000", env=inject.env(mlflow_missing=True))
    assert_one_line_error(proc, "--mlflow needs the optional package 'mlflow'", "pip install 'mnistflow[mlflow]'")
    assert not run.exists()
    import mnistflow

    inject.apply("mlflow_missing", True, setattr=monkeypatch.setattr)
    with pytest.raises(MnistflowError, match="needs the optional package 'mlflow'"):
        mnistflow.MLflowLogger()
