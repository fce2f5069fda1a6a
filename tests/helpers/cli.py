"""Running mnistflow as a user would (a subprocess), and the one-line error contract."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 600):
    """Run ``python -m mnistflow`` in a subprocess, as a user would; returns CompletedProcess.
    ``env`` adds variables; a value of None removes one."""
    e = dict(os.environ)
    e.update(env or {})
    e = {k: v for k, v in e.items() if v is not None}
    return subprocess.run([sys.executable, "-m", "mnistflow", *args], capture_output=True,
                          text=True, env=e, cwd=cwd, timeout=timeout)


def start_serve(model: Path) -> tuple[subprocess.Popen, str]:
    """``mnistflow serve MODEL --port 0`` in a subprocess; returns it and the first line it
    printed (``serving ... at http://127.0.0.1:PORT/``, or what went wrong)."""
    proc = subprocess.Popen([sys.executable, "-m", "mnistflow", "serve", str(model), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc, proc.stdout.readline()


def assert_one_line_error(proc, *fragments: str) -> None:
    """The contract for bad input: exit 2, ONE stderr line 'mnistflow: error: ...', no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("mnistflow: error: "), lines[0]
    for f in fragments:
        assert f in lines[0], (f, lines[0])
