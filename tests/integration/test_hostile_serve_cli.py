"""``mnistflow serve`` and ``predict`` as a user runs them, against hostile files and settings
(issue 40, HOSTILE-INPUTS.md R9, R2's CLI paths and the ``$MNISTFLOW_THREADS`` finding): every
``--workers`` process serves the model checked at start, whatever happens to the file later."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.cli import assert_one_line_error, run_cli
from helpers.images import scan_bomb_jpeg

pytest.importorskip("uvicorn")

from mnistflow.artifacts.model_file import save_model  # noqa: E402
from mnistflow.artifacts.model_info import ModelInfo  # noqa: E402
from mnistflow.models import create_model  # noqa: E402


def model_file(path: Path, test_acc: float) -> Path:
    info = ModelInfo("softmax", [1, 28, 28], [str(i) for i in range(10)], [33.0], [78.0], dataset="synthetic",
                     metrics={"test_acc": test_acc})
    save_model(path, create_model("softmax", (1, 28, 28), 10).eval(), info)
    return path


def workers_of(pid: int) -> list[int]:
    """The uvicorn worker processes of the server ``pid`` (multiprocessing's spawned children)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[1]) == pid and b"spawn_main" in cmd:
                found.append(int(d.name))
    return sorted(found)


def answers(port: int, n: int) -> list:
    out = []
    for _ in range(n):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/model", timeout=20) as r:
            out.append(json.loads(r.read())["test_acc"])
    return out


def test_r9_every_worker_serves_the_model_checked_at_start(tmp_path):
    """R9: the model file replaced while serving (another model, then junk) and a worker killed
    each time: uvicorn restarts it. Before: the restarted worker loaded the new file (two
    models behind one port), or died in a loop of tracebacks on junk. Now every worker loads
    a private copy made and checked at start; the copy is removed at exit."""
    run = tmp_path / "run"
    run.mkdir()
    model = model_file(run / "model.safetensors", 0.25)
    other = model_file(tmp_path / "other.safetensors", 0.75)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "mnistflow", "serve", str(run), "--workers", "2", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp)})
    try:
        line = proc.stdout.readline()
        assert "2 workers" in line, line + proc.stderr.read() if proc.poll() is not None else line
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        deadline = time.monotonic() + 60
        while len(workers_of(proc.pid)) < 2 or not _up(port):
            assert time.monotonic() < deadline and proc.poll() is None, "the workers did not start"
            time.sleep(0.2)
        assert set(answers(port, 4)) == {0.25}
        for replacement in (other.read_bytes(), os.urandom(1000)):
            model.write_bytes(replacement)
            victim = workers_of(proc.pid)[0]
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while victim in workers_of(proc.pid) or len(workers_of(proc.pid)) < 2:
                assert time.monotonic() < deadline, "the worker was not restarted"
                time.sleep(0.2)
            time.sleep(1)  # the new worker loads its model
            assert set(answers(port, 30)) == {0.25}
        assert len(list(tmp.glob("mnistflow-serve-*"))) == 1
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    assert "Traceback" not in err, err
    assert list(tmp.glob("mnistflow-serve-*")) == [], "the private copy was left behind"


def _up(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def test_serve_refuses_a_bad_threads_setting_as_train_and_eval_do(tmp_path):
    model = model_file(tmp_path / "model.safetensors", 0.5)
    for value in ("-1", "0", "lots"):
        proc = run_cli("serve", str(model), "--port", "0", env={"MNISTFLOW_THREADS": value}, timeout=120)
        assert_one_line_error(proc, "MNISTFLOW_THREADS must be an integer from 1 to 1024")


def test_r2_predict_refuses_a_scan_bomb_with_one_line(tmp_path):
    model = model_file(tmp_path / "model.safetensors", 0.5)
    bomb = tmp_path / "scanbomb.jpg"
    bomb.write_bytes(scan_bomb_jpeg(1024, 20_000))
    proc = run_cli("predict", str(model), str(bomb), timeout=120)
    assert_one_line_error(proc, "scanbomb.jpg: refusing to decode a JPEG of more than 100 scans")
