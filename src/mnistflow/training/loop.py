"""The training loop: :func:`fit` starts the run, steps it, and finishes it.

    mnistflow train --recipe softmax                    # the tutorial's softmax regression
    mnistflow train --recipe seed-cnn --data data/mnist # the tutorial's deep CNN
    mnistflow train --model "conv5x5x32-relu,maxpool2,fc10" --epochs 1 --json

    mnistflow train --model fast --run-dir runs/a --checkpoint-every 200   # then, after a crash:
    mnistflow train --resume --run-dir runs/a     # continues bitwise exactly (CPU, same seed)

    torchrun --standalone --nproc_per_node 2 -m mnistflow train --recipe fast   # data parallel
    mnistflow train --recipe fast --nproc 2                                      # the same

This module holds every "when" rule: when to log, evaluate, checkpoint and stop (epochs,
``--max-steps``, ``--target-acc``, a signal, a hook's ``StopTraining``). Building the run is
``training.setup``; one step is ``training.engine``; the hooks are ``training.hooks``.

The timer starts after setup (data on the device, model built, writers open) and stops after
the final test evaluation. SIGINT/SIGTERM save a checkpoint at the end of the current step and
exit (130/143). Under torchrun every rank runs ``fit``: the model is wrapped in
DistributedDataParallel, each rank reads its shard, and rank 0 alone has the console, files and
checkpoints (``setup.rank_zero_observers``). ``--batch-size`` is per process; the global batch
is batch size x world size. A signal to any rank stops all of them at the same step.
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from mnistflow import kernels
from mnistflow.artifacts.checkpoint import rng_state as checkpoint_rng_state
from mnistflow.artifacts.model_file import save_model
from mnistflow.artifacts.runlog import end_of_run_table
from mnistflow.core import log
from mnistflow.core.errors import MnistflowError
from mnistflow.core.fsutil import atomic_write_text
from mnistflow.data.augment import mirror_safe
from mnistflow.models.evaluate import evaluate
from mnistflow.runtime import dist
from mnistflow.runtime.cpu import set_interop_threads
from mnistflow.runtime.device import pick_device
from mnistflow.training import config as configmod
from mnistflow.training.agree import RanksDisagree
from mnistflow.training.callbacks import check_callbacks
from mnistflow.training.checkpointing import TrainingInterrupted
from mnistflow.training.config import TrainConfig
from mnistflow.training.engine import GraphedStep, LogWindow, finite_weights, nonfinite, profiled
from mnistflow.training.observe.memory import gpu_peaks_mb
from mnistflow.training.resume import Resume
from mnistflow.training.setup import Run, check_run_inputs, model_info, start, whiten

__all__ = ["fit", "TrainingInterrupted"]


def fit(cfg: TrainConfig, *, model: torch.nn.Module | None = None, callbacks: Sequence = (),
        loss_fn: Callable | None = None, resume: Resume | None = None) -> dict:
    """Train as configured; returns the run summary (the ``--json`` object). ``cfg`` is not changed.

    With ``cfg.resume`` the run continues from that checkpoint (``resume``: it, read already by
    ``training.configure``) or, killed before its first one, restarts from its own config.toml;
    otherwise a run directory that already holds a run is refused. The run directory is locked
    for the run's lifetime. Under torchrun every process calls it. ``model``: a ready module to
    train instead of building ``cfg.model`` (``cfg.model`` and ``cfg.model_kwargs`` then say how
    to rebuild it: ``package.module:name``); ``callbacks``: hooks
    (``training.hooks``) after mnistflow's own; ``loss_fn(logits, targets)``: replaces the
    (label-smoothed) cross-entropy.
    """
    check_run_inputs(cfg, check_model=model is None)  # a ready module's name is a label, not a model name
    callbacks = check_callbacks(callbacks)
    set_interop_threads(cfg.interop_threads)  # first: PyTorch fixes this pool at its first use
    env = dist.env_info()
    device = dist.gpus_for_processes(env, pick_device(cfg.device), cfg.device)
    if cfg.sync_bn and env.enabled and device.type != "cuda":
        raise MnistflowError("--sync-bn needs CUDA GPUs (PyTorch's SyncBatchNorm has no CPU kernel); "
                             "leave it out on CPUs")
    owned = env.enabled and not dist.initialized()
    info = dist.init(device.type)
    device = dist.device_for(info, device)
    kernels.reset_used()
    try:
        with log.recording() as warned, log.quiet(cfg.quiet), contextlib.ExitStack() as held, \
                kernels.switched_off(cfg.kernels == "off"):
            run = start(cfg, device, info, held, resume=resume, model=model, callbacks=callbacks,
                        loss_fn=None if loss_fn is None else _checked_loss(loss_fn))
            summary = finish(run, run_epochs(run), warned)
    except (TrainingInterrupted, RanksDisagree):  # every rank stops here: they can leave the group together
        if owned:
            dist.cleanup()
        raise
    except Exception as e:
        if info.enabled and not isinstance(e, MnistflowError) and dist.is_comm_failure(e):
            raise dist.comm_failure(info, e) from None
        raise
    if owned:
        dist.cleanup()
    return summary


@dataclass
class Clock:
    """The run's time: what is timed, what of it evaluations took, when the target was reached."""

    start: float  # after setup: the timed part of the run
    eval_s: float = 0.0  # seconds in validation/test passes (not training throughput)
    to_target: float | None = None  # seconds to --target-acc


def run_epochs(run: Run) -> Clock:
    """Epochs of steps, until the last step, the target, a signal or a hook's stop."""
    cfg, state, hooks = run.cfg, run.state, run.hooks
    state.stop(hooks.call("on_train_start", step=state.step, epoch=state.epoch, logs={
        "total_steps": run.total, "start_step": state.step, "steps_per_epoch": run.steps_per_epoch,
        "run_dir": str(run.dir.path), "config": configmod.to_dict(cfg)}))
    clock = Clock(time.perf_counter())
    if cfg.whiten and run.resume is None and not cfg.init_from:  # data-dependent init: training time
        run.console.message(whiten(run))
    window = LogWindow(run.device, run.train_loader)
    check_each_step = run.device.type == "cpu"  # a CPU scalar read is no device sync
    with run.signals, run.guard:
        while state.step < run.total and not state.stop_reason:
            run.train_loader.set_epoch(state.epoch, state.step_in_epoch)  # order: f(seed, epoch)
            run.model.train()
            window.new_epoch()
            for xb, yb in _batches(run.train_loader):
                lr = run.lr_at(state.step)
                loss, logits = run.step_fn(run.model, run.optimizer, run.amp, xb, yb, lr,
                                           label_smoothing=cfg.label_smoothing, loss_fn=run.loss_fn)
                if check_each_step and not math.isfinite(loss.item()):
                    raise nonfinite(state, lr, run.precision)
                window.add(loss, logits, yb)
                state.advance(yb.shape[0] * run.info.world_size)
                last, epoch_end = state.step >= run.total, state.step_in_epoch == run.steps_per_epoch
                logged = state.step % cfg.log_every == 0 or last or epoch_end
                logs = (window.read(state, lr, run.precision) if logged  # the one sync per interval
                        else {"epoch": state.epoch + state.step_in_epoch / run.steps_per_epoch, "lr": lr})
                with profiled("logging"):
                    state.stop(hooks.call("on_step_end", step=state.step, epoch=state.epoch, logs=logs))
                with profiled("step_hooks"):
                    if cfg.eval_every and state.step % cfg.eval_every == 0:
                        evaluate_now(run, clock)
                    if run.observers.profiler is not None:
                        run.observers.profiler.step(state.step)
                    if last or epoch_end:
                        break  # the epoch's end follows; after the last step, finish()
                    at_resumable_point(run)
                if state.stop_reason:
                    break
            if state.stop_reason == "interrupted":
                break
            if eval_due_at_epoch_end(run):
                evaluate_now(run, clock)
            if state.step_in_epoch >= run.steps_per_epoch:
                end_epoch(run, window)
            if state.step < run.total:
                at_resumable_point(run)
    if state.stop_reason == "interrupted":
        raise interrupted(run)
    return clock


def _batches(loader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The loader's batches, each fetch timed as the profiler's ``data`` phase."""
    batches = iter(loader)
    while True:
        with profiled("data"):
            batch = next(batches, None)
        if batch is None:
            return
        yield batch


def evaluate_now(run: Run, clock: Clock) -> None:
    """An evaluation at this step: of val (test when there is no val split), and with a target
    judged on test, of test too."""
    split = "val" if run.val_loader is not None else "test"
    evaluate_split(run, clock, split)
    cfg = run.cfg
    if cfg.target_acc is not None and clock.to_target is None and split != cfg.target_split:
        evaluate_split(run, clock, cfg.target_split)


def evaluate_split(run: Run, clock: Clock, split: str) -> None:
    """Evaluate ``split`` now, tell the hooks, and apply the rule: stop at the target accuracy."""
    state, t0 = run.state, time.perf_counter()
    # the plain module: under torch.compile the train/eval switch would recompile
    res = evaluate(run.raw_model, run.val_loader if split == "val" else run.test_loader, run.amp,
                   run.rec.num_classes, tta=run.cfg.tta, mirror=mirror_safe(run.rec.name))
    res.update(split=split, eval_s=time.perf_counter() - t0)
    clock.eval_s += res["eval_s"]
    state.metrics.update({f"{split}_acc": res["acc"], f"{split}_loss": res["loss"], f"{split}_step": state.step})
    if run.saver is not None:
        run.saver.note_eval(state.step, split, res["acc"])
    state.stop(run.hooks.call("on_validation_end", step=state.step, epoch=state.epoch,
                              logs={**res, f"{split}_acc": res["acc"], f"{split}_loss": res["loss"]}))
    cfg = run.cfg
    if (cfg.target_acc is not None and clock.to_target is None and split == cfg.target_split
            and res["acc"] >= cfg.target_acc):
        clock.to_target = time.perf_counter() - clock.start
        state.stop_reason = "target"


def eval_due_at_epoch_end(run: Run) -> bool:
    """Validate here (the end of an epoch, or the last step)? At each epoch's end, and at the last
    step when it is off the ``--eval-every`` grid; never once the run is stopping."""
    cfg, state = run.cfg, run.state
    if not cfg.validate or state.stop_reason:
        return False
    last = state.step >= run.total
    if cfg.eval_every:
        return last and state.step % cfg.eval_every != 0
    return last or state.step_in_epoch >= run.steps_per_epoch


def end_epoch(run: Run, window: LogWindow) -> None:
    """Tell the hooks an epoch ended (its training loss and accuracy, and the validation pass at
    its end if there was one), and count it."""
    state = run.state
    logs = {"epoch": state.epoch, "step": state.step, **window.epoch_means()}
    if state.metrics.get("val_step") == state.step:
        logs.update(val_loss=state.metrics["val_loss"], val_acc=state.metrics["val_acc"])
    state.stop(run.hooks.call("on_epoch_end", step=state.step, epoch=state.epoch, logs=logs))
    state.epoch += 1
    state.step_in_epoch = 0


def at_resumable_point(run: Run) -> None:
    """A point the run can continue from as if it never stopped (a step inside an epoch, an
    epoch's end after its evaluation): save when due; on a signal, save and stop."""
    state, saver, cfg = run.state, run.saver, run.cfg
    # One agreement per point: rank 0's save rules and any rank's signal (one that lands after it
    # stops the run at the next point, with its own save), so every rank takes part in each save.
    due = saver.due(state.step, cfg.checkpoint_every, cfg.checkpoint_secs) if saver is not None else ""
    signalled, reason = run.signals.agree(due, saved=saver is not None and saver.saved(state.step))
    if reason:
        save_checkpoint(run, reason)
    if signalled:
        state.stop_reason = "interrupted"


def save_checkpoint(run: Run, reason: str) -> None:
    """Every rank calls it at the same step: each hands rank 0 its RNG state (dropout continues
    each rank's own stream after a resume), and rank 0 writes the checkpoint."""
    states = dist.gather_to_primary(checkpoint_rng_state()) if run.info.enabled else None
    if run.saver is not None:
        run.saver.save(run.state.step, reason, states)


def interrupted(run: Run) -> TrainingInterrupted:
    """The run was signalled and rank 0 saved its checkpoint: close the writers and wait for every
    rank (none exits, and gets the job torn down, before the save)."""
    run.observers.close()
    dist.barrier()
    return TrainingInterrupted(run.signals.agreed, run.state.step,
                               run.saver.last_path if run.saver else None, run.dir.path,
                               rank=run.info.rank, world_size=run.info.world_size)


def finish(run: Run, clock: Clock, warned: list[str]) -> dict:
    """The end: the final test, the final checkpoint, the model, the summary."""
    state, saver = run.state, run.saver
    # The loss of each step is checked before its update: the last update's blow-up is caught
    # here, before a model no reader accepts is saved (what the run recorded stays).
    if not finite_weights(run.raw_model):
        raise nonfinite(state, run.lr_at(max(state.step - 1, 0)), run.precision, weights=True)
    if run.test_loader is not None and state.metrics.get("test_step") != state.step:
        evaluate_split(run, clock, "test")  # (a test pass of this very step counts)
    wall = time.perf_counter() - clock.start
    # Training throughput counts the steps only: wall time less evaluations and checkpoint writes.
    train_s = wall - clock.eval_s - (saver.save_s if saver is not None else 0.0)
    profiler = run.observers.profiler
    if profiler is not None:
        profiler.close()
        run.console.message(profiler.report or f"profiler: the run ended before step {profiler.stop}; "
                                                "nothing was recorded")
    if run.cfg.keep_checkpoints > 0:  # (every rank: each gives its RNG state)
        save_checkpoint(run, "final")
    in_sync = None
    if run.info.enabled:  # DDP keeps the ranks' parameters equal: check it, once, at the end
        in_sync = dist.params_in_sync(run.raw_model)
        if not in_sync:
            log.warn("the model's parameters differ between ranks at the end of training "
                     "(a non-deterministic model or a bug); rank 0's were saved")
    summary = _summary(run, clock, wall, train_s, in_sync)
    summary["warnings"] = warned  # the list itself: a warning of the steps below is in it too
    summary["kernels"] = kernels.used()
    summary["cuda_graph"] = isinstance(run.step_fn, GraphedStep) and run.step_fn.graph is not None
    if run.info.is_primary:  # before on_train_end: a hook may read or upload it (MLflowLogger)
        save_model(run.dir.model, run.raw_model, model_info(run))
    run.hooks.call("on_train_end", step=state.step, epoch=state.epoch, logs=summary)
    if run.info.is_primary:
        _write_outputs(run, summary)
    return summary


def _write_outputs(run: Run, summary: dict) -> None:
    """Rank 0: the graph in TensorBoard, summary.json, the end-of-run table."""
    tb = next((w for w in run.observers.writers if hasattr(w, "add_graph")), None)
    if tb is not None:
        tb.add_graph(run.raw_model.eval(), next(iter(run.val_loader or run.test_loader))[0][:1])
    run.observers.close()
    atomic_write_text(run.dir.summary, json.dumps(summary, indent=1) + "\n")
    run.console.message(end_of_run_table(summary, run.cfg.target_acc))
    if run.cfg.json:
        print(json.dumps(summary))


def _checked_loss(loss_fn: Callable) -> Callable:
    """``loss_fn`` whose first value is checked: a scalar floating-point tensor that has a
    gradient (anything else would fail in ``backward`` or ``.item()`` with a raw traceback)."""
    checked = False

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        nonlocal checked
        value = loss_fn(logits, targets)
        if not checked:
            what = (type(value).__name__ if not isinstance(value, torch.Tensor) else
                    f"a tensor of shape {tuple(value.shape)}" if value.numel() != 1 else
                    f"a {value.dtype} tensor" if not value.is_floating_point() else
                    "a tensor without a gradient (not computed from the logits)"
                    if torch.is_grad_enabled() and not value.requires_grad else None)
            if what is not None:
                name = getattr(loss_fn, "__qualname__", None) or type(loss_fn).__name__
                raise MnistflowError(f"loss {name}(logits, targets) must return a scalar floating-point "
                                     f"tensor computed from the logits; it returned {what}")
            checked = True
        return value

    return loss


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _summary(run: Run, clock: Clock, wall: float, train_s: float, ranks_in_sync: bool | None) -> dict:
    """The run's figures (every rank returns them; rank 0 writes summary.json)."""
    cfg, state = run.cfg, run.state
    start_samples = run.resume.payload["train_state"]["samples"] if run.resume is not None else 0
    samples = state.samples - start_samples
    return {
        "wall_s": round(wall, 3),
        "time_to_target_s": None if clock.to_target is None else round(clock.to_target, 3),
        "epochs": round(state.epoch + state.step_in_epoch / max(len(run.train_loader), 1), 3),
        "steps": state.step,
        "img_per_s": round(samples / wall, 1) if wall > 0 else None,
        "train_s": round(train_s, 3),
        "eval_s": round(clock.eval_s, 3),
        "train_img_per_s": round(samples / train_s, 1) if train_s > 0 else None,
        "data_wait_frac": round(run.train_loader.stats.wait_s / wall, 4) if wall > 0 else None,
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        **{k: round(v, 1) for k, v in gpu_peaks_mb(run.device).items()},
        "val_acc": state.metrics.get("val_acc"),
        "test_acc": state.metrics.get("test_acc"),
        "tta": cfg.tta,  # the accuracies above average over this many extra views
        "tta_mirror": bool(cfg.tta) and mirror_safe(run.rec.name),  # the first of them the mirror
        "stop_reason": state.stop_reason or ("max_steps" if cfg.max_steps and state.step >= cfg.max_steps
                                             else "epochs"),
        "model": cfg.model,
        "precision": run.precision,
        "device": str(run.device),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "world_size": run.info.world_size,
        "global_batch": cfg.batch_size,
        "ranks_in_sync": ranks_in_sync,
        "run_dir": str(run.dir.path),
        "resumed_from": None if run.resume is None else str(run.resume.path),
        "checkpoint": None if run.saver is None or run.saver.last_path is None else str(run.saver.last_path),
    }
