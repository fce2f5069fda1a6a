"""One training step, and the logged numbers of a stretch of steps: the loop's hot path.

No device syncs in the hot loop: loss and correct counts accumulate on the device and are
read once every ``log_every`` steps (one ``.tolist()``, :meth:`LogWindow.read`). On a CPU a
scalar read is not a device sync, so there the loss is checked for NaN/inf after every step.

Under torchrun (a loader with ``world_size > 1``) the logged sums are all-reduced at that
same point, once per log interval, so the numbers are the global batch's. A single process
makes no collective call at all.
"""
from __future__ import annotations

import contextlib
import functools
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from mnistflow.core.errors import MnistflowError
from mnistflow.core.log import warn
from mnistflow.models.ensemble import combined, member_loss
from mnistflow.runtime import dist
from mnistflow.runtime.compat import profiler_enabled
from mnistflow.runtime.device import Amp

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class TrainState:
    """Where training is; everything a resume needs besides the objects' own state."""

    step: int = 0  # optimizer steps done, all epochs
    epoch: int = 0
    step_in_epoch: int = 0  # batches of ``epoch`` already trained
    total_steps: int = 0
    samples: int = 0  # images trained on, all processes together (per-rank batch x world size)
    stop_reason: str = ""  # set when the run ends early: target, interrupted, a hook's reason
    metrics: dict = field(default_factory=dict)  # latest val/test results

    def advance(self, samples: int) -> None:
        """One optimizer step done, on ``samples`` images (all processes together)."""
        self.step += 1
        self.step_in_epoch += 1
        self.samples += samples

    def stop(self, reason: str | None) -> None:
        """End the run at the next point the loop checks, for ``reason``: the first one wins."""
        if reason and not self.stop_reason:
            self.stop_reason = reason


def profiled(name: str) -> contextlib.AbstractContextManager[torch.profiler.record_function | None]:
    """A named profiler range (``mnistflow/<phase>``) while a profiler records; else free."""
    if profiler_enabled():
        return torch.profiler.record_function("mnistflow/" + name)
    return contextlib.nullcontext()


class NonFiniteLoss(MnistflowError):
    pass


def nonfinite(state: TrainState, lr: float, precision: str, *, weights: bool = False) -> NonFiniteLoss:
    """The error of a run whose numbers became NaN/inf: the training loss of the step at
    ``state.step`` (checked before its update), or with ``weights`` the weights after the step
    just done (the last step's update, which no loss of the run ever sees)."""
    tips = [f"a lower --lr (now {lr:.3g})", "--schedule onecycle or --warmup 0.05"]
    if precision != "fp32":
        tips.append("--precision fp32")
    what, step, epoch = "training loss", state.step, state.epoch + 1
    if weights:  # the step before: it may have ended an epoch (and the count moved on)
        what, step, epoch = "the weights", state.step - 1, state.epoch + (state.step_in_epoch > 0)
    return NonFiniteLoss(f"{what} became NaN/inf at step {step} (epoch {epoch}); "
                         f"stopped. Try {', '.join(tips)}")


def finite_weights(model: nn.Module) -> bool:
    """Whether every floating-point parameter and buffer of ``model`` is finite (one device
    sync): checked once, before the model is saved."""
    flags = [torch.isfinite(t).all() for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    return not flags or bool(torch.stack(flags).all())


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, amp: Amp, xb: torch.Tensor,
               yb: torch.Tensor, lr: float | torch.Tensor, *, label_smoothing: float = 0.0,
               loss_fn: LossFn | None = None, autocast_cache: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step at learning rate ``lr``; (the detached loss, the logits). An ensemble
    (``models.ensemble``) is stepped on the sum of its members' losses and returns their mean
    loss and their combined prediction."""
    for g in optimizer.param_groups:
        g["lr"] = lr
    with profiled("forward"):
        with amp.autocast(autocast_cache):
            logits = model(xb)  # (N, classes); an ensemble's members: (N, K, classes)
        loss = member_loss(logits.float(), yb, loss_fn or functools.partial(
            F.cross_entropy, label_smoothing=label_smoothing))
    with profiled("backward"):
        optimizer.zero_grad(set_to_none=True)
        if amp.scaler is not None:
            amp.scaler.scale(loss).backward()
        else:
            loss.backward()
    with profiled("optimizer"):
        if amp.scaler is not None:
            amp.scaler.step(optimizer)
            amp.scaler.update()
        else:
            optimizer.step()
    if logits.dim() == 2:
        return loss.detach(), logits.detach()
    return loss.detach() / logits.shape[1], combined(logits.detach())  # logged: a member's mean loss


def graph_blocker(device: torch.device, world_size: int, optimizer: str, precision: str,
                  compiled: bool, profiling: bool) -> str | None:
    """Why the training step cannot be replayed as a CUDA graph here (None: it can)."""
    return ("not a CUDA device" if device.type != "cuda" else
            "more than one process" if world_size > 1 else
            f"--optimizer {optimizer} (Muon alone takes its learning rate as a device tensor)"
            if optimizer != "muon" else
            "fp16 (the gradient scaler decides on the host)" if precision == "fp16" else
            "--compile" if compiled else
            "profiling (the profile would show one graph launch per step)" if profiling else None)


class GraphedStep:
    """:func:`train_step` captured once as a CUDA graph and replayed every step after.

    A small net's step on a GPU is bound by the host: ~170 kernel launches of a few
    microseconds of GPU work each (the fast net on an H100: 0.7 ms of GPU time in a 5 ms
    step). One graph launch replaces them. The first ``WARMUP`` steps run eagerly on a side
    stream (the lazy initialisations: optimizer state, cuBLAS workspaces), then the step is
    captured with static input buffers and a device tensor for the learning rate, and each
    later step copies its batch in, sets the rate and replays. The replay is the same kernels
    on the same tensors: parameters, buffers and optimizer state update in place, so
    evaluation, checkpoints and resuming see them as they would eagerly. A batch of another
    shape (a short last batch) steps eagerly; a capture that fails warns and steps eagerly.
    """

    WARMUP = 3

    def __init__(self) -> None:
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failed = False
        self.stream = torch.cuda.Stream()

    def __call__(self, model: nn.Module, optimizer: torch.optim.Optimizer, amp: Amp, xb: torch.Tensor,
                 yb: torch.Tensor, lr: float, **kw) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        if self.graph is None and not self.failed and self.calls > self.WARMUP:
            self._capture(model, optimizer, amp, xb, yb, lr, kw)
        if self.graph is None or xb.shape != self.x.shape or yb.shape != self.y.shape:
            return self._eager(model, optimizer, amp, xb, yb, lr, kw)
        self.x.copy_(xb)
        self.y.copy_(yb)
        self.lr.fill_(lr)
        for g in optimizer.param_groups:  # what an eager step leaves there (checkpoints read it)
            g["lr"] = lr
        self.graph.replay()
        return self.out  # overwritten by the next replay: the loop reads them before that

    def _eager(self, model, optimizer, amp, xb, yb, lr, kw):
        current = torch.cuda.current_stream()
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            out = train_step(model, optimizer, amp, xb, yb, lr, **kw)
        current.wait_stream(self.stream)
        return out

    def _capture(self, model, optimizer, amp, xb, yb, lr, kw) -> None:
        self.x, self.y = xb.clone(), yb.clone()  # the static inputs the graph reads
        self.lr = torch.tensor(float(lr), device=xb.device)
        optimizer.zero_grad(set_to_none=True)  # the gradients: allocated inside the graph's pool
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=self.stream):
                self.out = train_step(model, optimizer, amp, self.x, self.y, self.lr, autocast_cache=False, **kw)
        except Exception as e:  # noqa: BLE001 - any op the capture refuses: step eagerly instead
            torch.cuda.synchronize()
            optimizer.zero_grad(set_to_none=True)
            self.failed = True
            warn(f"--cuda-graphs auto: the training step could not be captured as a CUDA graph "
                 f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); stepping eagerly")
            return
        finally:
            for g in optimizer.param_groups:
                g["lr"] = float(lr)
        self.graph = graph


class LogWindow:
    """Loss and accuracy summed on the device over the steps since the last logged step."""

    def __init__(self, device: torch.device, loader) -> None:
        self.loader = loader
        self.world = getattr(loader, "world_size", 1)  # every rank's batch has this rank's size
        self.loss = torch.zeros((), device=device)
        self.correct = torch.zeros((), dtype=torch.int64, device=device)
        self.n = 0
        self.epoch_sums = [0.0, 0.0, 0]  # loss x n, correct, n: this epoch's logged intervals
        self.restart()

    def new_epoch(self) -> None:
        """Start a new window and a new epoch's totals."""
        self.epoch_sums = [0.0, 0.0, 0]
        self.restart()

    def epoch_means(self) -> dict:
        """The epoch's training loss and accuracy so far (over its logged intervals: every step of
        it, as an epoch ends on a logged step), from the numbers each read synced already."""
        loss, correct, n = self.epoch_sums
        return {"loss": loss / n, "acc": correct / n} if n else {}

    def restart(self) -> None:
        """Start a new window (after a log, or when an epoch begins)."""
        self.loss.zero_()
        self.correct.zero_()
        self.n = 0
        self.t0, self.wait0 = time.perf_counter(), self.loader.stats.wait_s

    def add(self, loss: torch.Tensor, logits: torch.Tensor, yb: torch.Tensor) -> None:
        n = yb.shape[0]
        self.loss += loss * n
        self.correct += (logits.argmax(1) == yb).sum()
        self.n += n

    def read(self, state: TrainState, lr: float, precision: str) -> dict:
        """The window's logged scalars (the one device sync per log interval); starts a new one."""
        with profiled("sync"):
            sums = torch.stack([self.loss, self.correct.to(self.loss.dtype)])
            if self.world > 1:  # the global batch's numbers: one collective per log interval
                sums = dist.all_reduce_sum(torch.cat([sums, sums.new_tensor([self.n])]))
                wl, wc, wn = sums.tolist()  # the sync point
            else:
                (wl, wc), wn = sums.tolist(), self.n  # the sync point
        if not math.isfinite(wl):
            raise nonfinite(state, lr, precision)
        self.epoch_sums = [self.epoch_sums[0] + wl, self.epoch_sums[1] + wc, self.epoch_sums[2] + wn]
        stats = self.loader.stats
        dt = max(time.perf_counter() - self.t0, 1e-9)
        logs = {"epoch": state.epoch + state.step_in_epoch / max(len(self.loader), 1),
                "loss": wl / wn, "acc": wc / wn, "lr": lr, "img_per_s": wn / dt,
                "data_wait_frac": min((stats.wait_s - self.wait0) / dt, 1.0),
                "queue_depth": stats.queue_depth}
        self.restart()
        return logs
