"""The scripts in scripts/ and .ci/run: what they install and in which order, where the main job
finds MNIST, that CI runs exactly the README's test command, and that the README's picture is
made by scripts/screenshot_serve.py.

The shell scripts run for real in a copy of the checkout whose ``.venv`` holds stand-ins for
python, pip and mnistflow that record how they were called (nothing is installed, nothing is
downloaded); the screenshot script drives Debian's chromium against the serve tests' model.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import REPO

SCRIPTS = ("setup.sh", "train_mnist.sh", "test.sh")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def checkout(tmp_path: Path, *, torch: bool = False, pip_gives_torch: bool = True) -> Path:
    """``tmp_path/work/repo``: the scripts and a ``.venv`` of stand-ins. python's ``import
    torch`` succeeds once ``.venv/has-torch`` exists, which pip creates when asked for a
    pinned torch (unless ``pip_gives_torch`` is False); every call is logged in ``calls``."""
    root = tmp_path / "work" / "repo"
    (root / "scripts").mkdir(parents=True)
    for s in SCRIPTS:
        shutil.copy(REPO / "scripts" / s, root / "scripts" / s)
    venv = root / ".venv"
    (venv / "bin").mkdir(parents=True)
    log, marker = root / "calls", venv / "has-torch"
    if torch:
        marker.touch()
    (venv / "bin" / "activate").write_text(f'export PATH="{venv / "bin"}:$PATH"\n')
    _exe(venv / "bin" / "python", f"""#!/bin/sh
echo "python $*" >> {log}
case "$*" in *"import torch"*) test -e {marker};; esac
""")
    give = f"case \"$*\" in *torch==*) touch {marker};; esac" if pip_gives_torch else ""
    _exe(venv / "bin" / "pip", f'#!/bin/sh\necho "pip $*" >> {log}\n{give}\n')
    _exe(venv / "bin" / "mnistflow", f'#!/bin/sh\necho "mnistflow $* | data=${{MNISTFLOW_DATA:-}}" >> {log}\n')
    return root


def run(root: Path, script: str, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("MNISTFLOW_", "VIRTUAL_ENV", "PIP_")) and k != "RECIPE"}
    e.update(env)
    proc = subprocess.run(["bash", str(root / "scripts" / script), *args], env=e, capture_output=True,
                          text=True, timeout=60)
    log = root / "calls"
    return proc, log.read_text().splitlines() if log.exists() else []


def pip_calls(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("pip ")]


def test_setup_installs_the_pinned_torch_first_then_mnistflow(tmp_path):
    root = checkout(tmp_path)
    proc, calls = run(root, "setup.sh", MNISTFLOW_EXTRAS="dev,serve")
    assert proc.returncode == 0, proc.stderr
    assert pip_calls(calls) == ["pip install -q torch==2.13.0", "pip install -q numpy",
                                "pip install -q -e .[dev,serve]"]
    assert calls[-1] == "python -c import mnistflow"


def test_setup_takes_torch_from_the_index_it_is_given(tmp_path):
    root = checkout(tmp_path)
    proc, calls = run(root, "setup.sh", MNISTFLOW_TORCH_INDEX=CPU_INDEX)
    assert proc.returncode == 0, proc.stderr
    assert pip_calls(calls)[0] == f"pip install -q torch==2.13.0 --index-url {CPU_INDEX}"
    assert pip_calls(calls)[-1] == "pip install -q -e ."  # mnistflow itself from the usual sources


def test_setup_keeps_a_torch_already_in_the_venv(tmp_path):
    root = checkout(tmp_path, torch=True)
    proc, calls = run(root, "setup.sh", MNISTFLOW_TORCH_INDEX=CPU_INDEX)
    assert proc.returncode == 0, proc.stderr
    assert pip_calls(calls) == ["pip install -q numpy", "pip install -q -e ."]


def test_setup_stops_when_torch_did_not_install(tmp_path):
    root = checkout(tmp_path, pip_gives_torch=False)
    proc, calls = run(root, "setup.sh")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == "scripts/setup.sh: torch failed to install"
    assert not [c for c in pip_calls(calls) if " -e " in c]


@pytest.mark.parametrize("where", ["shared", "env", "neither"])
def test_the_main_job_finds_mnist_as_the_readme_says(tmp_path, where):
    """$MNISTFLOW_DATA, else ../shared/data/mnist when it exists, else nothing set (mnistflow's
    own order: the cache, else a download); RECIPE and extra arguments reach train."""
    root = checkout(tmp_path, torch=True)
    shared = root.parent / "shared" / "data" / "mnist"
    env = {"RECIPE": "fast"}
    if where != "neither":
        shared.mkdir(parents=True)
    if where == "env":
        env["MNISTFLOW_DATA"] = str(tmp_path / "mine")
    proc, calls = run(root, "train_mnist.sh", "--epochs", "1", **env)
    assert proc.returncode == 0, proc.stderr
    data = {"shared": str(root / ".." / "shared" / "data" / "mnist"), "env": str(tmp_path / "mine"),
            "neither": ""}[where]
    ran = [c for c in calls if c.startswith("mnistflow ")]
    assert ran == [f"mnistflow prep mnist --out data/mnist | data={data}",
                   f"mnistflow train --recipe fast --data data/mnist --epochs 1 | data={data}"]


def _readme_test_command() -> str:
    """The line of the README's first bash block that runs scripts/test.sh, comment cut off."""
    block = re.search(r"^```bash\n(.*?)^```", (REPO / "README.md").read_text(), re.S | re.M)[1]
    (line,) = [ln for ln in block.splitlines() if "scripts/test.sh" in ln]
    return line.split("#")[0].strip()


def test_ci_runs_exactly_the_readmes_test_command():
    commands = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()
                if ln.strip() and not ln.lstrip().startswith("#")]
    assert commands[-1] == _readme_test_command() == "bash scripts/test.sh"
    # nothing else but bash's strictness and the checkout's root: no environment of its own
    assert commands[:-1] == ["set -euo pipefail", 'cd "$(dirname "$0")/.."'], commands


def test_the_scripts_parse():
    for path in [*(REPO / "scripts" / s for s in SCRIPTS), REPO / ".ci" / "run"]:
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, (path, proc.stderr)


def test_the_readmes_picture_is_made_by_the_screenshot_script(serve_model, tmp_path):
    """The script serves a trained model, draws a digit on the page in Chromium, and the page
    names it and shows its layers; the PNG it writes (the 1280x800 window) is as small as the
    README's picture must be."""
    if shutil.which("chromium") is None:
        pytest.fail("Debian's chromium is not installed: apt-get install -y chromium (scripts/test.sh does it)")
    out = tmp_path / "serve.png"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "screenshot_serve.py"), str(serve_model),
                           str(out), "--digit", "7"], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "drew 7, the page says 7;" in proc.stdout, proc.stdout
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 100_000
    import numpy as np
    from PIL import Image

    with Image.open(out) as img:
        assert img.mode == "P" and (img.width, img.height) == (1280, 800)
        grey = np.asarray(img.convert("RGB")).astype(int)
        tiles = grey[200:380, 400:1230]  # the first layer's feature maps, right of the drawing
        assert (np.ptp(tiles, axis=(0, 1)) > 100).all() and len(np.unique(tiles[..., 0])) > 20
