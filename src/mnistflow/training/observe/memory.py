"""Watch memory: peak RSS (and GPU peaks), a warning near the machine's limit, a leak trend,
and the pre-flight check that refuses settings that would swap."""
from __future__ import annotations

import ctypes
import functools

import psutil
import torch

from mnistflow.core.errors import MnistflowError
from mnistflow.core.log import warn


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.lru_cache(maxsize=None)
def _mallinfo2():
    """glibc's mallinfo2, or None (not glibc, or glibc < 2.33). Looked up on first use, by the
    library's usual name (``ctypes.util.find_library`` would start an ``ldconfig`` process)."""
    for name in ("libc.so.6", None):  # None: the symbols already loaded into this process
        try:
            fn = ctypes.CDLL(name).mallinfo2
        except (OSError, AttributeError):
            continue
        fn.restype = _MallInfo2
        return fn
    return None


def in_use_mb(device: torch.device) -> float:
    """Memory the program holds right now: allocated CUDA memory on a GPU; on a CPU the bytes
    glibc's heap has handed out (mallinfo2), which unlike RSS does not stay high once freed
    memory is kept for reuse; RSS where neither is available."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    mallinfo2 = _mallinfo2()
    if mallinfo2 is not None:
        m = mallinfo2()
        return (m.uordblks + m.hblkhd) / 2**20
    return rss_mb()


def available_mb() -> float:
    return psutil.virtual_memory().available / 2**20


def gpu_peaks_mb(device: torch.device) -> dict:
    if device.type != "cuda":
        return {}
    return {"gpu_peak_allocated_mb": torch.cuda.max_memory_allocated(device) / 2**20,
            "gpu_peak_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20}


def estimate_training_mb(model: torch.nn.Module, in_shape: tuple[int, int, int], batch_size: int,
                         dataset_bytes: int, optimizer_states: int = 2) -> dict:
    """A pre-flight estimate: resident data + parameters, gradients and optimizer state +
    activations kept for backward (output sizes of every leaf module for one image, x batch)."""
    sizes: list[int] = []
    hooks = [m.register_forward_hook(lambda m, i, o: sizes.append(o.numel() * o.element_size()))
             for m in model.modules() if not list(m.children())]
    was = model.training
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, *in_shape, device=next(model.parameters()).device))
    model.train(was)
    for h in hooks:
        h.remove()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    est = {"data_mb": dataset_bytes / 2**20,
           "params_mb": params * (2 + optimizer_states) / 2**20,
           "activations_mb": 2 * sum(sizes) * batch_size / 2**20}  # x2: outputs + their gradients
    est["total_mb"] = sum(est.values())
    return est


def check_fits(est: dict, cap_mb: float | None = None, what: str = "training") -> None:
    """Refuse (before any work) a setting whose estimate exceeds the memory available."""
    cap = cap_mb if cap_mb is not None else available_mb()
    if est["total_mb"] > cap:
        parts = ", ".join(f"{k[:-3]} {v:,.0f} MB" for k, v in est.items() if k != "total_mb")
        raise MnistflowError(f"{what} would need about {est['total_mb']:,.0f} MB ({parts}) but only "
                             f"{cap:,.0f} MB is available: it would swap. Use a smaller --batch-size "
                             "or let the loader stream the data (--resident no)")


class MemoryWatch:
    """Samples memory at every log interval: RSS for the logs, a warning near the limit, and a leak trend.

    A leak (e.g. keeping each step's activations in a list) shows as memory in use growing
    step after step; after ``min_points`` samples a steady growth above ``leak_kb_per_step``
    (the floor of memory in use grows at that rate, and grows in each third of the samples:
    not a warm-up that levels off) is reported once, with the growth per step.
    """

    def __init__(self, device: torch.device, leak_kb_per_step: float = 64.0, min_points: int = 6):
        self.device = device
        self.points: list[tuple[int, float]] = []
        self.leak_kb = leak_kb_per_step
        self.min_points = min_points
        self.leak_message = ""
        self.near_limit_warned = False

    def on_step_end(self, step: int, logs: dict) -> dict | None:
        if "loss" not in logs:  # measured on logged steps only
            return None
        r = rss_mb()
        self.points.append((step, in_use_mb(self.device)))
        if not self.near_limit_warned and available_mb() < 0.05 * psutil.virtual_memory().total / 2**20:
            self.near_limit_warned = True
            warn(f"memory nearly exhausted: {r:,.0f} MB RSS, {available_mb():,.0f} MB left on the machine")
        self._check_leak()
        return {"rss_mb": r}  # shown in the progress line; the run's peak comes from getrusage

    def _check_leak(self) -> None:
        pts = self.points[1:]  # the first interval includes warm-up allocations
        if self.leak_message or len(pts) < self.min_points:
            return
        steps = torch.tensor([p[0] for p in pts], dtype=torch.float64)
        # the floor: the least in use from each sample on, so that another thread's passing
        # allocation (the loader's, TensorBoard's) at one sample is not taken for a trend
        mem = torch.tensor([p[1] for p in pts], dtype=torch.float64).flip(0).cummin(0).values.flip(0)
        ds, dm = steps - steps.mean(), mem - mem.mean()
        slope = float((ds * dm).sum() / (ds * ds).sum())  # MB per step, least squares
        steady = all(bool(part[-1] > part[0]) for part in torch.tensor_split(mem, 3))  # in each third
        if slope * 1024 > self.leak_kb and steady:
            self.leak_message = (
                f"memory grows every step: +{slope * 1024:,.0f} KB/step "
                f"({mem[0]:,.0f} -> {mem[-1]:,.0f} MB in use over steps {int(steps[0])}-{int(steps[-1])}). "
                "Something keeps tensors alive across steps, e.g. appending the loss (with its graph) "
                "to a list: keep loss.item() or loss.detach() instead")
            warn(self.leak_message)
