"""OpenMP's wait policy: beside a running process mnistflow sets ``OMP_WAIT_POLICY=PASSIVE`` before
torch loads libgomp (spinning threads made a 2-thread run 2.4x slower next to one busy process on
Zen 2), on an idle machine it leaves libgomp's spinning default (passive made `fast` 1.3-1.6x
slower on an idle Zen 4 VM), and a user's own setting is kept. Checked where it counts, in libgomp: ``OMP_DISPLAY_ENV=verbose``
makes it print the settings it started with, and the spin count is what the policy changes
(libgomp prints ``OMP_WAIT_POLICY = 'PASSIVE'`` for its unset default too)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers.cli import run_cli

from mnistflow.core import openmp

SPIN = {"passive": "0", "libgomp default": "300000", "active": "30000000000"}


def _libgomp(code: str, **env: str | None) -> tuple[dict, str]:
    """``python -c code`` with ``env`` over a clean OpenMP environment; libgomp's settings as it
    printed them ({"OMP_WAIT_POLICY": ..., "GOMP_SPINCOUNT": ...}) and the child's stdout."""
    e = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    e.update({k: v for k, v in env.items() if v is not None}, OMP_DISPLAY_ENV="verbose")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr
    return _settings(r.stderr), r.stdout


def _settings(stderr: str) -> dict:
    out = {}
    for line in stderr.splitlines():
        key, _, value = line.strip().partition(" = ")
        if key in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
            out[key] = value.strip("'")
    if not out:
        pytest.skip("torch's OpenMP runtime is not libgomp (it printed no OMP_DISPLAY_ENV settings)")
    return out


IMPORT = "import mnistflow, torch, os; torch.ones(4).sum(); print(os.environ.get('OMP_WAIT_POLICY'))"
TUNE = ("import mnistflow, os; mnistflow.tune_openmp(); import torch; torch.ones(4).sum(); "
        "print(os.environ.get('OMP_WAIT_POLICY'))")


@pytest.fixture
def neighbour():
    """A process that is always runnable: what mnistflow's import must see as a busy machine."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.3)
        yield busy
    finally:
        busy.kill()
        busy.wait()


def test_tune_openmp_before_torch_beside_a_running_process_makes_libgomp_wait_passively(neighbour):
    omp, out = _libgomp(TUNE)
    assert omp == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": SPIN["passive"]}
    assert out.strip() == "PASSIVE"  # and what mnistflow starts (--nproc, loader workers) inherits it


def test_importing_mnistflow_changes_nothing_in_the_process(neighbour):
    omp, out = _libgomp(IMPORT)  # beside a running process all the same: the import chooses nothing
    assert omp["GOMP_SPINCOUNT"] == SPIN["libgomp default"] and out.strip() == "None"


def test_the_command_line_sets_it_before_torch_loads(neighbour):
    e = {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None, "OMP_DISPLAY_ENV": "verbose"}
    proc = run_cli("doctor", "--json", env=e)
    assert proc.returncode == 0, proc.stderr
    assert _settings(proc.stderr)["GOMP_SPINCOUNT"] == SPIN["passive"]
    facts = json.loads(proc.stdout)
    assert facts["omp_wait_policy"] == "PASSIVE (mnistflow's choice: other processes were running when it started)"
    assert not any("OMP_WAIT_POLICY" in r for r in facts["recommendations"])


@pytest.mark.parametrize("environ,torch_loaded,others,want", [
    ({}, False, 0, "spin"),  # an idle machine: libgomp's default, the fastest there
    ({}, False, 1, "passive"),
    ({}, False, 5, "passive"),
    ({}, False, None, "passive"),  # no /proc/loadavg: the safe choice
    ({"OMP_WAIT_POLICY": " "}, False, 0, "spin"),  # blank is unset
    ({"OMP_WAIT_POLICY": "ACTIVE"}, False, 3, None),
    ({"GOMP_SPINCOUNT": "1000"}, False, 3, None),
    ({}, True, 0, None),  # torch already read it
])
def test_the_choice(environ, torch_loaded, others, want):
    assert openmp.choose(environ, torch_loaded, others) == want


@pytest.mark.parametrize("text,want", [("0.50 0.40 0.30 1/123 4567\n", 0), ("2.0 1.0 0.5 3/80 99\n", 2),
                                       ("garbage\n", None), ("", None)])
def test_runnable_tasks_are_read_from_loadavg(tmp_path, text, want):
    f = tmp_path / "loadavg"
    f.write_text(text)
    assert openmp.others_runnable(str(f)) == want
    assert openmp.others_runnable(str(tmp_path / "missing")) is None


def test_the_doctor_says_when_mnistflow_let_threads_spin(monkeypatch):
    from mnistflow.doctor import _omp_wait_policy

    monkeypatch.setattr(openmp, "chosen", "spin")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert _omp_wait_policy() == ("libgomp's default, spin ~300k rounds, then sleep "
                                  "(mnistflow's choice: the machine was idle)")


@pytest.mark.parametrize("policy,spin", [("ACTIVE", SPIN["active"]), ("active", SPIN["active"]),
                                         ("PASSIVE", SPIN["passive"])])
def test_a_users_wait_policy_is_kept(policy, spin):
    omp, out = _libgomp(IMPORT, OMP_WAIT_POLICY=policy)
    assert omp["GOMP_SPINCOUNT"] == spin
    assert out.strip() == policy


def test_a_users_spin_count_is_kept_and_no_policy_added():
    """GOMP_SPINCOUNT alone is a choice too: with it, libgomp's default policy (so that
    GOMP_SPINCOUNT=300000 is exactly what mnistflow ran with before: the benchmark's baseline)."""
    omp, out = _libgomp(IMPORT, GOMP_SPINCOUNT="300000")
    assert omp["GOMP_SPINCOUNT"] == "300000"
    assert out.strip() == "None"


def test_torch_imported_first_keeps_libgomps_default_and_the_doctor_says_so():
    code = ("import torch, mnistflow, json; from mnistflow.doctor import diagnose; d = diagnose(); "
            "print(json.dumps([d['omp_wait_policy'], d['recommendations']]))")
    omp, out = _libgomp(code, MNISTFLOW_KERNELS="0")
    assert omp["GOMP_SPINCOUNT"] == SPIN["libgomp default"]
    policy, recs = json.loads(out)
    assert policy.startswith("(unset: torch was imported before mnistflow")
    assert any("import mnistflow first" in r for r in recs), recs
