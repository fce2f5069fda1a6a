"""mnistflow's native CPU kernels against the PyTorch ops they replace, in one run.

    .venv/bin/python benchmarks/bench_kernels.py [--threads 2] [--rounds 30]

Rows: each kernel (forward + backward where it has one) at the fast net's shapes (batch 384,
bf16, channels-last; the AMX rows on CPUs with AMX), then whole training steps of the `fast`
and `seed-cnn` nets (bf16 autocast, Muon / Adam) with the kernels on and off
(``MNISTFLOW_KERNELS=0``, switched in process), and a `fast` step with the last stage before
and after it became a VALID convolution (the "PyTorch" column is then the old net). Everything is measured interleaved, round after round, and each figure is the
median over rounds of the best of 5 calls: this VM's speed drifts by 1.5x over seconds, and
interleaving puts both sides of a ratio in the same drift.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, table  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CL = torch.channels_last
B = 384  # the fast recipe's batch


def interleaved(fns: dict, rounds: int, reps: int = 5, before: dict | None = None) -> dict:
    """Median over rounds of the best of ``reps`` calls, in ms; all functions every round.
    ``before[k]()`` runs untimed before function k's calls in each round."""
    res = {k: [] for k in fns}
    for k, f in fns.items():
        if before:
            before[k]()
        f(), f()  # warm-up (oneDNN primitives, allocator)
    for _ in range(rounds):
        for k, f in fns.items():
            if before:
                before[k]()
            best = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                f()
                best = min(best, time.perf_counter() - t0)
            res[k].append(best)
    return {k: statistics.median(v) * 1e3 for k, v in res.items()}


def _set_kernels(on: bool) -> None:
    from mnistflow import kernels

    os.environ["MNISTFLOW_KERNELS"] = "1" if on else "0"
    kernels.library.cache_clear()
    kernels.library()


def op_pairs() -> list[tuple[str, object, object]]:
    """(name, PyTorch version, kernel version): each a fwd+bwd closure on fixed inputs."""
    from mnistflow.kernels.layout import swap_batch_channels
    from mnistflow.models.layers import BatchNormReLU2d, MaxPool2x2

    pairs = []
    for c, h in ((32, 14), (48, 7), (96, 4)):
        x = torch.randn(B, c, h, h).bfloat16().contiguous(memory_format=CL)
        g = torch.randn(B, c, (h + 1) // 2, (h + 1) // 2).bfloat16().contiguous(memory_format=CL)

        def ref(x=x, g=g):
            a = x.detach().requires_grad_()
            F.max_pool2d(a, 2, ceil_mode=True).backward(g)

        def ker(x=x, g=g, pool=MaxPool2x2()):
            a = x.detach().requires_grad_()
            pool(a).backward(g)

        pairs.append((f"max-pool 2x2 {c}x{h}x{h}, fwd+bwd", ref, ker))
    for c, h in ((32, 7), (48, 4), (96, 2)):
        x = torch.randn(B, c, h, h).bfloat16().contiguous(memory_format=CL)
        g = torch.randn_like(x)
        bn, ours = nn.BatchNorm2d(c), BatchNormReLU2d(c)

        def ref(x=x, g=g, bn=bn):
            a = x.detach().requires_grad_()
            F.relu(bn(a), inplace=True).backward(g)

        def ker(x=x, g=g, ours=ours):
            a = x.detach().requires_grad_()
            ours(a).backward(g)

        pairs.append((f"batch norm + ReLU {c}x{h}x{h}, fwd+bwd", ref, ker))
    x = torch.randn(2000, 32, 7, 7).bfloat16().contiguous(memory_format=CL)  # a test-pass batch
    bn, ours = nn.BatchNorm2d(32).eval(), BatchNormReLU2d(32).eval()
    pairs.append(("batch norm + ReLU 32x7x7, inference, batch 2000",
                  lambda x=x, bn=bn: torch.no_grad()(lambda: F.relu(bn(x), inplace=True))(),
                  lambda x=x, ours=ours: torch.no_grad()(ours)(x)))
    from mnistflow.kernels.layout import col2im, col2im_reference
    gc = torch.randn(B, 2, 2, 3, 3, 48).bfloat16()  # the fast net's last stage: 4x4 -> 2x2
    pairs.append(("col2im 3x3 windows of 48x4x4 (strided adds vs kernel)",
                  lambda gc=gc: col2im_reference(gc, 4, 4, 3), lambda gc=gc: col2im(gc, 4, 4, 3)))
    for c in (48, 96):
        x = torch.randn(B, c, 4, 4).bfloat16().contiguous(memory_format=CL)
        pairs.append((f"batch/channel swap {c}x4x4", lambda x=x: x.transpose(0, 1).contiguous(memory_format=CL),
                      lambda x=x: swap_batch_channels(x)))
    return pairs + amx_pairs()


def amx_pairs() -> list[tuple[str, object, object]]:
    """The AMX weight gradient against oneDNN's, and the first conv + max-pool node against
    PyTorch's two layers; none without AMX."""
    from mnistflow import kernels
    from mnistflow.kernels import wgrad

    if not kernels.amx_available():
        print(f"(no AMX rows: {kernels.amx_reason()})")
        return []
    pairs = []
    for c, o, h in ((4, 32, 14), (32, 48, 7), (48, 96, 4)):
        x = torch.randn(B, c, h, h).bfloat16().contiguous(memory_format=CL)
        g = torch.randn(B, o, h, h).bfloat16().contiguous(memory_format=CL)
        w = torch.randn(o, c, 3, 3).bfloat16().contiguous(memory_format=CL)
        ref = (lambda x=x, g=g, w=w: torch.ops.aten.convolution_backward(
            g, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False]))
        pairs.append((f"weight gradient 3x3 {c}->{o} {h}x{h} (oneDNN vs AMX)", ref,
                      lambda x=x, g=g: wgrad._weight_grad(kernels.library(), x, g)))
    x = torch.randn(B, 4, 14, 14).bfloat16().contiguous(memory_format=CL)
    w = torch.randn(32, 4, 3, 3, requires_grad=True)
    gp = torch.randn(B, 32, 7, 7).bfloat16().contiguous(memory_format=CL)

    def ref(x=x, w=w, gp=gp):
        F.max_pool2d(F.conv2d(x, w.to(torch.bfloat16), padding=1), 2, ceil_mode=True).backward(gp)

    pairs.append(("first conv 4->32 14x14 + max-pool, fwd+bwd (PyTorch vs one node)", ref,
                  lambda x=x, w=w, gp=gp: wgrad.conv3x3_maxpool(x, w).backward(gp)))
    return pairs


def step_fn(name: str, optimizer: str, widths: tuple | None = None):
    """A training step of a registered net (or of the fast net at ``widths``, all stages SAME)."""
    from mnistflow.models import create_model
    from mnistflow.models.fast import FastNet
    from mnistflow.training.optim import build_optimizer

    torch.manual_seed(0)
    model = (FastNet((1, 28, 28), 10, widths) if widths else create_model(name)).to(memory_format=CL)
    opt = build_optimizer(optimizer, model.parameters(), 1e-3 if optimizer == "adam" else 0.5,
                          **({} if optimizer == "adam" else dict(momentum=0.9, nesterov=True, bf16_products=True)))
    x = torch.randn(B if name == "fast" else 128, 1, 28, 28).contiguous(memory_format=CL)
    y = torch.randint(0, 10, (x.shape[0],))

    def step():
        with torch.autocast("cpu", torch.bfloat16):
            loss = F.cross_entropy(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    from mnistflow.runtime.cpu import tune_malloc

    tune_malloc()
    torch.set_num_threads(args.threads)
    _set_kernels(True)
    from mnistflow import kernels
    if kernels.library() is None:
        sys.exit(f"bench_kernels: the kernels are {kernels.reason()}")
    print(machine())
    rows = []
    for name, ref, ker in op_pairs():
        t = interleaved({"ref": ref, "ker": ker}, args.rounds)
        rows.append({"op": name, "PyTorch ms": t["ref"], "kernel ms": t["ker"], "ratio": t["ker"] / t["ref"]})
    for net, optimizer in (("fast", "muon"), ("seed-cnn", "adam")):
        steps = {"on": step_fn(net, optimizer), "off": step_fn(net, optimizer)}
        switch = {"on": lambda: _set_kernels(True), "off": lambda: _set_kernels(False)}
        t = interleaved(steps, max(args.rounds // 3, 5), before=switch)
        rows.append({"op": f"{net} training step ({optimizer}, batch {B if net == 'fast' else 128})",
                     "PyTorch ms": t["off"], "kernel ms": t["on"], "ratio": t["on"] / t["off"]})
    _set_kernels(True)
    t = interleaved({"same": step_fn("fast", "muon", (32, 48, 96)), "valid": step_fn("fast", "muon")},
                    max(args.rounds // 3, 5))
    rows.append({"op": "fast training step: last stage SAME 96 + pool (before) vs VALID 192 (now)",
                 "PyTorch ms": t["same"], "kernel ms": t["valid"], "ratio": t["valid"] / t["same"]})
    print(table(rows, ["op", "PyTorch ms", "kernel ms", "ratio"]))


if __name__ == "__main__":
    main()
