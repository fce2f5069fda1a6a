"""``mnistflow train``: records -> a trained model in a run directory.

    mnistflow train --recipe softmax                    # the tutorial's softmax regression
    mnistflow train --recipe seed-cnn --data data/mnist # the tutorial's deep CNN
    mnistflow train --model "conv5x5x32-relu,maxpool2,fc10" --epochs 1 --json

    mnistflow train --model fast --run-dir runs/a --checkpoint-every 200   # then, after a crash:
    mnistflow train --resume --run-dir runs/a     # continues bitwise exactly (CPU, same seed)

    torchrun --standalone --nproc_per_node 2 -m mnistflow train --recipe fast   # data parallel
    mnistflow train --recipe fast --nproc 2                                      # the same

This module is the training loop: :func:`fit` reads top to bottom and holds every "when" rule
(when to log, evaluate, checkpoint, and stop: epochs, ``--max-steps``, ``--target-acc``, a
signal, a hook's ``StopTraining``). Building the run is ``training.setup``; resuming is
``training.resume``; one step is ``training.engine``; the hooks are ``training.hooks``.

Run directory (``mnistflow.artifacts.rundir``): config.toml, metrics.jsonl, tb/, model.safetensors,
summary.json, checkpoints/. The timer starts after setup (data on the device, model built,
writers open) and stops after the final test evaluation. SIGINT/SIGTERM save a checkpoint at
the end of the current step and exit (130/143).

Under torchrun (see ``mnistflow.runtime.dist``) every rank runs ``fit``: the model is wrapped in
DistributedDataParallel, each rank reads its shard, and rank 0 alone has the console, files
and checkpoints (``setup.rank_zero_observers``). ``--batch-size`` is per process; the global
batch is batch size x world size. A signal to any rank stops all of them at the same step.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from mnistflow import kernels
from mnistflow.artifacts import checkpoint
from mnistflow.artifacts.model_file import save_model
from mnistflow.artifacts.model_info import ModelInfo, info_from_records
from mnistflow.artifacts.runlog import end_of_run_table
from mnistflow.core import log
from mnistflow.core.errors import MnistflowError, display
from mnistflow.core.fsutil import atomic_write_text
from mnistflow.data.augment import mirror_safe
from mnistflow.models.evaluate import evaluate
from mnistflow.runtime import dist
from mnistflow.runtime.cpu import set_interop_threads
from mnistflow.runtime.device import pick_device
from mnistflow.training import config as configmod
from mnistflow.training.checkpointing import (
    Interrupt,
    Saver,
    SignalHandlers,
    TrainingInterrupted,
)
from mnistflow.training.config import TrainConfig
from mnistflow.training.engine import (
    GraphedStep,
    LogWindow,
    TrainState,
    finite_weights,
    graph_blocker,
    nonfinite,
    profiled,
    train_step,
)
from mnistflow.training.hooks import call
from mnistflow.training.observe.console import ConsoleLogger
from mnistflow.training.observe.finalize import FinalizeGuard
from mnistflow.training.observe.memory import gpu_peaks_mb
from mnistflow.training.optim import float32_rate, lr_factor
from mnistflow.training.resume import Resume, data_fingerprint, truncate_metrics
from mnistflow.training.setup import (
    Run,
    build_run,
    decide_run,
    init_from,
    rank_zero_observers,
    resolve_config,
    warm_up,
    whiten,
)

__all__ = ["fit", "train", "resolve_config", "TrainingInterrupted"]


def train(config: str | Path | None = None, **overrides) -> dict:
    """Python twin of ``mnistflow train``: ``train(recipe="seed-cnn", epochs=2)``."""
    return fit(resolve_config(config, **overrides))


def fit(cfg: TrainConfig, *, model: torch.nn.Module | None = None, model_factory: dict | None = None,
        callbacks: Sequence = (), loss_fn: Callable | None = None) -> dict:
    """Train as configured; returns the run summary (the ``--json`` object). ``cfg`` is not changed.

    With ``cfg.resume`` (``latest`` or a path) the run continues from a checkpoint (or, killed
    before its first one, restarts from its own config.toml); otherwise a run directory that
    already holds a run is refused (nothing is overwritten). The run directory is locked for
    the run's lifetime: a second training on it fails at once. Under
    torchrun every process calls it (see the module docstring). ``model``: a ready module to
    train instead of ``cfg.model``'s, ``model_factory`` how to rebuild it ({"factory":
    "pkg.mod:name", "kwargs": {...}}, recorded in the model file); ``callbacks``: hooks
    (``training.hooks``) after mnistflow's own; ``loss_fn(logits, targets)``: replaces the
    (label-smoothed) cross-entropy.
    """
    # a ready module's name is a label (its import path), not a registered model or a spec
    configmod.validate(cfg, check_model=model is None)
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
    if loss_fn is not None:
        loss_fn = _checked_loss(loss_fn)
    try:
        with log.recording() as warned, log.quiet(cfg.quiet), contextlib.ExitStack() as held:
            summary = _fit(cfg, device, info, warned, held, model, model_factory, list(callbacks), loss_fn)
    except TrainingInterrupted:
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


def _fit(cfg: TrainConfig, device: torch.device, info: dist.DistInfo, warned: list[str],
         held: contextlib.ExitStack, model, model_factory, callbacks: list, loss_fn) -> dict:
    primary = info.is_primary
    # --- setup: where the run goes (owned until ``held`` closes), what it continues from ------
    # A new run that fails before it recorded a step leaves its directory as it was (``RunLock``:
    # what it wrote is removed when ``held`` closes on the error): the same command runs again.
    resume_path, run_dir = decide_run(cfg, info, held)
    resume = Resume.open(resume_path, cfg, info.world_size) if resume_path is not None else None
    run = build_run(cfg, run_dir, device, info, resume, model, model_factory)
    cfg = run.cfg  # as the run uses it (batch size decided); the caller's object is untouched
    steps_per_epoch = len(run.train_loader)  # the same on every rank, and for any world size
    total = max(1, math.ceil(cfg.epochs * steps_per_epoch))
    if cfg.max_steps:
        total = min(total, cfg.max_steps)

    def lr_at(step: int) -> float:  # a pure function of the step: resuming needs only the step
        return float32_rate(cfg.lr * lr_factor(step, total, cfg.schedule, warmup=cfg.warmup,
                                               steps_per_epoch=steps_per_epoch, step_every=cfg.step_every,
                                               gamma=cfg.step_gamma))

    start_step = resume.step if resume is not None else 0
    if cfg.resume and primary:
        truncate_metrics(run.dir.metrics, start_step)
    console = ConsoleLogger(total, quiet=cfg.quiet or not primary)
    obs = rank_zero_observers(run, console, start_step if cfg.resume else None)
    held.callback(obs.close)  # on a failure too, before the lock's release reads what they wrote (twice: no-op)
    guard = FinalizeGuard(run.raw_model)
    # the printing observers, the user's callbacks, then the writers (which so record what they return)
    hooks = [*obs.first, guard, *callbacks, *obs.writers]
    state = TrainState(total_steps=total)
    # Signals: without checkpoints there is nothing to save, so they keep their default
    # behaviour. Under torchrun the handler's flag (pending) is agreed on by all ranks first.
    catch_signals = cfg.keep_checkpoints > 0
    interrupt = Interrupt()
    pending = Interrupt() if catch_signals and info.enabled else interrupt
    saver = Saver(checkpoint.CheckpointDir(run.dir.checkpoints, cfg.keep_checkpoints),
                  lambda: _payload(run, state, lr_at), "val" if run.val_loader is not None else "test") \
        if catch_signals and primary else None
    for line in _headline(run, total):
        console.message(line)
    if cfg.init_from and resume is None:
        console.message(init_from(run))
    warm_up(run)
    if resume is not None:
        resume.restore(run.raw_model, run.optimizer, run.amp.scaler, state, cfg.seed, info.rank)
        console.message(f"resumed from {display(resume.path)}: step {state.step}, epoch {state.epoch} "
                        f"+ {state.step_in_epoch} batches"
                        + (f" (saved by {resume.world_size} process(es), continued by {info.world_size})"
                           if resume.world_size != info.world_size else ""))
    if saver is not None and cfg.resume:
        moved = saver.ckpts.supersede_after(state.step)
        if moved:
            console.message(f"moved {len(moved)} checkpoint(s) newer than step {state.step} to "
                            f"{display(moved[0].parent)}")

    def stop(reason: str | None) -> None:  # the first reason to stop wins (a signal: always)
        if reason and not state.stop_reason:
            state.stop_reason = reason

    stop(call(hooks, "on_train_start", {"total_steps": total, "start_step": state.step,
                                        "steps_per_epoch": steps_per_epoch,
                                        "run_dir": str(run.dir.path), "config": configmod.to_dict(cfg)}))
    start_samples = state.samples
    clock = _Clock(time.perf_counter())
    if cfg.whiten and resume is None and not cfg.init_from:  # data-dependent init: training time
        console.message(whiten(run))

    def validate(split: str | None = None) -> dict:
        """An evaluation at this step, its hooks, and the rule: stop at the target accuracy."""
        split = split or ("val" if run.val_loader is not None else "test")
        t0 = time.perf_counter()
        # the plain module: under torch.compile the train/eval switch would recompile
        res = evaluate(run.raw_model, run.val_loader if split == "val" else run.test_loader, run.amp,
                       run.rec.num_classes, tta=cfg.tta, mirror=mirror_safe(run.rec.name))
        res.update(split=split, eval_s=time.perf_counter() - t0)
        clock.eval_s += res["eval_s"]
        state.metrics.update({f"{split}_acc": res["acc"], f"{split}_loss": res["loss"],
                              f"{split}_step": state.step})
        if saver is not None:
            saver.note_eval(state.step, split, res["acc"])
        stop(call(hooks, "on_validation_end", state.step,
                  {**res, f"{split}_acc": res["acc"], f"{split}_loss": res["loss"]}))
        if cfg.target_acc is not None and clock.to_target is None:
            if split == "val" and cfg.target_split == "test":
                validate("test")  # the target is on test: measure it at this step too
            elif split == cfg.target_split and res["acc"] >= cfg.target_acc:
                clock.to_target = time.perf_counter() - clock.start
                state.stop_reason = "target"
        return res

    def resumable_point() -> None:
        """A point the run can continue from as if it never stopped (a step inside an epoch,
        an epoch's end after its evaluation): save when due; on a signal, save and stop."""
        if pending is not interrupt:  # under torchrun: a signal to any rank stops every rank here
            signum = dist.max_over_ranks(pending.signum)
            if signum and not interrupt.signum:
                interrupt.signum = signum
        # Read once: a signal that lands after this line stops the run at the next point, with
        # its own save (read twice, one landing in between stopped the run here unsaved).
        signalled = interrupt.signum
        if saver is not None:
            reason = ("interrupt" if signalled else
                      "every" if cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0 else
                      "secs" if cfg.checkpoint_secs and saver.seconds_since_save() >= cfg.checkpoint_secs else
                      "best" if saver.is_new_best(state.step) else "")
            if reason and not saver.saved(state.step):
                saver.save(state.step, reason)
        if signalled:
            state.stop_reason = "interrupted"

    # --- the loop -------------------------------------------------------------------------
    window = LogWindow(run.device, run.train_loader)
    check_each_step = run.device.type == "cpu"  # a CPU scalar read is no device sync
    step_fn = train_step
    if cfg.cuda_graphs == "auto":
        blocker = graph_blocker(run.device, info.world_size, cfg.optimizer, run.precision, cfg.compile,
                                obs.profiler is not None)
        if blocker is None:
            step_fn = GraphedStep()
        elif run.device.type == "cuda":
            log.note(f"--cuda-graphs auto: stepping eagerly ({blocker})")
    world = info.world_size
    signals = SignalHandlers(pending, quiet=not primary) if catch_signals else contextlib.nullcontext()
    with signals, guard:
        while state.step < total and not state.stop_reason:
            run.train_loader.set_epoch(state.epoch, state.step_in_epoch)  # order: f(seed, epoch)
            run.model.train()
            window.restart()
            batches = iter(run.train_loader)
            while True:
                with profiled("data"):
                    batch = next(batches, None)
                if batch is None:
                    break
                xb, yb = batch
                lr = lr_at(state.step)
                loss, logits = step_fn(run.model, run.optimizer, run.amp, xb, yb, lr,
                                          label_smoothing=cfg.label_smoothing, loss_fn=loss_fn)
                if check_each_step and not math.isfinite(loss.item()):
                    raise nonfinite(state, lr, run.precision)
                window.add(loss, logits, yb)
                state.step += 1
                state.step_in_epoch += 1
                state.samples += yb.shape[0] * world
                last, epoch_end = state.step >= total, state.step_in_epoch == steps_per_epoch
                if state.step % cfg.log_every == 0 or last or epoch_end:  # the one sync per interval
                    logs = window.read(state, lr, run.precision)
                    with profiled("logging"):
                        stop(call(hooks, "on_step_end", state.step, logs))
                with profiled("step_hooks"):
                    if cfg.eval_every and state.step % cfg.eval_every == 0:
                        validate()
                    if obs.profiler is not None:
                        obs.profiler.step(state.step)
                    if last or epoch_end:
                        break  # the epoch's end, below; the last step: the final save
                    resumable_point()
                if state.stop_reason:
                    break
            # --- the epoch's end (or a stop inside it) ---
            if state.stop_reason == "interrupted":
                break
            epoch_done = state.step_in_epoch >= steps_per_epoch
            if cfg.validate and not state.stop_reason and (
                    (not cfg.eval_every and (epoch_done or state.step >= total))
                    or (cfg.eval_every and state.step >= total and state.step % cfg.eval_every)):
                validate()  # each epoch's end, and the last step when it is off the --eval-every grid
            if epoch_done:
                stop(call(hooks, "on_epoch_end", state.epoch, {"epoch": state.epoch, "step": state.step}))
                state.epoch += 1
                state.step_in_epoch = 0
            if state.step < total:
                resumable_point()
    if state.stop_reason == "interrupted":
        obs.close()
        dist.barrier()  # rank 0 has saved: no rank exits (and gets the job torn down) before
        raise TrainingInterrupted(interrupt.signum, state.step, saver.last_path if saver else None,
                                  run.dir.path, rank=info.rank, world_size=world)

    # --- the end: the test, the final checkpoint, the model, the summary ---------------------
    # The loss of each step is checked before its update: the last update's blow-up is caught
    # here, before a model no reader accepts is saved (what the run recorded stays, as after a NaN loss).
    if not finite_weights(run.raw_model):
        raise nonfinite(state, lr_at(max(state.step - 1, 0)), run.precision, weights=True)
    if run.test_loader is not None and state.metrics.get("test_step") != state.step:
        validate("test")  # (a test pass of this very step counts: no val split, or a target on test)
    wall = time.perf_counter() - clock.start
    # Training throughput counts the steps only: wall time less evaluations and checkpoint writes.
    train_s = wall - clock.eval_s - (saver.save_s if saver is not None else 0.0)
    if obs.profiler is not None:
        obs.profiler.close()
        console.message(obs.profiler.report or f"profiler: the run ended before step {obs.profiler.stop}; "
                                                "nothing was recorded")
    if saver is not None:
        saver.save(state.step, "final")
    in_sync = None
    if info.enabled:  # DDP keeps the ranks' parameters equal: check it, once, at the end
        in_sync = dist.params_in_sync(run.raw_model)
        if not in_sync:
            log.warn("the model's parameters differ between ranks at the end of training "
                     "(a non-deterministic model or a bug); rank 0's were saved")
    samples = state.samples - start_samples
    summary = _summary(run, state, clock, wall, train_s, samples, in_sync,
                       checkpoint_path=saver.last_path if saver is not None else None)
    summary["warnings"] = warned  # the list itself: a warning of the steps below is in it too
    summary["kernels"] = kernels.used()
    summary["cuda_graph"] = isinstance(step_fn, GraphedStep) and step_fn.graph is not None  # replayed
    call(hooks, "on_train_end", summary)
    if primary:
        save_model(run.dir.model, run.raw_model, _model_info(run, state))
        tb = next((w for w in obs.writers if hasattr(w, "add_graph")), None)
        if tb is not None:
            tb.add_graph(run.raw_model.eval(), next(iter(run.val_loader or run.test_loader))[0][:1])
        obs.close()
        atomic_write_text(run.dir.summary, json.dumps(summary, indent=1) + "\n")
        console.message(end_of_run_table(summary, cfg.target_acc))
        if cfg.json:
            print(json.dumps(summary))
    return summary


def _headline(run: Run, total: int) -> list[str]:
    """What the run is about to do (the console's first lines)."""
    cfg, info = run.cfg, run.info
    lines = [f"training {cfg.model} on {run.rec.name} {cfg.train_on} ({run.rec.size(cfg.train_on):,} images, "
             f"{run.rec.num_classes} classes) | {run.device} {run.precision}"
             f"{' channels_last' if cfg.channels_last else ''} threads={torch.get_num_threads()} | "
             f"batch {cfg.batch_size * info.world_size} x {total} steps | {run.dir.path}"]
    if info.enabled:
        lines.append(f"data parallel: {info.world_size} processes ({info.backend}), batch "
                     f"{cfg.batch_size} per process x {info.world_size} = global batch "
                     f"{cfg.batch_size * info.world_size}")
    return lines


@dataclasses.dataclass
class _Clock:
    start: float  # after setup: the timed part of the run
    eval_s: float = 0.0  # seconds in validation/test passes (not training throughput)
    to_target: float | None = None  # seconds to --target-acc


def _model_info(run: Run, state: TrainState) -> ModelInfo:
    info = info_from_records(run.cfg.model, run.rec, dict(state.metrics))
    if run.model_factory:
        info = dataclasses.replace(info, factory=run.model_factory["factory"],
                                   factory_kwargs=dict(run.model_factory.get("kwargs") or {}))
    return info


def _payload(run: Run, state: TrainState, lr_at) -> dict:
    """Everything to continue from this step (``artifacts.checkpoint`` writes it)."""
    ts = {"step": state.step, "epoch": state.epoch, "step_in_epoch": state.step_in_epoch,
          "samples": state.samples, "stop_reason": state.stop_reason, "metrics": dict(state.metrics),
          "world_size": run.info.world_size, "threads": torch.get_num_threads()}
    return checkpoint.capture(
        run.raw_model, run.optimizer, run.amp.scaler, ts,
        configmod.to_dict(dataclasses.replace(run.cfg, resume=None)),
        scheduler={"schedule": run.cfg.schedule, "step": state.step, "total_steps": state.total_steps,
                   "lr": lr_at(state.step), "note": "the learning rate is a pure function of the step"},
        data=data_fingerprint(run.rec), model_info=dataclasses.asdict(_model_info(run, state)))


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _summary(run: Run, state: TrainState, clock: _Clock, wall: float, train_s: float, samples: int,
             ranks_in_sync: bool | None, checkpoint_path: Path | None) -> dict:
    """The run's figures (every rank returns them; rank 0 writes summary.json)."""
    cfg = run.cfg
    return {
        "wall_s": round(wall, 3),
        "time_to_target_s": None if clock.to_target is None else round(clock.to_target, 3),
        "epochs": round(state.epoch + state.step_in_epoch / max(len(run.train_loader), 1), 3),
        "steps": state.step,
        "img_per_s": round(samples / wall, 1) if wall > 0 else None,
        "train_s": round(train_s, 3),
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
        "global_batch": cfg.batch_size * run.info.world_size,
        "ranks_in_sync": ranks_in_sync,
        "run_dir": str(run.dir.path),
        "resumed_from": None if run.resume is None else str(run.resume.path),
        "checkpoint": None if checkpoint_path is None else str(checkpoint_path),
    }
