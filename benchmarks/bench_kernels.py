"""mnistflow's native CPU kernels against the PyTorch ops they replace, in one run.

    .venv/bin/python benchmarks/bench_kernels.py [--threads 2] [--rounds 30]
                     [--precision auto|bf16|fp32] [--recipe-seeds 0 1 2]

Rows: each kernel (forward + backward where it has one) at the fast net's shapes (batch 384,
channels-last, in the precision the recipes train in on this CPU: ``--precision auto``, bf16 on
CPUs with AMX or AVX-512-BF16, else fp32; the weight-gradient and Newton-Schulz rows on CPUs
with either), then a training step of each recipe's net (fast, fast-wide and fast-deep with
Muon, seed-cnn with Adam) with the kernels on and off (``MNISTFLOW_KERNELS=0``, switched in
process), then whole `fast` recipe runs from prepared MNIST records, kernels on and off, seed
by seed (``--recipe-seeds``; none: skip; ``--data``: the MNIST files). Everything is measured
interleaved, round after round, and each step figure is the median over rounds of the best of 5
calls: this VM's speed drifts by 1.5x over seconds, and interleaving puts both sides of a ratio
in the same drift.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, table  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CL = torch.channels_last
B = 384  # the fast recipe's batch
DT = torch.bfloat16  # the precision of the kernel rows (main: --precision)


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
        x = torch.randn(B, c, h, h).to(DT).contiguous(memory_format=CL)
        g = torch.randn(B, c, (h + 1) // 2, (h + 1) // 2).to(DT).contiguous(memory_format=CL)

        def ref(x=x, g=g):
            a = x.detach().requires_grad_()
            F.max_pool2d(a, 2, ceil_mode=True).backward(g)

        def ker(x=x, g=g, pool=MaxPool2x2()):
            a = x.detach().requires_grad_()
            pool(a).backward(g)

        pairs.append((f"max-pool 2x2 {c}x{h}x{h}, fwd+bwd", ref, ker))
    for c, h in ((32, 7), (48, 4), (96, 2)):
        x = torch.randn(B, c, h, h).to(DT).contiguous(memory_format=CL)
        g = torch.randn_like(x)
        bn, ours = nn.BatchNorm2d(c), BatchNormReLU2d(c)

        def ref(x=x, g=g, bn=bn):
            a = x.detach().requires_grad_()
            F.relu(bn(a), inplace=True).backward(g)

        def ker(x=x, g=g, ours=ours):
            a = x.detach().requires_grad_()
            ours(a).backward(g)

        pairs.append((f"batch norm + ReLU {c}x{h}x{h}, fwd+bwd", ref, ker))
    x = torch.randn(2000, 32, 7, 7).to(DT).contiguous(memory_format=CL)  # a test-pass batch
    bn, ours = nn.BatchNorm2d(32).eval(), BatchNormReLU2d(32).eval()
    pairs.append(("batch norm + ReLU 32x7x7, inference, batch 2000",
                  lambda x=x, bn=bn: torch.no_grad()(lambda: F.relu(bn(x), inplace=True))(),
                  lambda x=x, ours=ours: torch.no_grad()(ours)(x)))
    from mnistflow.kernels.layout import col2im, col2im_reference
    gc = torch.randn(B, 2, 2, 3, 3, 48).to(DT)  # the fast net's last stage: 4x4 -> 2x2
    pairs.append(("col2im 3x3 windows of 48x4x4 (strided adds vs kernel)",
                  lambda gc=gc: col2im_reference(gc, 4, 4, 3), lambda gc=gc: col2im(gc, 4, 4, 3)))
    for c in (48, 96):
        x = torch.randn(B, c, 4, 4).to(DT).contiguous(memory_format=CL)
        pairs.append((f"batch/channel swap {c}x4x4", lambda x=x: x.transpose(0, 1).contiguous(memory_format=CL),
                      lambda x=x: swap_batch_channels(x)))
    return pairs + bf16_pairs()


def bf16_pairs() -> list[tuple[str, object, object]]:
    """The bf16 matrix kernels (AMX, or AVX-512-BF16 on CPUs without AMX): the weight gradient
    against oneDNN's, the first conv + max-pool node against PyTorch's two layers, Muon's
    Newton-Schulz on a net's matrices against PyTorch's iteration; none without either."""
    from mnistflow import kernels
    from mnistflow.kernels import muon, wgrad

    engine = kernels.bf16_engine()
    if engine is None:
        print(f"(no weight-gradient rows: {kernels.bf16_reason()})")
        return []
    name = "AMX" if engine == "amx" else "AVX-512-BF16"
    pairs = []
    for c, o, h in ((4, 32, 14), (32, 48, 7), (48, 96, 4)):
        x = torch.randn(B, c, h, h).bfloat16().contiguous(memory_format=CL)
        g = torch.randn(B, o, h, h).bfloat16().contiguous(memory_format=CL)
        w = torch.randn(o, c, 3, 3).bfloat16().contiguous(memory_format=CL)
        ref = (lambda x=x, g=g, w=w: torch.ops.aten.convolution_backward(
            g, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False]))
        pairs.append((f"weight gradient 3x3 {c}->{o} {h}x{h} (oneDNN vs {name})", ref,
                      lambda x=x, g=g: wgrad._weight_grad(kernels.library(), x, g)))
    x = torch.randn(B, 4, 14, 14).bfloat16().contiguous(memory_format=CL)
    w = torch.randn(32, 4, 3, 3, requires_grad=True)
    gp = torch.randn(B, 32, 7, 7).bfloat16().contiguous(memory_format=CL)

    def ref(x=x, w=w, gp=gp):
        F.max_pool2d(F.conv2d(x, w.to(torch.bfloat16), padding=1), 2, ceil_mode=True).backward(gp)

    pairs.append(("first conv 4->32 14x14 + max-pool, fwd+bwd (PyTorch vs one node)", ref,
                  lambda x=x, w=w, gp=gp: wgrad.conv3x3_maxpool(x, w).backward(gp)))
    for net, shapes in (("fast", ((48, 288), (192, 432))), ("fast-wide", ((64, 36), (128, 576), (256, 1152)))):
        mats = [torch.randn(*shape) for shape in shapes]  # the Muon matrices (out, fan_in) of a step
        pairs.append((f"Muon's Newton-Schulz, {net}'s matrices, 3 steps (PyTorch vs {name})",
                      lambda mats=mats: [muon.orthogonalize(m, 3) for m in mats],
                      lambda mats=mats: muon.newton_schulz(mats, 3)))
    return pairs


def step_fn(name: str, optimizer: str, batch: int):
    """A training step of registered net ``name`` at ``batch``, autocast to DT unless fp32."""
    from mnistflow.models import create_model
    from mnistflow.training.optim import build_optimizer

    torch.manual_seed(0)
    model = create_model(name).to(memory_format=CL)
    bf16 = DT == torch.bfloat16
    opt = build_optimizer(optimizer, model.parameters(), 1e-3 if optimizer == "adam" else 0.5,
                          **({} if optimizer == "adam" else dict(momentum=0.9, nesterov=True, bf16_products=bf16)))
    x = torch.randn(batch, 1, 28, 28).contiguous(memory_format=CL)
    y = torch.randint(0, 10, (x.shape[0],))

    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def recipe_runs(data: str, seeds: list[int], threads: int) -> list[dict]:
    """Whole `fast` recipe runs from prepared records, kernels on and off, seed by seed
    (on, off, on, off, ...): test accuracy and wall time to the end of the test pass."""
    import mnistflow

    tmp = Path(tempfile.mkdtemp())
    rec = mnistflow.prepare("mnist", data, tmp / "mnist", quiet=True)
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for s in seeds:
        for side in ("on", "off"):
            _set_kernels(side == "on")
            runs[side].append(mnistflow.train(recipe="fast", data=str(rec), seed=s, threads=threads, quiet=True,
                                              tensorboard=False, run_dir=str(tmp / f"{side}{s}")))
    _set_kernels(True)
    row = {"op": f"`fast` recipe, whole run from records (ms; median of seeds {' '.join(map(str, seeds))})"}
    for side, col in (("off", "PyTorch ms"), ("on", "kernel ms")):
        row[col] = 1e3 * statistics.median(r["wall_s"] for r in runs[side])
        print(f"fast recipe, kernels {side}: test " + " ".join(f"{100 * r['test_acc']:.2f}" for r in runs[side])
              + ", wall s " + " ".join(f"{r['wall_s']:.2f}" for r in runs[side]), flush=True)
    row["ratio"] = row["kernel ms"] / row["PyTorch ms"]
    return [row]


def main() -> None:
    global DT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto")
    ap.add_argument("--recipe-seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--data", default=os.environ.get("MNISTFLOW_DATA", "../shared/data/mnist"))
    args = ap.parse_args()
    from mnistflow.runtime.cpu import tune_malloc
    from mnistflow.runtime.device import pick_precision

    tune_malloc()
    torch.set_num_threads(args.threads)
    precision = pick_precision(args.precision, torch.device("cpu"))
    DT = torch.bfloat16 if precision == "bf16" else torch.float32
    _set_kernels(True)
    from mnistflow import kernels
    if kernels.library() is None:
        sys.exit(f"bench_kernels: the kernels are {kernels.reason()}")
    print(machine())
    print(f"precision {precision} (--precision {args.precision}); AMX: {kernels.amx_reason()}; "
          f"weight gradient: {kernels.bf16_reason()}", flush=True)
    rows = []
    for name, ref, ker in op_pairs():
        t = interleaved({"ref": ref, "ker": ker}, args.rounds)
        rows.append({"op": name, "PyTorch ms": t["ref"], "kernel ms": t["ker"], "ratio": t["ker"] / t["ref"]})
        print(f"{name}: {t['ref']:.3f} / {t['ker']:.3f} ms", flush=True)
    # each recipe's net, optimizer and batch, as the recipe (and what it changes per kind of data) says
    from mnistflow.training.recipes import RECIPES, for_data

    nets = {}
    for recipe in ("fast", "best", "seed-cnn"):
        for kind in ("", "clothing"):
            r = {**RECIPES[recipe], **for_data(recipe, kind)}
            nets.setdefault(r["model"], (r["optimizer"], r["batch_size"], f"{recipe}, {kind}" if kind else recipe))
    for net, (optimizer, batch, recipe) in nets.items():
        steps = {"on": step_fn(net, optimizer, batch), "off": step_fn(net, optimizer, batch)}
        switch = {"on": lambda: _set_kernels(True), "off": lambda: _set_kernels(False)}
        t = interleaved(steps, max(args.rounds // 3, 5), before=switch)
        rows.append({"op": f"{net} training step ({recipe}: {optimizer}, batch {batch})",
                     "PyTorch ms": t["off"], "kernel ms": t["on"], "ratio": t["on"] / t["off"]})
        print(f"{net} step: off {t['off']:.2f} / on {t['on']:.2f} ms", flush=True)
    _set_kernels(True)
    if args.recipe_seeds:
        rows += recipe_runs(args.data, args.recipe_seeds, args.threads)
    print(table(rows, ["op", "PyTorch ms", "kernel ms", "ratio"]))


if __name__ == "__main__":
    main()
