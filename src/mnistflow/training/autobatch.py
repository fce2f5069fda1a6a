"""``--batch-size auto``: on a GPU the largest batch that fits, on a CPU the fastest in img/s.

Each candidate trains a throw-away copy of the model for a few steps on random inputs, inside
``torch.random.fork_rng`` so the real run's random streams (and so its results) do not change.
"""
from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from mnistflow.models.ensemble import member_loss
from mnistflow.training.optim import build_optimizer, net_parameters
from mnistflow.runtime.device import Amp

if TYPE_CHECKING:
    from mnistflow.training.config import TrainConfig

CPU_CANDIDATES = (64, 128, 256, 512)
GPU_MAX = 1 << 16


def _steps(model, cfg, in_shape, num_classes, device, amp: Amp, batch: int, n: int) -> float:
    """Seconds per training step of a copy of ``model`` at ``batch`` (n timed steps)."""
    m = copy.deepcopy(model).train()
    opt = build_optimizer(cfg.optimizer, net_parameters(m), cfg.lr, momentum=cfg.momentum,
                          nesterov=cfg.nesterov, weight_decay=cfg.weight_decay)
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    x = torch.randn(batch, *in_shape, device=device).contiguous(memory_format=fmt)
    y = torch.randint(0, num_classes, (batch,), device=device)

    def step():
        with amp.autocast():
            loss = member_loss(m(x).float(), y, F.cross_entropy)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()  # warm-up: kernel selection, allocations
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the measurement needs the work to be done
    return (time.perf_counter() - t0) / n


def choose_batch_size(model: torch.nn.Module, cfg: TrainConfig, in_shape: tuple[int, int, int],
                      num_classes: int, device: torch.device, precision: str,
                      n_train: int) -> tuple[int, str]:
    """(batch size, a one-line reason) for ``--batch-size auto``."""
    amp = Amp.create(precision, device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        if device.type == "cuda":
            best, b = None, 64
            while b <= min(GPU_MAX, n_train):
                try:
                    _steps(model, cfg, in_shape, num_classes, device, amp, b, 1)
                    best = b
                    b *= 2
                except torch.cuda.OutOfMemoryError:
                    break
                finally:
                    torch.cuda.empty_cache()
            if best is None:
                from mnistflow.core.errors import MnistflowError

                raise MnistflowError("--batch-size auto: not even a batch of 64 fits in the GPU's memory")
            return best, f"the largest power of two that fits on {device} (up to {min(GPU_MAX, n_train):,})"
        rates = {}
        for b in (c for c in CPU_CANDIDATES if c <= n_train):
            rates[b] = b / _steps(model, cfg, in_shape, num_classes, device, amp, b, 3)
    best = max(rates, key=rates.get)
    return best, "the fastest on this CPU: " + ", ".join(f"{b}: {r:,.0f} img/s" for b, r in rates.items())
