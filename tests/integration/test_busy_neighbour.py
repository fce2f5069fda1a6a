"""OpenMP's wait policy on a busy machine: mnistflow sets ``OMP_WAIT_POLICY=PASSIVE`` before
torch loads libgomp (spinning threads made a 2-thread run 2.4x slower next to one busy process),
and a user's own setting is kept. Checked where it counts, in libgomp: ``OMP_DISPLAY_ENV=verbose``
makes it print the settings it started with, and the spin count is what the policy changes
(libgomp prints ``OMP_WAIT_POLICY = 'PASSIVE'`` for its unset default too)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers.cli import run_cli

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


def test_importing_mnistflow_first_makes_libgomp_wait_passively():
    omp, out = _libgomp(IMPORT)
    assert omp == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": SPIN["passive"]}
    assert out.strip() == "PASSIVE"  # and what mnistflow starts (--nproc, loader workers) inherits it


def test_the_command_line_sets_it_before_torch_loads():
    e = {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None, "OMP_DISPLAY_ENV": "verbose"}
    proc = run_cli("doctor", "--json", env=e)
    assert proc.returncode == 0, proc.stderr
    assert _settings(proc.stderr)["GOMP_SPINCOUNT"] == SPIN["passive"]
    facts = json.loads(proc.stdout)
    assert facts["omp_wait_policy"] == "PASSIVE (mnistflow's default)"
    assert not any("OMP_WAIT_POLICY" in r for r in facts["recommendations"])


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
