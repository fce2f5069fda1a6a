"""Helpers shared by the benchmarks: the machine line and a fixed-width table."""
from __future__ import annotations

import os
import platform


def machine() -> str:
    import torch

    cpu, family, model = "unknown CPU", "", ""
    try:  # the model name alone ("AMD EPYC" in a VM) does not tell the generation apart
        for line in open("/proc/cpuinfo"):
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name":
                cpu = value
            elif key == "cpu family":
                family = value
            elif key == "model":
                model = value
            elif not line.strip():
                break  # the first processor's block is enough
    except OSError:
        pass
    if family:
        cpu += f" (family {family} model {model})"
    flags = ""
    try:
        from mnistflow.runtime.cpu import cpu_flags

        f = cpu_flags()
        flags = " ".join(x for x in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if x in f)
    except ImportError:
        pass
    return (f"{cpu} [{flags}], {len(os.sched_getaffinity(0))} cores, Python {platform.python_version()},"
            f" torch {torch.__version__}, threads {torch.get_num_threads()}")


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
