"""Optimizers by name, and learning-rate schedules as pure functions of the step."""
from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import torch

from mnistflow.core import choices
from mnistflow.kernels import bf16_engine
from mnistflow.kernels.muon import orthogonalize  # Newton-Schulz in PyTorch, beside its AMX kernel
from mnistflow.models.ensemble import nets



_FUSED = {"sgd", "momentum", "adagrad", "adam", "adamw"}  # fused kernels on CPU and CUDA
_FUSED_CPU_ONLY = {"adagrad"}  # fused=True on CUDA raises (PyTorch 2.4-2.13): foreach there


def net_parameters(model: torch.nn.Module) -> list[list[torch.nn.Parameter]]:
    """The parameters of each net in ``model``: one list, or one per member of an ensemble
    (``models.ensemble``), so that Muon finds each net's own classifier."""
    return [list(m.parameters()) for m in nets(model)]


def _nets(params) -> list[list[torch.nn.Parameter]]:
    """``params`` as one list per net (parameters, or already one list of them per net)."""
    params = list(params)
    return [list(p) for p in params] if params and isinstance(params[0], (list, tuple)) else [params]


def build_optimizer(name: str,
                    params: Iterable[torch.nn.Parameter] | Iterable[Sequence[torch.nn.Parameter]],
                    lr: float, *, momentum: float = 0.9, nesterov: bool = False,
                    weight_decay: float = 0.0, fused: bool = True, muon_lr: float = 0.1,
                    muon_momentum: float = 0.8, bf16_products: bool = False) -> torch.optim.Optimizer:
    """The optimizer called ``name`` for ``params`` (parameters, or one list of them per net:
    ``net_parameters``); ``momentum`` is SGD with momentum (``nesterov`` optional);
    ``muon`` is :class:`Muon` (``muon_lr``, ``muon_momentum`` for its matrices;
    ``bf16_products``: its orthogonalization may multiply in bf16, as a bf16 run does).

    Uses PyTorch's fused kernels where they exist: for the tutorial CNN the unfused Adam step
    (sqrt, div, lerp as separate passes over fc1's 3.2M weights) was 45% of a bf16 CPU step;
    fused it is 5x cheaper.
    """
    nets = _nets(params)
    params = [p for net in nets for p in net]
    wd = weight_decay
    kw = {"fused": True} if fused and name in _FUSED and _fusable(params, cpu_only=name in _FUSED_CPU_ONLY) else {}
    if name == "sgd":
        return torch.optim.SGD(params, lr, weight_decay=wd, **kw)
    if name == "momentum":
        return torch.optim.SGD(params, lr, momentum=momentum, nesterov=nesterov, weight_decay=wd, **kw)
    if name == "adadelta":
        return torch.optim.Adadelta(params, lr, weight_decay=wd, foreach=True)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr, weight_decay=wd, **kw)
    if name == "adam":
        return torch.optim.Adam(params, lr, weight_decay=wd, **kw)
    if name == "adamw":
        return torch.optim.AdamW(params, lr, weight_decay=wd, **kw)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr, momentum=0.0, weight_decay=wd, foreach=True)
    if name == "muon":
        return Muon(nets, lr, muon_lr=muon_lr, muon_momentum=muon_momentum, momentum=momentum,
                    nesterov=nesterov, weight_decay=wd, bf16_products=bf16_products)
    raise ValueError(f"unknown optimizer '{name}' (known: {', '.join(choices.OPTIMIZERS)})")


class Muon(torch.optim.Optimizer):
    """Muon for the hidden weight matrices, Nesterov SGD for everything else.

    Muon (Jordan et al., 2024; the optimizer of the airbench CIFAR-10 speed records) takes the
    momentum of a weight matrix (a conv filter bank is flattened to ``(out, in*k*k)``) and
    orthogonalizes it: every direction of the update gets the same size, so the rarely
    excited directions learn as fast as the dominant ones: the ``fast`` recipe reaches in about
    half an epoch what Nesterov SGD needs nearly a whole one for (BENCHMARKS.md).

    Which parameters: every parameter with two or more dimensions except the last one, the
    classifier (the registered models define it last; a test checks it; ``params`` given as one
    list per net, as for an ensemble: each net's last), takes Muon at
    ``muon_lr`` (scaled by the schedule like ``lr``) with ``muon_momentum``; the classifier,
    biases and normalization parameters take SGD at ``lr`` with ``momentum``, ``nesterov`` and
    ``weight_decay`` (which the Muon matrices do not take: their updates have a fixed size).

    ``bf16_products`` (set by training runs in bf16): on CPUs with AMX or AVX-512-BF16, the
    orthogonalization of all the matrices runs in one native kernel call with bf16 products
    (``kernels.muon``; its speed-up is in BENCHMARKS.md). Off, it is fp32 and deterministic to fp32
    rounding (the data-parallel equivalence tests rely on that).
    """

    def __init__(self, params, lr: float, *, muon_lr: float = 0.1, muon_momentum: float = 0.8,
                 momentum: float = 0.9, nesterov: bool = True, weight_decay: float = 0.0,
                 ns_steps: int = 3, bf16_products: bool = False):
        nets, params, ortho = _nets(params), [], set()
        for net in nets:  # each net's last matrix is its classifier
            net = [p for p in net if p.requires_grad]
            matrices = [len(params) + i for i, p in enumerate(net) if p.ndim >= 2]
            ortho.update(matrices[:-1])
            params += net
        groups = [dict(params=[p for i, p in enumerate(params) if i not in ortho], muon=False)]
        if ortho:
            groups.append(dict(params=[p for i, p in enumerate(params) if i in ortho], muon=True))
        super().__init__(groups, dict(lr=lr, muon_scale=muon_lr / lr, momentum=momentum,
                                      muon_momentum=muon_momentum, nesterov=nesterov,
                                      weight_decay=weight_decay, ns_steps=ns_steps))
        self.bf16_products = bf16_products

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:
        for group in self.param_groups:
            ps = [p for p in group["params"] if p.grad is not None]
            if not ps:
                continue
            grads = [p.grad for p in ps]
            for p in ps:
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)
            bufs = [self.state[p]["momentum_buffer"] for p in ps]
            muon = group["muon"]
            mom = group["muon_momentum" if muon else "momentum"]
            if not muon and group["weight_decay"]:
                grads = torch._foreach_add(grads, ps, alpha=group["weight_decay"])
            torch._foreach_mul_(bufs, mom)
            torch._foreach_add_(bufs, grads)
            updates = torch._foreach_add(grads, bufs, alpha=mom) if group["nesterov"] else bufs
            lr = group["lr"]  # a float, or a 0-d device tensor (a CUDA graph replays with new values)
            if muon:
                lr = lr * group["muon_scale"]  # not *=: that would scale a tensor lr in place
                updates = _orthogonal_updates(updates, group["ns_steps"], self.bf16_products)
            if isinstance(lr, torch.Tensor):
                torch._foreach_add_(ps, torch._foreach_mul(updates, -lr))
            else:
                torch._foreach_add_(ps, updates, alpha=-lr)


def _orthogonal_updates(us: list[torch.Tensor], steps: int, bf16_products: bool) -> list[torch.Tensor]:
    """Muon's update for each weight tensor: orthogonalized as (out, fan_in); a tall matrix
    (out > fan_in), whose orthogonal rows cannot all be unit length, is scaled up by
    sqrt(out / fan_in). With ``bf16_products`` on CPUs with AMX or AVX-512-BF16, all of them
    in one kernel call (``kernels.muon``)."""
    mats = [u.reshape(len(u), -1) for u in us]
    if (bf16_products and all(m.device.type == "cpu" and m.dtype == torch.float32 for m in mats)
            and _muon_kernel()):
        from mnistflow.kernels.muon import newton_schulz

        outs = newton_schulz(mats, steps)
    else:
        outs = [orthogonalize(m, steps) for m in mats]
    res = []
    for u, o in zip(us, outs):
        o = o.reshape(u.shape)
        fan_in = u[0].numel()
        res.append(o * (len(u) / fan_in) ** 0.5 if len(u) > fan_in else o)
    return res


def _muon_kernel() -> bool:
    """The Newton-Schulz kernel is usable here, on AMX or AVX-512-BF16 (checked once)."""
    return bf16_engine() is not None


def _fusable(params, cpu_only: bool = False) -> bool:
    devices = ("cpu",) if cpu_only else ("cpu", "cuda")
    return bool(params) and all(p.is_floating_point() and p.device.type in devices for p in params)


def lr_factor(step: int, total: int, schedule: str, *, warmup: float = 0.0,
              steps_per_epoch: int = 1, step_every: float = 1.0, gamma: float = 0.7) -> float:
    """Multiplier of the base learning rate at ``step`` (0-based) of ``total`` steps.

    A pure function of the step: resuming needs no scheduler state.
    """
    total = max(total, 1)
    wsteps = int(warmup * total) if warmup < 1 else int(warmup)
    if schedule == "onecycle":
        # Linear up to the peak over the warm-up (default 25%), linear down to 0 after.
        wsteps = wsteps or int(0.25 * total)
        if step < wsteps:
            return (step + 1) / wsteps
        return max(0.0, (total - step) / max(total - wsteps, 1))
    if step < wsteps:
        return (step + 1) / wsteps
    progress = (step - wsteps) / max(total - wsteps, 1)
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    if schedule == "step":
        return gamma ** int(step / max(steps_per_epoch * step_every, 1))
    raise ValueError(f"unknown schedule '{schedule}' (known: {', '.join(choices.SCHEDULES)})")
