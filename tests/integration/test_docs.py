"""The tutorial cannot rot: its blocks marked ``runnable`` run, in order, in one directory.

A fenced block whose info string is ``bash runnable`` runs in bash (``set -eo pipefail``); one
marked ``python runnable`` runs in this interpreter. Training that would take minutes is
written ``--epochs ${EPOCHS:-4}`` in the tutorial; here ``EPOCHS`` is a sliver of an epoch.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.cli import REPO

TUTORIAL = REPO / "docs" / "tutorial.md"
FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```[ \t]*$", re.S | re.M)
# What the runnable blocks may be shrunk by (the tutorial reads ${EPOCHS:-4} as 4).
SMALL = {"EPOCHS": "0.05"}


def blocks(text: str) -> list[tuple[str, bool, str, int]]:
    """(language, runnable, code, line) of each fenced code block, in order."""
    return [(m.group(1), "runnable" in m.group(2).split(), m.group(3), text.count("\n", 0, m.start()) + 1)
            for m in FENCE.finditer(text)]


def runnable(text: str) -> list[tuple[str, str, int]]:
    return [(lang, code, line) for lang, run, code, line in blocks(text) if run]


def test_markers_are_understood():
    text = TUTORIAL.read_text()
    found = blocks(text)
    fences = sum(1 for ln in text.splitlines() if ln.startswith("```"))
    assert fences == 2 * len(found), "an unclosed or nested code fence"
    bad = [(lang, line) for lang, run, _, line in found if run and lang not in ("bash", "python")]
    assert not bad, f"runnable blocks must be bash or python: {bad}"
    cmds = "\n".join(code for lang, code, _ in runnable(text) if lang == "bash")
    for verb in ("doctor", "prep", "train", "eval", "report", "summary", "export"):
        assert f"mnistflow {verb}" in cmds, verb


def test_runnable_commands_use_existing_verbs():
    """Cheap guard that runs first: every 'mnistflow VERB' of a runnable block exists."""
    from mnistflow.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "verb")
    text = "\n".join(code for lang, code, _ in runnable(TUTORIAL.read_text()) if lang == "bash")
    used = set(re.findall(r"^\s*(?:time\s+)?mnistflow\s+([a-z]+)", text, re.M))
    assert used and used <= set(sub.choices), used - set(sub.choices)


@pytest.mark.slow  # ~20 commands, each starting Python and PyTorch: 45-70 s on 2 busy cores
def test_tutorial_runs_as_written(mnist_dir, tmp_path):
    env = dict(os.environ, MNISTFLOW_DATA=str(mnist_dir), MNISTFLOW_THREADS="1", **SMALL)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    times = []
    for n, (lang, code, line) in enumerate(runnable(TUTORIAL.read_text())):
        t0 = time.perf_counter()
        if lang == "bash":
            cmd = ["bash", "-c", "set -eo pipefail\n" + code]
        else:
            script = tmp_path / f"_block{n}.py"
            script.write_text(code)
            cmd = [sys.executable, str(script)]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        times.append((time.perf_counter() - t0, line))
        assert proc.returncode == 0, (f"docs/tutorial.md line {line}: the block failed (exit "
                                      f"{proc.returncode})\n--- code\n{code}\n--- stdout\n"
                                      f"{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
    # what the tutorial promises to exist afterwards
    for rel in ("data/mnist/meta.json", "runs/softmax/report/index.html", "runs/seed-cnn/report/compare.png",
                "runs/resumable/model.safetensors", "runs/softmax/model.onnx", "runs/digits/model.safetensors"):
        assert (tmp_path / rel).is_file(), rel
    print("block times (s, line):", [(round(t, 1), ln) for t, ln in times])
