"""The examples run as a user would run them (with a step limit), train for real and report
an accuracy; chapters 3 and 4 stay short enough to read in one screen."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers.cli import REPO

EXAMPLES = REPO / "examples"
# example -> (steps, the test accuracy those few steps must reach)
CASES = {"softmax.py": (50, 0.85), "cnn.py": (20, 0.60), "custom_model.py": (30, 0.85)}


def test_every_example_is_tested():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(CASES)


@pytest.mark.parametrize("name", ["softmax.py", "cnn.py"])
def test_chapter_examples_are_short(name):
    assert len((EXAMPLES / name).read_text().splitlines()) < 60


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_trains_and_reports_accuracy(name, mnist_dir, tmp_path):
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
