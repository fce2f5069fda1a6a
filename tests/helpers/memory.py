"""Peak memory of one call, for the hostile-input fuzz tests (issue 19: "memory is bounded by
what is legitimately needed").

``peak_growth(fn)`` runs ``fn`` and returns (its result or exception, the peak growth in
bytes). On Linux it is the process's resident high-water mark: ``/proc/self/clear_refs``
("5") resets VmHWM to the current RSS, so VmHWM after the call minus VmRSS before it is the
most memory the call ever held resident, whoever allocated it (numpy, torch, zlib, Pillow,
onnxruntime, protobuf). Where that file cannot be written (not Linux, a locked-down /proc)
it falls back to tracemalloc's peak, which sees Python's, numpy's and torch's CPU buffers
but not a C library's own mallocs.

The bound the fuzz tests assert, ``bound(n)`` for an input of ``n`` bytes:
``64 MiB + 16 * n``. The fixed part covers what any call may touch once and keep (lazy
imports' data, allocator arenas, a small model and its first forward: a warm-up call before
measuring takes most of it); the proportional part is a generous constant factor for a
parser's copies of its input (bytes -> bytearray -> numpy -> float32 is 1 + 1 + 1 + 4).
The defects this guards against cost 100x to 10,000x their input (a 1.3 KB pickle making
1.5 GB, a 58 KB PNG making 450 MB, an 89-byte IDX label file making 2.85 GB), so any of them
comes back far above the bound, while inputs of a few KB stay well under it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path

MiB = 1 << 20
FIXED = 64 * MiB
PER_INPUT_BYTE = 16

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def bound(input_bytes: int) -> int:
    """The most a call on ``input_bytes`` of hostile input may grow memory by."""
    return FIXED + PER_INPUT_BYTE * input_bytes


def _status_kb(key: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _can_reset_hwm() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
        _status_kb("VmHWM")
        return True
    except (OSError, KeyError):
        return False


def _malloc_trim() -> None:
    """Give the heap's free pages back to the OS before measuring: mnistflow's ``tune_malloc``
    keeps freed buffers resident, and a call that reuses them would not raise the high-water
    mark however much it allocates."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


HWM = _can_reset_hwm()  # False: tracemalloc's peak is measured instead
METHOD = "VmHWM" if HWM else "tracemalloc"


def peak_growth(fn: Callable[[], object]) -> tuple[object, int]:
    """Run ``fn()``; return (its result, or the exception it raised, and the peak growth in
    bytes). The exception is returned, not raised, so that the caller can judge it after
    checking the memory."""
    if HWM:
        _malloc_trim()
        _CLEAR_REFS.write_text("5")
        before = _status_kb("VmRSS")
        try:
            out = fn()
        except BaseException as e:  # noqa: BLE001 -- handed back to the caller to judge
            out = e
        return out, max(0, _status_kb("VmHWM") - before) * 1024
    tracemalloc.start()
    try:
        try:
            out = fn()
        except BaseException as e:  # noqa: BLE001
            out = e
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def assert_bounded(fn: Callable[[], object], input_bytes: int, what: str = "") -> object:
    """``fn()``'s result (its exception re-raised) after checking that its peak memory growth
    stayed under ``bound(input_bytes)``."""
    out, grew = peak_growth(fn)
    limit = bound(input_bytes)
    assert grew <= limit, (f"{what}: peak memory grew {grew / MiB:.1f} MiB ({METHOD}) on "
                           f"{input_bytes:,} bytes of input, over the {limit / MiB:.1f} MiB bound")
    if isinstance(out, BaseException):
        raise out
    return out


# A child mnistflow reports its own peak (VmHWM of its own memory map: rusage's ru_maxrss
# would include the parent's size at the fork, whatever the test process holds).
_MEASURED = """
import atexit, os, runpy, sys
def _report():
    with open('/proc/self/status') as f:
        hwm = next(ln for ln in f if ln.startswith('VmHWM:')).split()[1]
    with open(os.environ['MNISTFLOW_TEST_HWM'], 'w') as f:
        f.write(hwm)
atexit.register(_report)
sys.argv = ['mnistflow', *sys.argv[1:]]
runpy.run_module('mnistflow', run_name='__main__', alter_sys=True)
"""


def run_measured(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, int]:
    """``mnistflow ARGS`` in a subprocess (Linux), and its peak resident memory in KB."""
    with tempfile.TemporaryDirectory() as tmp:
        hwm = Path(tmp) / "hwm"
        proc = subprocess.run([sys.executable, "-c", _MEASURED, *args], capture_output=True, text=True,
                              check=False, timeout=timeout, env={**os.environ, "MNISTFLOW_TEST_HWM": str(hwm)})
        return proc, int(hwm.read_text())
