"""The CPU the training runs on: its features, threads (and torchrun's launch variables), the
allocator and denormals. The device and precision are ``runtime.device``.

Three facts about CPUs shape the defaults (measured in BENCHMARKS.md):
* glibc returns freed multi-MB activation buffers to the OS every step and page-faults them
  back the next step. ``tune_malloc`` stops that.
* bf16 autocast runs on AMX / AVX-512-BF16 units several times faster than fp32
  (``cpu_has_fast_bf16``).
* Denormal floats (below ~1e-38) take a slow path through the FPU; Adam's second-moment
  estimates of rarely active weights decay into that range. ``flush_denormals`` turns on
  flush-to-zero, as TensorFlow does by default.
"""
from __future__ import annotations

import ctypes
import os
import time
from functools import lru_cache

import torch

from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError
from mnistflow.core.log import warn

THREADS_ENV, MALLOC_ENV, DENORMALS_ENV = "MNISTFLOW_THREADS", "MNISTFLOW_MALLOC", "MNISTFLOW_DENORMALS"
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4


@lru_cache(maxsize=1)
def cpu_info() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ("model name", "cpu family", "model",
    "flags", ...); empty where there is none (not Linux)."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the end of the first processor's block
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


@lru_cache(maxsize=1)  # asked per matrix in every Muon step (kernels.muon)
def cpu_flags() -> frozenset[str]:
    return frozenset(cpu_info().get("flags", "").split())


def cpu_has_fast_bf16() -> bool:
    """AMX-BF16 or AVX512-BF16: bf16 matmul/conv in hardware."""
    f = cpu_flags()
    return "amx_bf16" in f or "avx512_bf16" in f


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


_malloc_tuned = False


def tune_malloc() -> bool:
    """Keep freed activation buffers in the process instead of returning them to the OS.

    Raises glibc's trim threshold (never give the heap top back) and its mmap threshold
    (serve large blocks from the heap, which is then reused), the same as setting
    ``MALLOC_TRIM_THRESHOLD_`` and ``MALLOC_MMAP_THRESHOLD_`` before start. Safe: it only
    changes when memory is handed back; peak memory stays the same. No-op off glibc.
    Set ``MNISTFLOW_MALLOC=default`` to leave the allocator alone (another value is an error).
    """
    global _malloc_tuned
    if _malloc_tuned or _env_value(MALLOC_ENV, ("default",)):
        return _malloc_tuned
    try:
        # by its usual name: ctypes.util.find_library would start an ldconfig process
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1
    ok &= mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1  # 32 MiB: glibc's largest allowed value
    _malloc_tuned = bool(ok)
    return _malloc_tuned


def flush_denormals() -> bool:
    """Treat denormal floats as zero on the CPU (FTZ/DAZ), for this process; ``False`` when
    the CPU cannot. Values below ~1.2e-38 (fp32) become 0: far below anything a gradient or
    weight update can resolve. Set ``MNISTFLOW_DENORMALS=keep`` to leave them alone (another
    value is an error).

    The mode is a per-thread register. Threads started later inherit it, but PyTorch's OpenMP
    worker threads may already exist (any earlier parallel op starts them), so the setting is
    also made on each of them: without that, half of every 2-thread op kept the slow path."""
    if _env_value(DENORMALS_ENV, ("keep",)):
        return False
    if not torch.set_flush_denormal(True):
        return False
    return _on_each_openmp_thread(lambda: torch.set_flush_denormal(True))


def _on_each_openmp_thread(fn) -> bool:
    """Call ``fn`` once on every thread of the OpenMP team PyTorch's CPU ops run on, through
    the OpenMP runtime PyTorch loaded (libgomp's ``GOMP_parallel``; LLVM's libomp exports it
    too). ``False`` where there is none to reach."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "libgomp" in line or "libomp" in line}
        if not libs:
            return torch.get_num_threads() == 1
        omp = ctypes.CDLL(min(libs))
        callback_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        callback = callback_type(lambda _: fn())  # runs on each team thread (it takes the GIL)
        omp.GOMP_parallel.argtypes = [callback_type, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        omp.GOMP_parallel(callback, None, torch.get_num_threads(), 0)
        return True
    except (OSError, AttributeError):
        return False


LAUNCH_VARS = ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK")  # torchrun's


def _env_value(name: str, allowed: tuple[str, ...]) -> str | None:
    """``$name`` (``None`` when unset or empty); any value but ``allowed`` is an error."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if raw not in allowed:
        raise MnistflowError(f"{name} must be {' or '.join(allowed)} (or unset), got {raw[:40]!r}")
    return raw


class LaunchError(MnistflowError):
    """A process's own launch environment (torchrun's variables) is wrong: every process says
    so (``per_rank``), where the CLI prints other errors from each machine's first one only."""

    per_rank = True


def _env_int(name: str, low: int, high: int) -> int | None:
    """``$name`` as an integer in [low, high] (``None`` when unset or empty); anything else is an
    error, before any work starts."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = None
    if n is None or not low <= n <= high:
        error = LaunchError if name in LAUNCH_VARS else MnistflowError
        raise error(f"{name} must be an integer from {low} to {high} (or unset), got {raw[:40]!r}")
    return n


def env_threads() -> int | None:
    """``$MNISTFLOW_THREADS``: the intra-op threads the user chose (``None``: not chosen)."""
    return _env_int(THREADS_ENV, 1, limits.MAX_THREADS)


def launch_env() -> tuple[int, int, int, int]:
    """(rank, world size, local rank, local world size) from torchrun's environment, (0, 1, 0,
    1) without it; a value that is no whole number in range (a rank past the world size) is an
    error. The one reader of those variables (``runtime.dist.env_info``)."""
    world = _env_int("WORLD_SIZE", 1, limits.MAX_WORLD_SIZE) or 1
    local_world = _env_int("LOCAL_WORLD_SIZE", 1, limits.MAX_LOCAL_PROCESSES) or world
    return (_env_int("RANK", 0, world - 1) or 0, world, _env_int("LOCAL_RANK", 0, local_world - 1) or 0,
            local_world)


def local_processes() -> int:
    """Training processes on this machine: torchrun's ``$LOCAL_WORLD_SIZE``, 1 without it."""
    return _env_int("LOCAL_WORLD_SIZE", 1, limits.MAX_LOCAL_PROCESSES) or 1


def check_environment() -> None:
    """Every environment variable this module reads, checked at once (before a run starts)."""
    env_threads()
    launch_env()
    _env_value(MALLOC_ENV, ("default",))
    _env_value(DENORMALS_ENV, ("keep",))


def default_threads() -> int:
    """``$MNISTFLOW_THREADS``, else the usable cores shared among this machine's training
    processes (torchrun's ``LOCAL_WORLD_SIZE``; 1 without torchrun)."""
    return env_threads() or max(1, usable_cores() // local_processes())


def _jiffies(cpus: set[int]) -> tuple[int, int]:
    """(busy, total) clock ticks of ``cpus`` since boot, from /proc/stat."""
    busy = total = 0
    with open("/proc/stat") as f:
        for line in f:
            name, *vals = line.split()
            if not name.startswith("cpu") or name == "cpu":
                continue
            if not name[3:].isdigit():
                break
            if int(name[3:]) in cpus:
                v = list(map(int, vals[:8]))  # user nice system idle iowait irq softirq steal
                total += sum(v)
                busy += sum(v) - v[3] - v[4]
    return busy, total


class BusyCores:
    """Cores of this process's CPU set kept busy by other processes, measured from its making
    to ``elsewhere()``: over a sleep (``busy_cores_elsewhere``), or over this process's own
    work (loading a model), whose CPU time is taken out (Linux; 0.0 where /proc/stat is
    missing)."""

    def __init__(self) -> None:
        try:
            self.cpus = os.sched_getaffinity(0)
            self.start = (_jiffies(self.cpus), os.times(), time.monotonic())
        except (OSError, AttributeError, ValueError):
            self.start = None

    def elsewhere(self) -> float:
        if self.start is None:
            return 0.0
        (b0, t0), own0, w0 = self.start
        try:
            b1, t1 = _jiffies(self.cpus)
        except (OSError, ValueError):
            return 0.0
        own1, wall = os.times(), time.monotonic() - w0
        if t1 <= t0 or wall <= 0:
            return 0.0
        busy = (b1 - b0) / (t1 - t0) * len(self.cpus)
        own = (own1.user - own0.user + own1.system - own0.system) / wall
        return max(0.0, busy - own)


def busy_cores_elsewhere(sample_s: float = 0.25) -> float:
    """Cores of this process's CPU set kept busy by other processes, sampled over ``sample_s``
    while this process sleeps (Linux; 0.0 where /proc/stat is missing)."""
    sample = BusyCores()
    time.sleep(sample_s)
    return sample.elsewhere()


@lru_cache(maxsize=1)
def l3_bytes() -> int | None:
    """The size of the last-level (L3) cache the first CPU uses, from sysfs (Linux); None where
    it is not told."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(e for e in os.listdir(root) if e.startswith("index")):
            with open(f"{root}/{entry}/level") as f:
                if f.read().strip() != "3":
                    continue
            with open(f"{root}/{entry}/size") as f:
                size = f.read().strip().upper()
            units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
            return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    except (OSError, ValueError):
        pass
    return None


def threads_for_load(threads: int, cores: int, busy: float) -> int:
    """Intra-op threads that fit the cores other processes leave free: a thread that shares a
    core with a busy process stalls all the others at every op (a 2-thread step measured 4x
    slower than 1 thread when another process kept one of 2 cores busy; passive threads, 3.4x
    on a Zen 4 VM, as fast as 1 thread on Zen 2: benchmarks/busy_neighbour.py)."""
    free = int(cores - busy + 0.5)  # a core more than half busy is taken
    return max(1, min(threads, free))


def set_threads(n: int | None) -> int:
    """Intra-op threads: ``n``, else ``default_threads()``. More than the usable cores is
    allowed, with a warning: OpenMP threads that share a core wait for each other at every op."""
    n = n or default_threads()
    cores = usable_cores()
    if n > cores:
        warn(f"{n} threads on {cores} usable core(s): threads that share a core slow every step "
             f"down; {cores} or fewer is faster")
    torch.set_num_threads(n)
    return n


def set_interop_threads(n: int | None) -> int:
    """Inter-op threads (PyTorch's pool for independent ops run side by side); ``None`` keeps
    PyTorch's default (the cores). PyTorch fixes the pool the first time it is used: set it
    first thing in a process. Later, a different value is ignored with a warning."""
    current = torch.get_num_interop_threads()
    if n is None or n == current:
        return current
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:
        warn(f"--interop-threads {n} ignored: this process already uses {current} inter-op threads "
             "(PyTorch sets them once, before any parallel work; start a fresh process)")
        return current
    return n
