"""The profiler's native stderr noise is held back; anything else written meanwhile is passed on."""
from __future__ import annotations

import os
import sys

from mnistflow.training.observe.profiler import _NativeNoise


def test_native_stage_markers_are_held_back_and_the_rest_passed_on(capfd):
    noise = _NativeNoise()
    with noise.filtered():  # written to file descriptor 2 directly, as the C++ side does
        os.write(2, b"USDT:2026-11-27 19:30:53 16513:16513 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"STAGE:2026-11-27 19:31:03 1:1 SyncActivityProfilerHandler.cpp:51] Completed Stage: Warm Up\n")
        os.write(2, b"a real warning\n")
        print("from python", file=sys.stderr)
    with noise.filtered():
        os.write(2, b"USDT:x profiler_stop\n")
    noise.close()
    err = capfd.readouterr().err
    assert sorted(err.splitlines()) == ["a real warning", "from python"]  # (pytest keeps sys.stderr apart)
    os.write(2, b"after\n")  # file descriptor 2 is stderr again
    assert capfd.readouterr().err == "after\n"
