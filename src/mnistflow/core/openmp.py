"""OpenMP's wait policy, chosen before torch loads libgomp (which reads it once, at its start).

libgomp's default spins an idle thread ~300k rounds at every barrier before it sleeps. Beside a
busy process that collapses (every step waits on spinning threads), while on an idle machine a
sleeping thread pays a wake-up at every parallel op (benchmarks/busy_neighbour.py, BENCHMARKS.md).
So the ``mnistflow`` command, before torch is loaded and with no policy set by the user, lets
threads spin on an idle machine and sleep beside other running processes. A library user asks
for the same with ``mnistflow.tune_openmp()`` before importing torch; importing mnistflow
changes nothing. No torch here.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping

# What mnistflow chose for this process: "spin" (libgomp's default, left as it is), "passive"
# (OMP_WAIT_POLICY=PASSIVE set), or None (the user chose, or torch was imported first).
chosen: str | None = None
_decided = False


def others_runnable(path: str = "/proc/loadavg") -> int | None:
    """Tasks the kernel has runnable now besides this one: /proc/loadavg's instant count (its 4th
    field, "running/total"), the most of three reads; None where it cannot be read."""
    try:
        counts = []
        for _ in range(3):
            with open(path) as f:
                counts.append(int(f.read().split()[3].partition("/")[0]))
        return max(counts) - 1
    except (OSError, ValueError, IndexError):
        return None


def choose(environ: Mapping[str, str], torch_loaded: bool, others: int | None) -> str | None:
    """"spin" when nothing else is running, "passive" when something is (or the load is
    unknown), None when the policy is not mnistflow's to choose: the user set ``OMP_WAIT_POLICY``
    or ``GOMP_SPINCOUNT``, or torch (so libgomp) is loaded already."""
    if torch_loaded or "GOMP_SPINCOUNT" in environ or environ.get("OMP_WAIT_POLICY", "").strip():
        return None
    return "spin" if others == 0 else "passive"


def choose_at_start() -> str | None:
    """Make the choice for this process (the CLI calls it first): sets ``OMP_WAIT_POLICY=PASSIVE``
    beside other running processes. Returns the choice (see :data:`chosen`). Decided once per
    process: libgomp reads the policy once, so a later call returns the first decision."""
    global chosen, _decided
    if _decided:
        return chosen
    _decided = True
    chosen = choose(os.environ, "torch" in sys.modules, others_runnable())
    if chosen == "passive":
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # inherited by what mnistflow starts (--nproc ranks)
    return chosen
