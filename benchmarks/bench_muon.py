"""Muon's orthogonalization in bf16 or in fp32, on this CPU: the time of one whole fp32
training step (batch 256, Muon) of each net, the two interleaved in one run.

    .venv/bin/python benchmarks/bench_muon.py [--models fast fast-wide fast-deep] [--rounds 3]

``kernels.muon.orthogonalize`` takes bf16 products for matrices of 65,536 entries or more only
where the CPU has bf16 units (AMX, AVX-512-BF16) or on a GPU. This measures both choices on the
machine at hand (the forced one by patching ``cpu_has_fast_bf16``): on an AVX2-only CPU bf16 is
emulated, and the step is several times slower with it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, table  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def step_ms(name: str, bf16_products: bool, batch: int = 256, steps: int = 6) -> float:
    """Median ms of a Muon training step of ``name`` (fp32), orthogonalizing in bf16 or fp32."""
    from mnistflow.kernels import muon
    from mnistflow.models import create_model
    from mnistflow.training.optim import build_optimizer

    muon.cpu_has_fast_bf16 = lambda: bf16_products  # what orthogonalize asks
    torch.manual_seed(0)
    model = create_model(name).to(memory_format=torch.channels_last)
    opt = build_optimizer("muon", model.parameters(), 0.1)
    x = torch.randn(batch, 1, 28, 28).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,))
    times = []
    for i in range(steps + 2):
        t = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= 2:  # two warm-up steps (oneDNN primitive creation)
            times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["fast", "fast-wide", "fast-deep"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from mnistflow.runtime.cpu import cpu_has_fast_bf16

    native = cpu_has_fast_bf16()
    ms: dict[tuple[str, bool], list[float]] = {}
    for _ in range(a.rounds):  # interleaved: the VM's speed drifts
        for name in a.models:
            for bf16 in (True, False):
                ms.setdefault((name, bf16), []).append(step_ms(name, bf16))
    rows = []
    for name in a.models:
        b, f = (statistics.median(ms[name, v]) for v in (True, False))
        rows.append({"model": name, "bf16 products ms/step": b, "fp32 ms/step": f, "bf16 / fp32": b / f,
                     "img/s with the default": 256_000 / (b if native else f)})
    print(machine())
    print(f"this CPU has bf16 units: {native} (the default: {'bf16' if native else 'fp32'} products); "
          f"median of {a.rounds} interleaved rounds, batch 256, fp32 step\n")
    print(table(rows, ["model", "bf16 products ms/step", "fp32 ms/step", "bf16 / fp32", "img/s with the default"]))


if __name__ == "__main__":
    main()
