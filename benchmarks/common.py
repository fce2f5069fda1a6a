"""Helpers shared by the benchmarks: the machine line, a fixed-width table, the matmul peak and a
model's forward FLOPs."""
from __future__ import annotations

import os
import platform
import time


def cpu_line() -> str:
    """The CPU in a few words: its model name (as lscpu shows it, from /proc/cpuinfo), family and
    model (the name alone, "AMD EPYC" in a VM, does not tell the generation) and the flags that
    decide mnistflow's speed."""
    try:
        from mnistflow.runtime.cpu import cpu_flags, cpu_info

        info, f = cpu_info(), cpu_flags()
    except ImportError:
        info, f = {}, frozenset()
    cpu = info.get("model name", "unknown CPU")
    if info.get("cpu family"):
        cpu += f" (family {info['cpu family']} model {info.get('model', '?')})"
    return cpu + " [" + " ".join(x for x in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if x in f) + "]"


def gpu_line(device: str) -> str:
    """"NAME (CUDA x.y), host " for a CUDA device, else ""."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(torch.device(device))} (CUDA {torch.version.cuda}), host "
    return ""


def machine(device: str = "cpu") -> str:
    """The CPU (or, for a CUDA device, the GPU first), Python, torch and threads, in one line."""
    import torch

    return (f"{gpu_line(device)}{cpu_line()}, {len(os.sched_getaffinity(0))} cores, Python "
            f"{platform.python_version()}, torch {torch.__version__}, threads {torch.get_num_threads()}")


def table(rows: list[dict], cols: list[str]) -> str:
    """Rows of dicts as a fixed-width text table (numbers right-aligned)."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = "  ".join(c.ljust(w) for c, w in zip(cols, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    for row in cells:
        out.append("  ".join(v.rjust(w) if v[:1].isdigit() or v[:1] == "-" else v.ljust(w)
                             for v, w in zip(row, widths)))
    return "\n".join(out)


def matmul_peak(dtype, n: int = 2048, reps: int = 4) -> float:
    """FLOP/s of the fastest of ``reps`` n^3 products in ``dtype`` (the CPU's practical peak)."""
    import torch

    x, y = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    x @ y
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        x @ y
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def forward_flops(net, in_shape: tuple[int, ...]) -> float:
    """FLOPs of one image's forward pass through ``net`` (``torch.utils.flop_counter``)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as count, torch.inference_mode():
        net.float().eval()(torch.zeros(1, *in_shape))
    return count.get_total_flops()
