"""One epoch of training and one evaluation pass: plain functions returning metric dicts.

No device syncs in the hot loop: loss and correct counts accumulate on the device and
are read once every ``log_every`` steps (one ``.tolist()``). On a CPU a scalar read is not
a device sync, so there the loss is checked for NaN/inf after every step.

Under torchrun (a loader with ``world_size > 1``) the logged sums are all-reduced at that
same point, once per log interval, so the numbers are the global batch's; ``evaluate``
sums its shards over the ranks. A single process makes no collective call at all.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from mnistflow.runtime import dist
from mnistflow.core.errors import MnistflowError
from mnistflow.data.augment import tta_logits
from mnistflow.runtime.device import Amp


@dataclass
class TrainState:
    """Where training is; everything a resume needs besides the objects' own state."""

    step: int = 0  # optimizer steps done, all epochs
    epoch: int = 0
    step_in_epoch: int = 0  # batches of ``epoch`` already trained
    total_steps: int = 0
    samples: int = 0  # images trained on, all processes together (per-rank batch x world size)
    stop: bool = False
    stop_reason: str = ""
    metrics: dict = field(default_factory=dict)  # latest val/test results, best so far


def call(hooks: Iterable, name: str, *args) -> None:
    """Call ``hook.<name>(*args)`` on every hook that has it (hooks need no base class)."""
    for h in hooks:
        fn = getattr(h, name, None)
        if fn is not None:
            fn(*args)


def _range(name: str):
    """A named profiler range (``mnistflow/<phase>``) while a profiler records; else free."""
    if torch.autograd.profiler._is_profiler_enabled:
        return torch.profiler.record_function("mnistflow/" + name)
    return contextlib.nullcontext()


class NonFiniteLoss(MnistflowError):
    pass


def _nonfinite(step: int, epoch: int, lr: float, precision: str) -> NonFiniteLoss:
    tips = [f"a lower --lr (now {lr:.3g})", "--schedule onecycle or --warmup 0.05"]
    if precision != "fp32":
        tips.append("--precision fp32")
    return NonFiniteLoss(f"training loss became NaN/inf at step {step} (epoch {epoch + 1}); "
                         f"stopped. Try {', '.join(tips)}")


def train_one_epoch(model: nn.Module, loader, optimizer: torch.optim.Optimizer, state: TrainState, *,
                    amp: Amp, lr_at: Callable[[int], float], label_smoothing: float = 0.0,
                    log_every: int = 100, hooks: Iterable = (), max_steps: int | None = None) -> dict:
    """Train ``model`` over the rest of the loader's epoch; returns the epoch's mean loss/acc.

    Calls ``on_train_log(step, logs)`` every ``log_every`` steps and ``on_step_end(step, state)``
    after each step; a hook sets ``state.stop`` to end training early. Under torchrun the logs
    are the whole global batch's; the returned epoch means are this process's.
    """
    model.train()
    dev = next(model.parameters()).device
    check_each_step = dev.type == "cpu"
    tot_loss = torch.zeros((), device=dev)
    tot_correct = torch.zeros((), dtype=torch.int64, device=dev)
    win_loss = torch.zeros((), device=dev)
    win_correct = torch.zeros((), dtype=torch.int64, device=dev)
    tot_n = win_n = 0
    win_t0, win_wait0 = time.perf_counter(), loader.stats.wait_s
    scaler = amp.scaler
    world = getattr(loader, "world_size", 1)  # every rank's batch has this rank's size
    limit = min(max_steps or state.total_steps, state.total_steps)
    batches = iter(loader)
    while True:
        with _range("data"):
            batch = next(batches, None)
        if batch is None:
            break
        xb, yb = batch
        lr = lr_at(state.step)
        for g in optimizer.param_groups:
            g["lr"] = lr
        with _range("forward"):
            with amp.autocast():
                logits = model(xb)
            loss = F.cross_entropy(logits.float(), yb, label_smoothing=label_smoothing)
        with _range("backward"):
            optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
        with _range("optimizer"):
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
        n = yb.shape[0]
        ld = loss.detach()
        if check_each_step and not math.isfinite(ld.item()):
            raise _nonfinite(state.step, state.epoch, lr, amp.precision)
        correct = (logits.detach().argmax(1) == yb).sum()
        win_loss += ld * n
        win_correct += correct
        win_n += n
        state.step += 1
        state.step_in_epoch += 1
        state.samples += n * world
        last = state.step >= limit or state.step_in_epoch == len(loader)
        if state.step % log_every == 0 or last:
            with _range("sync"):
                sums = torch.stack([win_loss, win_correct.to(win_loss.dtype)])
                if world > 1:  # the global batch's numbers: one collective per log interval
                    sums = dist.all_reduce_sum(torch.cat([sums, sums.new_tensor([win_n])]))
                    wl, wc, wn = sums.tolist()  # the sync point
                else:
                    (wl, wc), wn = sums.tolist(), win_n  # the sync point
            if not math.isfinite(wl):
                raise _nonfinite(state.step, state.epoch, lr, amp.precision)
            now = time.perf_counter()
            dt = max(now - win_t0, 1e-9)
            logs = {"epoch": state.epoch + state.step_in_epoch / max(len(loader), 1),
                    "loss": wl / wn, "acc": wc / wn, "lr": lr, "img_per_s": wn / dt,
                    "data_wait_frac": min((loader.stats.wait_s - win_wait0) / dt, 1.0),
                    "queue_depth": loader.stats.queue_depth}
            with _range("logging"):
                call(hooks, "on_train_log", state.step, logs)
            tot_loss += win_loss
            tot_correct += win_correct
            tot_n += win_n
            win_loss.zero_()
            win_correct.zero_()
            win_n = 0
            win_t0, win_wait0 = time.perf_counter(), loader.stats.wait_s
        with _range("step_hooks"):
            call(hooks, "on_step_end", state.step, state)
        if state.step >= limit:
            state.stop = True
        if state.stop:
            break
    tot_loss += win_loss
    tot_correct += win_correct
    tot_n += win_n
    if tot_n == 0:
        return {"loss": float("nan"), "acc": float("nan"), "n": 0}
    loss_sum, correct = torch.stack([tot_loss, tot_correct.to(tot_loss.dtype)]).tolist()
    return {"loss": loss_sum / tot_n, "acc": correct / tot_n, "n": tot_n}


@torch.inference_mode()
def evaluate(model: nn.Module, loader, amp: Amp, num_classes: int, *, confusion: bool = False,
             tta: int = 0) -> dict:
    """Loss and accuracy over the whole loader; with ``confusion``, the confusion matrix
    (rows: true class, columns: predicted) and per-class accuracy. ``tta`` > 0: predictions
    averaged over each image and that many one-pixel shifts of it (``augment.tta_logits``).

    A loader with ``world_size > 1`` is this rank's shard (``pad=False``: each image on one
    rank): the sums are all-reduced, so every rank returns the whole split's numbers."""
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    loss_sum = torch.zeros((), device=dev)
    correct = torch.zeros((), dtype=torch.int64, device=dev)
    cm = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=dev) if confusion else None
    n = 0
    for xb, yb in loader:
        with amp.autocast():
            logits = tta_logits(model, xb, tta)
        loss_sum += F.cross_entropy(logits.float(), yb, reduction="sum")
        pred = logits.argmax(1)
        correct += (pred == yb).sum()
        if cm is not None:
            cm += torch.bincount(yb * num_classes + pred, minlength=num_classes * num_classes)
        n += yb.shape[0]
    model.train(was_training)
    ls = c = None
    if getattr(loader, "world_size", 1) > 1:  # before any early return: every rank takes part
        sums = torch.stack([loss_sum.double(), correct.double(),
                            torch.tensor(float(n), dtype=torch.float64, device=dev)])
        ls, c, n = dist.all_reduce_sum(sums).tolist()
        n = int(n)
        if cm is not None:
            dist.all_reduce_sum(cm)
    if n == 0:
        return {"loss": float("nan"), "acc": float("nan"), "n": 0}
    if ls is None:
        ls, c = torch.stack([loss_sum, correct.to(loss_sum.dtype)]).tolist()
    out = {"loss": ls / n, "acc": c / n, "n": n}
    if cm is not None:
        m = cm.view(num_classes, num_classes).cpu()
        out["confusion"] = m.tolist()
        rows = m.sum(1).clamp(min=1)
        out["per_class_acc"] = (m.diag() / rows).tolist()
    return out
