"""Model files and checkpoints that must not be read, as a user meets them on the command line:
a FIFO (its open would wait forever), a link to /dev/zero (never ends), a file with NaN
weights. Each is one error line and exit 2, at once and in bounded memory (the processes run
under a 3 GB address-space limit), or, for a checkpoint candidate, one warning and the fallback
to the previous checkpoint."""
from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from helpers.cli import assert_one_line_error

LIMIT = 3 * 10 ** 9  # bytes of address space: a read of /dev/zero fails fast instead of eating the RAM


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mnistflow", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})},
                          preexec_fn=_limited, check=False)


@pytest.fixture(scope="module")
def run(mnist_records, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile-model-files")
    rd = folder / "run"
    proc = cli("train", "--recipe", "softmax", "--data", mnist_records, "--run-dir", rd, "--max-steps", "20",
               "--checkpoint-every", "10", "--threads", "1", "--quiet", timeout=300)
    assert proc.returncode == 0, proc.stderr
    png = folder / "d.png"
    Image.fromarray(np.full((28, 28), 0, np.uint8)).save(png)
    return rd, png


def test_a_dev_zero_checkpoint_candidate_falls_back(run, tmp_path):
    rd, png = run
    lp = tmp_path / "lp"
    shutil.copytree(rd, lp)
    (lp / "model.safetensors").unlink()
    (lp / "checkpoints" / "step-000999.pt").symlink_to("/dev/zero")
    proc = cli("predict", lp, png)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "step-000999.pt: not a regular file (a device); refusing to read it; " \
        "falling back to the previous checkpoint step-000020.pt" in lines[0], proc.stderr
    assert "d.png" in proc.stdout


@pytest.mark.parametrize("name", ["m.safetensors", "m.onnx", "m.pt"])
def test_a_fifo_model_file_is_one_error_at_once(run, tmp_path, name):
    _, png = run
    os.mkfifo(tmp_path / name)
    for verb in (["predict", tmp_path / name, png], ["eval", tmp_path / name], ["summary", tmp_path / name]):
        assert_one_line_error(cli(*verb, timeout=60), name, "not a regular file (a FIFO)")


def test_a_dev_zero_onnx_is_one_error(run, tmp_path):
    _, png = run
    (tmp_path / "z.onnx").symlink_to("/dev/zero")
    assert_one_line_error(cli("predict", tmp_path / "z.onnx", png), "z.onnx", "not a regular file (a device)")


def test_a_fifo_metrics_file_stops_a_resume_at_once(run, tmp_path):
    rd = tmp_path / "r"
    shutil.copytree(run[0], rd)
    (rd / "metrics.jsonl").unlink()
    os.mkfifo(rd / "metrics.jsonl")
    assert_one_line_error(cli("train", "--resume", "--run-dir", rd, "--max-steps", "30", "--threads", "1",
                              timeout=120), "metrics.jsonl", "not a regular file (a FIFO)")


def test_nan_weights_are_one_error(run, tmp_path):
    rd, png = run
    with safe_open(str(rd / "model.safetensors"), "pt") as f:
        meta = f.metadata()
    w = load_file(str(rd / "model.safetensors"))
    w["fc1.weight"][0, 0] = float("nan")
    save_file(w, str(tmp_path / "nan.safetensors"), metadata=meta)
    for verb in (["predict", tmp_path / "nan.safetensors", png],
                 ["export", tmp_path / "nan.safetensors", "--format", "npz", "--out", tmp_path / "x.npz"]):
        assert_one_line_error(cli(*verb), "nan.safetensors", "tensor 'fc1.weight' holds 1 non-finite value")
    assert not (tmp_path / "x.npz").exists()
