"""The examples run as a user would run them (with a step limit), train for real and report
an accuracy; chapters 3 and 4 stay short enough to read in one screen. The run of a user's own
model (custom_callback.py) then works from the CLI, as its docstring says: eval and serve."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import httpx
import pytest

from helpers.cli import REPO, run_cli, start_serve

EXAMPLES = REPO / "examples"
# example -> (steps, the test accuracy those few steps must reach)
CASES = {"softmax.py": (50, 0.85), "cnn.py": (20, 0.60), "custom_model.py": (30, 0.85),
         "custom_callback.py": (30, 0.80)}
MODULES = {"my_models.py"}  # imported by the examples, not run on their own


def test_every_example_is_tested():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(set(CASES) | MODULES)


@pytest.mark.parametrize("name", ["softmax.py", "cnn.py"])
def test_chapter_examples_are_short(name):
    assert len((EXAMPLES / name).read_text().splitlines()) < 60


def run_example(name: str, mnist_dir, tmp_path) -> tuple[str, float]:
    """Run an example as a user would, with its step limit; (its stdout, the test accuracy it
    printed), after the checks every example must pass."""
    steps, floor = CASES[name]
    env = dict(os.environ, MNISTFLOW_DATA=str(mnist_dir), MNISTFLOW_THREADS="1",
               MNISTFLOW_EXAMPLE_STEPS=str(steps))
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    acc = re.search(r"test accuracy (\d+\.\d+)%", proc.stdout)
    assert acc, proc.stdout[-2000:]
    assert float(acc.group(1)) / 100 >= floor, proc.stdout[-2000:]
    assert re.search(rf"\b{steps} steps\b", proc.stdout), "the step limit was not applied"
    assert (tmp_path / "data" / "mnist" / "meta.json").is_file()  # records made where it ran
    assert len(list((tmp_path / "runs").glob("*/model.safetensors"))) == 1
    return proc.stdout, float(acc.group(1))


@pytest.mark.parametrize("name", sorted(set(CASES) - {"custom_callback.py"}))  # that one: below
def test_example_trains_and_reports_accuracy(name, mnist_dir, tmp_path):
    run_example(name, mnist_dir, tmp_path)


def test_custom_model_example_then_eval_and_serve_from_the_cli(mnist_dir, tmp_path, monkeypatch):
    out, acc = run_example("custom_callback.py", mnist_dir, tmp_path)
    assert "PYTHONPATH=examples mnistflow eval runs/tiny-cnn" in out
    run = tmp_path / "runs" / "tiny-cnn"
    rows = (run / "log.csv").read_text().splitlines()  # the CSVLogger callback's file
    assert rows[0].startswith("kind,step,") and len(rows) >= 2
    # the example's commands, with examples/ on PYTHONPATH as its docstring says
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")])))
    ev = run_cli("eval", str(run), "--json", cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr
    # the same figure; on a GPU the run's own test pass was in bf16, eval's may not be: 5 images
    gpu = json.loads((run / "summary.json").read_text())["device"].startswith("cuda")
    assert 100 * json.loads(ev.stdout)["acc"] == pytest.approx(acc, abs=0.05 if gpu else 0.006)
    server, first = start_serve(run)
    try:
        url = re.search(r"http://\S+", first)
        assert url, first + server.stderr.read()
        r = httpx.get(url.group(0).rstrip("/") + "/api/model", timeout=30)
        assert r.status_code == 200 and r.json()["model"] == "my_models:TinyCNN"
    finally:
        server.terminate()
        server.wait(10)
