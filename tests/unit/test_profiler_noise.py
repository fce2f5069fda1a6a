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
        sys.stderr.write("from python\n")  # one write: print's two could straddle the copy's line
    with noise.filtered():
        os.write(2, b"USDT:x profiler_stop\n")
    err = capfd.readouterr().err
    assert sorted(err.splitlines()) == ["a real warning", "from python"]  # (pytest keeps sys.stderr apart)
    os.write(2, b"after\n")  # file descriptor 2 is stderr again
    assert capfd.readouterr().err == "after\n"


def test_the_allocator_note_is_held_back_and_the_rest_passes_as_it_comes(capfd):
    """The note c10 prints when a block allocated before the profile is freed in it (at any
    step of the window), even written in pieces; a bar's redraw (no newline) passes at once."""
    import time

    noise = _NativeNoise()
    with noise.filtered():
        os.write(2, b"[W1128 05:37:57.381491437 CPUAllocator.cpp:245] Memory block of unknown ")
        os.write(2, b"size was allocated before the profiling started, profiler results will not "
                    b"include the deallocation event\n")
        os.write(2, b"\rtrain:  50%|#####     | 5/10")
        deadline = time.monotonic() + 5
        got = ""
        while "5/10" not in got and time.monotonic() < deadline:  # copied while the filter is on
            time.sleep(0.01)
            got += capfd.readouterr().err
        assert "5/10" in got and "Memory block" not in got
        os.write(2, b"\r\x1b[K[W1128 12:00:00 other.cpp:1] a warning of another kind\n")
    got += capfd.readouterr().err
    assert "Memory block" not in got and "a warning of another kind" in got


def test_profiling_from_step_0_is_the_runs_own_warning_not_torchs(tmp_path):
    import warnings

    import torch

    from mnistflow.core import log
    from mnistflow.training.observe.profiler import ProfilerHook

    with log.recording() as got, warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's raw UserWarning would raise here
        hook = ProfilerHook(tmp_path, 0, 2, torch.device("cpu"))
        hook.close()
    assert got == ["--profile-steps from step 0: no warm-up step before the profile, so the first "
                   "step's one-off setup is in its times"]
    with log.recording() as got:
        ProfilerHook(tmp_path / "b", 1, 2, torch.device("cpu")).close()
    assert got == []
