"""One training step of a registered model, timed alone: fp32 (the baseline) next to bf16 +
channels_last, on 1 and 2 threads, in one run. What the profiles in BENCHMARKS.md were read from.

    .venv/bin/python benchmarks/bench_step.py --models fast seed-cnn [--batch 256] [--profile]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, table  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def step_time(name: str, batch: int, threads: int, bf16: bool, steps: int = 20, profile: bool = False) -> float:
    from mnistflow.models import create_model
    from mnistflow.training.optim import build_optimizer
    from mnistflow.runtime.cpu import tune_malloc

    tune_malloc()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    fmt = torch.channels_last if bf16 else torch.contiguous_format
    model = create_model(name).to(memory_format=fmt)
    opt = build_optimizer("momentum" if name != "seed-cnn" else "adam", model.parameters(), 0.01)
    x = torch.randn(batch, 1, 28, 28).contiguous(memory_format=fmt)
    y = torch.randint(0, 10, (batch,))

    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            out = model(x)
        loss = F.cross_entropy(out.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dt = (time.perf_counter() - t0) / steps
    if profile:
        from torch.profiler import ProfilerActivity, profile as prof

        with prof(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(5):
                step()
        print(f"\n{name} bf16={bf16} threads={threads}\n" +
              p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["fast", "seed-cnn"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    rows = []
    for name in a.models:
        for t in a.threads:
            base = step_time(name, a.batch, t, bf16=False)
            fast = step_time(name, a.batch, t, bf16=True, profile=a.profile)
            rows.append({"model": name, "threads": t, "fp32 ms/step": 1e3 * base,
                         "bf16+CL ms/step": 1e3 * fast, "bf16+CL img/s": a.batch / fast,
                         "x fp32": base / fast})
    print(machine())
    print(f"batch {a.batch}, one training step (forward, backward, optimizer), mean of 20\n")
    print(table(rows, ["model", "threads", "fp32 ms/step", "bf16+CL ms/step", "bf16+CL img/s", "x fp32"]))


if __name__ == "__main__":
    main()
