"""Native CPU kernels for the few ops where eager PyTorch is far from the memory bound.

The C sources in ``csrc/`` are compiled on first use with the system C compiler (``$CC``, else
``cc``; ``-O3 -march=native -fopenmp``) into mnistflow's cache (``$MNISTFLOW_HOME/kernels``,
named by a hash of the sources, flags, compiler and CPU) and loaded with ctypes: no torch
headers, so a build takes about a second. ``csrc/mnistflow_kernels.h`` declares every exported
function; ``SIGNATURES`` below is its ctypes twin (a unit test holds the two together). Every
kernel is checked against its torch reference (beside it, one Python module per op) on a small
input before it is used. The ABI and how to add a kernel: README.md beside this file.

Nothing depends on them: with no compiler, a failed build or check, a non-CPU device, or
``MNISTFLOW_KERNELS=0``, the callers use PyTorch's own ops (one warning says why). The AMX
kernels (``wgrad``'s and ``muon``'s tile paths, the first layer's fused conv + pool) need more:
a CPU and OS with AMX (``amx_available``), else PyTorch's ops too (``MNISTFLOW_AMX=0``: always);
the weight gradient and Muon's iteration also have AVX-512-BF16 paths for CPUs without AMX
(``bf16_engine``). Both variables take 1/on/true/yes or 0/off/false/no; another value is an
error (``check_environment``).

Threads: the library links ``libgomp.so.1``, which resolves to the OpenMP runtime torch has
already loaded, so the kernels share torch's thread pool and ``torch.get_num_threads()``. If a
second OpenMP runtime shows up in the process anyway, the kernels run on one thread (two
pools of spinning threads on the same cores collapse).
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterator
from pathlib import Path

import torch

from mnistflow.core.errors import MnistflowError

KERNELS_ENV, AMX_ENV = "MNISTFLOW_KERNELS", "MNISTFLOW_AMX"
_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")
CSRC = Path(__file__).parent / "csrc"
SOURCES = ("maxpool.c", "bnrelu.c", "layout.c", "wgrad.c", "muon.c")  # compiled, in csrc/
# included by them (<op>_impl.h: a kernel written once, included by <op>.c once per element type)
HEADERS = ("mnistflow_kernels.h", "bf16.h", "maxpool_impl.h", "bnrelu_impl.h", "layout_impl.h", "amx.h", "vnni.h")
# hidden by default: the library exports exactly what mnistflow_kernels.h declares
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-fvisibility=hidden")

# The ctypes bindings: every function csrc/mnistflow_kernels.h declares, name: (argument types,
# return type); pointers, int64_t sizes, int threads, return codes as in README.md. The loader sets
# them; tests/unit/test_kernels_abi.py checks them against the header.
_P, _I = ctypes.c_void_p, ctypes.c_int64
_D, _N = ctypes.c_double, ctypes.c_int
_POOL_FORWARD = ([_P, _P, _P, _I, _I, _I, _I, _N], _N)  # returns 0, or 1: no memory
_POOL_BACKWARD = ([_P, _P, _P, _I, _I, _I, _I, _N], None)
_BN_FORWARD = ([_P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _D, _D, _N], _N)  # returns 0, or 1: no memory
_BN_BACKWARD = ([_P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _N], _N)
SIGNATURES = {
    "maxpool2x2_forward_bf16": _POOL_FORWARD, "maxpool2x2_forward_f32": _POOL_FORWARD,
    "maxpool2x2_backward_u16": _POOL_BACKWARD, "maxpool2x2_backward_u32": _POOL_BACKWARD,
    "bnrelu_forward_bf16": _BN_FORWARD, "bnrelu_forward_f32": _BN_FORWARD,
    "bnrelu_backward_bf16": _BN_BACKWARD, "bnrelu_backward_f32": _BN_BACKWARD,
    "bnrelu_eval_bf16": ([_P, _P, _P, _P, _I, _I, _N], None), "bnrelu_eval_f32": ([_P, _P, _P, _P, _I, _I, _N], None),
    "swap_nc_u16": ([_P, _P, _I, _I, _I, _N], None), "swap_nc_u32": ([_P, _P, _I, _I, _I, _N], None),
    "col2im_bf16": ([_P, _P, _I, _I, _I, _I, _I, _N], _N), "col2im_f32": ([_P, _P, _I, _I, _I, _I, _I, _N], _N),
    "amx_request": ([], _N),  # 0: this process may use AMX tiles
    # last argument: 1 AMX tiles, 0 AVX-512-BF16; returns 0; 1 no memory; 2 shape; -1 not in this build
    "conv3x3_wgrad_bf16": ([_P, _P, _P, _I, _I, _I, _I, _I, _N, _N], _N),
    "conv3x3_maxpool_wgrad_bf16": ([_P, _P, _P, _P, _I, _I, _I, _I, _I, _N, _N], _N),
    "conv3x3_maxpool_forward_bf16": ([_P, _P, _P, _P, _I, _I, _I, _I, _I, _N], _N),
    "newton_schulz_bf16": ([_N, ctypes.POINTER(_P), ctypes.POINTER(_I), ctypes.POINTER(_I), _N, _N, _N], _N),
}


@dataclass
class _Verdict:
    """Whether a group of kernels may run here, decided once per ``key`` (what it was decided
    for: the loaded library, a switch) by ``decide``."""
    key: object = None
    ok: bool = False
    reason: str = "not checked"

    def decide(self, key: object, why_not: str | None, check: Callable[[], None], what: str) -> bool:
        """``why_not`` (a reason they cannot run) or else ``check()``, their self-checks against
        PyTorch, run with autograd on whatever mode the caller is in; kept until the key changes.
        A path the build lacks (``NotImplementedError``) falls back quietly; a wrong result or a
        failed call, with one warning."""
        if self.key == key:
            return self.ok
        ok, why = False, why_not
        if why is None:
            try:
                with torch.inference_mode(False), torch.enable_grad(), torch.autocast("cpu", enabled=False):
                    check()
                ok, why = True, "loaded"
            except NotImplementedError as e:
                why = f"unavailable: {e}"
            except Exception as e:  # noqa: BLE001 -- PyTorch's ops instead, said once
                from mnistflow.core.log import warn
                why = f"unavailable: {e}"
                warn(f"the {what} {why}; using PyTorch's ops (slower)")
        self.key, self.ok, self.reason = key, ok, why
        return ok


@dataclass
class _State:
    """What this process knows of its kernels (one instance, ``_state``; ``library()``'s
    lru_cache holds the library itself)."""
    reason: str = "not loaded yet"  # the library's: reason()
    single_thread: bool = False  # a second OpenMP runtime is loaded: threads() is 1
    amx: _Verdict = field(default_factory=_Verdict)  # the AMX kernels (wgrad's, muon's tiles)
    vector: _Verdict = field(default_factory=_Verdict)  # the AVX-512-BF16 ones (wgrad, muon)
    ops: set[str] = field(default_factory=set)  # the ops that ran on a kernel (mark_used)
    off: bool = False  # a run's --kernels off (switched_off): PyTorch's ops, whatever the environment


_state = _State()


class KernelBuildError(RuntimeError):
    pass


def _switch(name: str) -> bool:
    """``$name`` as an on/off switch, on when unset or empty; another value is an error (a typo
    must not silently keep the kernels on, or off)."""
    raw = os.environ.get(name, "").strip()
    if not raw or raw.lower() in _ON:
        return True
    if raw.lower() in _OFF:
        return False
    raise MnistflowError(f"{name} must be 1 or 0 (also on/off, true/false, yes/no; or unset), got {raw[:40]!r}")


def enabled() -> bool:
    """The native kernels may be used (the default): not ``$MNISTFLOW_KERNELS=0``, not a run's
    ``--kernels off``."""
    return not _state.off and _switch(KERNELS_ENV)


@contextlib.contextmanager
def switched_off(off: bool) -> Iterator[None]:
    """A run's ``--kernels``: inside the block, off (True) makes every op take PyTorch's path in
    this process; the switch is as it was after it (the library is looked up afresh on a change)."""
    before = _state.off
    if off != before:
        _state.off = off
        library.cache_clear()
    try:
        yield
    finally:
        if _state.off != before:
            _state.off = before
            library.cache_clear()


def check_environment() -> None:
    """Every environment variable this package reads, checked at once (before a run starts)."""
    _switch(KERNELS_ENV)
    _switch(AMX_ENV)


def _compiler() -> str | None:
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc)


def _cache_dir() -> Path:
    from mnistflow.core.paths import home
    return home() / "kernels"


def _library_path(cc: str) -> Path:
    """The cached library's path: a hash of everything that changes the binary."""
    from mnistflow.runtime.cpu import cpu_flags
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update((CSRC / name).read_bytes())
    h.update(" ".join(CFLAGS).encode())
    h.update(subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout.encode())
    h.update(platform.machine().encode())
    h.update(" ".join(sorted(cpu_flags())).encode())  # -march=native
    return _cache_dir() / f"mnistflow-kernels-{h.hexdigest()[:16]}.so"


def build(cc: str | None = None) -> Path:
    """Compile the kernels into the cache (atomically; a no-op when already there)."""
    cc = cc or _compiler()
    if cc is None:
        raise KernelBuildError(f"no C compiler ({os.environ.get('CC') or 'cc'}) on PATH")
    path = _library_path(cc)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        cmd = [cc, *CFLAGS, "-o", tmp, *(str(CSRC / s) for s in SOURCES)]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            lines = r.stderr.strip().splitlines() or ["(no output)"]
            msg = next((ln for ln in lines if "error" in ln), lines[0])
            raise KernelBuildError(f"{Path(cc).name} could not compile the kernels: {msg}")
        os.replace(tmp, path)  # concurrent builders (torchrun ranks) each rename a whole file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _openmp_runtimes() -> set[str]:
    try:
        with open("/proc/self/maps") as f:
            return {line.split()[-1] for line in f
                    if any(k in line for k in ("libgomp", "libiomp", "libomp"))}
    except OSError:
        return set()


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build()))
    for name, (args, ret) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ret
    return lib


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """The loaded and checked kernel library, or None (``reason()`` says why)."""
    if not enabled():
        _state.reason = "off (--kernels off)" if _state.off else "off (MNISTFLOW_KERNELS=0)"
        return None
    try:
        lib = _load()
        _state.single_thread = len(_openmp_runtimes()) > 1
        from mnistflow.kernels import bnrelu, layout, pool
        # checked with autograd on, whatever mode the first caller is in
        with torch.inference_mode(False), torch.enable_grad(), torch.autocast("cpu", enabled=False):
            pool.self_check(lib)
            bnrelu.self_check(lib)
            layout.self_check(lib)
    except Exception as e:  # noqa: BLE001 -- any failure: PyTorch's ops instead, said once
        from mnistflow.core.log import warn
        _state.reason = f"unavailable: {e}"
        warn(f"native kernels {_state.reason}; using PyTorch's ops (slower)")
        return None
    _state.reason = "loaded" + (" (1 thread: a second OpenMP runtime is loaded)" if _state.single_thread else "")
    return lib


def amx_available() -> bool:
    """The kernel library is loaded, this CPU and OS run AMX, and the AMX kernels (``wgrad``'s
    and ``muon``'s) agreed with their torch references on small inputs (checked once per loaded
    library); ``amx_reason()`` is the doctor's "AMX kernels" line."""
    off = not _switch(AMX_ENV)
    lib = None if off else library()
    why_not = ("off (MNISTFLOW_AMX=0)" if off else "native kernels not loaded" if lib is None
               else "unavailable: no AMX (this CPU, the OS or the compiler)" if lib.amx_request() != 0 else None)

    def check():
        from mnistflow.kernels import muon, wgrad

        wgrad.self_check(lib)
        muon.self_check(lib)

    return _state.amx.decide((off, id(lib)), why_not, check, "AMX kernels are")


def amx_reason() -> str:
    """One line for ``mnistflow doctor``: loaded, off, or why unavailable."""
    amx_available()
    return _state.amx.reason


def bf16_engine() -> str | None:
    """Where the bf16 matrix kernels (the 3x3 convolutions' weight gradient, ``wgrad``, and
    Muon's Newton-Schulz iteration, ``muon``) run: "amx" (the tiles: ``amx_available``),
    "avx512-bf16" (a CPU with AVX-512-BF16 but no usable AMX, such as Zen 4 and 5: their vector
    paths, checked against PyTorch once per loaded library), or None (PyTorch's ops)."""
    if amx_available():
        return "amx"
    from mnistflow.runtime.cpu import cpu_flags

    lib = library()
    why_not = ("native kernels not loaded" if lib is None
               else "unavailable: no AVX-512-BF16" if "avx512_bf16" not in cpu_flags() else None)

    def check():
        from mnistflow.kernels import muon, wgrad

        wgrad.self_check(lib, tiles=False)
        muon.self_check(lib, tiles=False)

    ok = _state.vector.decide(id(lib), why_not, check, "AVX-512-BF16 kernels are")
    return "avx512-bf16" if ok else None


def bf16_reason() -> str:
    """One line for ``mnistflow doctor``: where the weight gradient and Muon's iteration run."""
    engine = bf16_engine()
    if engine == "amx":
        return "native kernels, AMX tiles"
    if engine:
        return "native kernels, AVX-512-BF16 (no AMX)"
    return f"PyTorch's (the AVX-512-BF16 kernels: {_state.vector.reason})"


def backward_from(y: torch.Tensor, g: torch.Tensor) -> None:
    """``y.backward(g)``, the same gradients bit for bit (the product's backward multiplies ``g``
    by ones), from a scalar: autograd imports PyTorch's symbolic-shape machinery (~1 s) for an
    explicit gradient, which every ``predict`` would pay in the self-checks for nothing."""
    (y * g).sum().backward()


def check_rc(rc: int, kernel: str, other: str = "failed") -> None:
    """A kernel's return code as README.md's ABI defines it: 0 done; 1 out of memory
    (``MemoryError``); -1 a path this build lacks (``NotImplementedError``, which
    ``_Verdict.decide`` takes as a quiet fallback); anything else ``RuntimeError(kernel: other)``."""
    if rc == -1:
        raise NotImplementedError(f"{kernel} kernel: not in this build (the compiler did not target it)")
    if rc == 1:
        raise MemoryError(f"{kernel} kernel: out of memory")
    if rc:
        raise RuntimeError(f"{kernel} kernel: {other} (code {rc})")


def mark_used(op: str) -> None:
    """Note that ``op`` ran on its native kernel in this process (one set insert: cheap enough
    for every call)."""
    _state.ops.add(op)


def used() -> dict:
    """What the native kernels did in this process, for summary.json: the library's state
    (``reason()``), the AMX kernels' and the AVX-512-BF16 kernels' (or "not checked"
    when nothing asked for them), and the ops that ran on a kernel since the start or
    ``reset_used()`` (sorted; empty when none did). Builds and checks nothing."""
    return {"native": _state.reason, "amx": _state.amx.reason, "avx512_bf16": _state.vector.reason,
            "ops": sorted(_state.ops)}


def reset_used() -> None:
    """Forget the ops recorded so far (a run that starts in a process that already trained)."""
    _state.ops.clear()


def threads() -> int:
    return 1 if _state.single_thread else torch.get_num_threads()


def reason() -> str:
    """One line for ``mnistflow doctor``: loaded, off, or why unavailable."""
    return _state.reason
