"""A run's config.toml replays it bit for bit on a CPU: the thread count the run got, the
precision as resolved, the native kernels and a user's own model (its import path and keyword
arguments) are recorded, so ``mnistflow train --config RUN/config.toml`` trains the same
weights, also beside a busy process (which used to lower the thread count) and also for a
model of the user's that only the Python API could train before."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

import mnistflow
from helpers.cli import run_cli
from helpers.custom_models import TinyNet
from mnistflow.artifacts.rundir import RunDir
from mnistflow.training.config import load_toml

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _same_weights(a, b) -> bool:
    wa, wb = load_file(str(RunDir(a).model)), load_file(str(RunDir(b).model))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture
def neighbour():
    """A process that is always runnable: what made a run shed threads on a busy machine."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.3)
    yield busy
    busy.kill()
    busy.wait()


def test_a_default_run_replays_bit_for_bit_beside_a_busy_process(mnist_records, tmp_path, request):
    a, b = tmp_path / "a", tmp_path / "b"
    free = {"MNISTFLOW_THREADS": None}  # the run picks its own thread count, as a user's does
    proc = run_cli("train", "--model", "conv3x3x8-bn-relu,maxpool2,fc10", "--data", str(mnist_records),
                   "--run-dir", str(a), "--max-steps", "40", "--no-tensorboard", "--quiet", env=free)
    assert proc.returncode == 0, proc.stderr
    cfg = load_toml(RunDir(a).config)
    assert cfg["threads"] >= 1 and cfg["precision"] in ("fp32", "bf16") and cfg["kernels"] in ("auto", "off")
    request.getfixturevalue("neighbour")  # now the machine is busy
    proc = run_cli("train", "--config", str(RunDir(a).config), "--run-dir", str(b), env=free)
    assert proc.returncode == 0, proc.stderr
    assert "training on" not in proc.stderr  # no thread count lowered for the load: the recorded one
    assert load_toml(RunDir(b).config)["threads"] == cfg["threads"]
    assert _same_weights(a, b)


def test_a_user_model_run_replays_from_the_command_line(mnist_records, tmp_path):
    """The API trains ``TinyNet(width=6)``; config.toml names it and its arguments, and the CLI
    (with the module importable) trains the same weights from that file alone."""
    a, b = tmp_path / "a", tmp_path / "b"
    mnistflow.train(TinyNet, mnist_records, model_kwargs={"width": 6}, run_dir=a, max_steps=20,
                    threads=1, quiet=True, tensorboard=False, precision="fp32")
    cfg = load_toml(RunDir(a).config)
    assert cfg["model"] == "helpers.custom_models:TinyNet"
    assert cfg["model_kwargs"] == {"width": 6, "num_classes": 10, "in_shape": [1, 28, 28]}
    env = {"PYTHONPATH": os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH", "")) if p)}
    proc = run_cli("train", "--config", str(RunDir(a).config), "--run-dir", str(b), env=env)
    assert proc.returncode == 0, proc.stderr
    assert _same_weights(a, b)
    # the same model named on the command line, with its arguments
    c = tmp_path / "c"
    proc = run_cli("train", "--model", "helpers.custom_models:TinyNet", "--model-kwargs", '{"width": 6}',
                   "--data", str(mnist_records), "--run-dir", str(c), "--max-steps", "20", "--threads", "1",
                   "--precision", "fp32", "--no-tensorboard", "--quiet", env=env)
    assert proc.returncode == 0, proc.stderr
    assert _same_weights(a, c)
    # not importable: one line before any work
    proc = run_cli("train", "--config", str(RunDir(a).config), "--run-dir", str(tmp_path / "d"),
                   env={"PYTHONPATH": None})
    assert proc.returncode == 2 and "helpers.custom_models" in proc.stderr and "PYTHONPATH" in proc.stderr
    assert not (tmp_path / "d").exists()


def test_kernels_off_is_recorded_and_replayed(mnist_records, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    proc = run_cli("train", "--model", "fast", "--data", str(mnist_records), "--run-dir", str(a),
                   "--max-steps", "5", "--no-tensorboard", "--quiet", "--json", env={"MNISTFLOW_KERNELS": "0"})
    assert proc.returncode == 0, proc.stderr
    assert load_toml(RunDir(a).config)["kernels"] == "off"  # the environment's choice, recorded
    proc = run_cli("train", "--config", str(RunDir(a).config), "--run-dir", str(b), "--json")
    assert proc.returncode == 0, proc.stderr
    assert '"ops": []' in proc.stdout  # the replay ran on PyTorch's ops too
    assert _same_weights(a, b)
