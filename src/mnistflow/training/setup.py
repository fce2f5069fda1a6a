"""Building a training run: the run directory, the data, the model, the optimizer, the
observers and hooks; everything ``training.loop`` needs before its first step (:func:`start`).

The resolved ``TrainConfig`` is never changed: what is decided at run time (the batch size of
``--batch-size auto``, the run directory, the device and precision) lives in :class:`Run`;
``Run.cfg`` is the configuration the run really uses (a new object, built with
``dataclasses.replace``), the one saved as ``config.toml``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from mnistflow import kernels
from mnistflow.artifacts import checkpoint
from mnistflow.artifacts.model_info import ModelInfo, info_from_records
from mnistflow.artifacts.rundir import RunDir
from mnistflow.artifacts.runlog import truncate_metrics
from mnistflow.core import openmp
from mnistflow.core.errors import MnistflowError, display
from mnistflow.core.log import note, warn
from mnistflow.data.augment import resolve_policy
from mnistflow.data.loader import StreamLoader, make_loader
from mnistflow.data.normalize import normalize
from mnistflow.data.prepare import prepare
from mnistflow.data.records import Records, open_records
from mnistflow.models import create_model
from mnistflow.models.ensemble import nets
from mnistflow.models.registry import check_trainable
from mnistflow.runtime import dist
from mnistflow.runtime.compat import set_recompile_logs
from mnistflow.runtime.compile_room import check_compile_room, compile_failure
from mnistflow.runtime.cpu import (
    busy_cores_elsewhere,
    default_threads,
    env_threads,
    flush_denormals,
    local_processes,
    set_threads,
    threads_for_load,
    tune_malloc,
    usable_cores,
)
from mnistflow.runtime.device import Amp, limit_gpu_memory, pick_precision
from mnistflow.training import config as configmod
from mnistflow.training import resume as resumemod
from mnistflow.training.agree import check_ranks_agree
from mnistflow.training.checkpointing import Saver, Signals
from mnistflow.training.claim import claim_run_dir
from mnistflow.training.config import TrainConfig, is_import_path
from mnistflow.training.engine import GraphedStep, TrainState, graph_blocker, train_step
from mnistflow.training.hooks import Hooks
from mnistflow.training.observe.console import ConsoleLogger
from mnistflow.training.observe.finalize import FinalizeGuard
from mnistflow.training.observe.memory import MemoryWatch, check_fits, estimate_training_mb
from mnistflow.training.observe.metrics import MetricsFile
from mnistflow.training.observe.starvation import StarvationWatch
from mnistflow.training.observe.tensorboard import TensorBoardLogger
from mnistflow.training.optim import build_optimizer, lr_factor, net_parameters
from mnistflow.training.resume import data_fingerprint
from mnistflow.training.user_model import build_from_path

WHITEN_IMAGES = 1000


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass(kw_only=True)
class Run:
    """Everything the loop uses, decided once before the first step (``start`` builds it)."""

    cfg: TrainConfig  # as the run uses it (``--batch-size auto`` resolved): config.toml
    rec: Records
    device: torch.device
    precision: str
    amp: Amp
    model: torch.nn.Module  # what trains (DDP / torch.compile wrapped)
    raw_model: torch.nn.Module  # the plain module: evaluation, checkpoints, the model file
    optimizer: torch.optim.Optimizer
    train_loader: object
    val_loader: object | None
    test_loader: object | None
    dir: RunDir
    info: dist.DistInfo
    resume: resumemod.Resume | None = None
    run_id: str = ""  # config.toml's and every checkpoint's: a checkpoint of another run is refused
    loss_fn: Callable | None = None  # a user's loss (logits, targets) -> scalar; None: cross-entropy
    # the loop's parts, wired by ``start``
    steps_per_epoch: int = 0  # the same on every rank, and for any world size
    total: int = 0  # steps of the whole run
    state: TrainState = field(default_factory=TrainState)
    console: ConsoleLogger | None = None
    observers: Observers | None = None
    hooks: Hooks | None = None
    guard: FinalizeGuard | None = None
    saver: Saver | None = None  # None: checkpoints off, or not rank 0
    signals: Signals | None = None
    step_fn: Callable = train_step

    def lr_at(self, step: int) -> float:
        """The learning rate of ``step``: a pure function of the step (resuming needs only it)."""
        cfg = self.cfg
        return cfg.lr * lr_factor(step, self.total, cfg.schedule, warmup=cfg.warmup,
                                  steps_per_epoch=self.steps_per_epoch, step_every=cfg.step_every,
                                  gamma=cfg.step_gamma)


def _threads_for_a_shared_machine() -> int | None:
    """The default thread count, lowered when other processes keep cores busy (a thread that
    shares a core with a busy process slows every op: BENCHMARKS.md, "A busy neighbour"). Only
    when no one chose (no ``--threads``, no ``$MNISTFLOW_THREADS``, not under torchrun, where the
    busy cores are the other ranks) and mnistflow did not see an idle machine when the command
    started (``core.openmp``). The count the run got is recorded: a replay uses it."""
    if env_threads() or local_processes() > 1:
        return None
    if openmp.chosen == "spin":  # mnistflow saw no other process running when it was imported
        return None
    n = default_threads()
    if n == 1:
        return None
    busy = busy_cores_elsewhere()
    fit = threads_for_load(n, usable_cores(), busy)
    if fit < n:
        warn(f"other processes keep {busy:.1f} of {usable_cores()} cores busy: training on {fit} "
             f"thread(s), not {n} (threads sharing a core with another process can make every step "
             f"several times slower); --threads {n} to insist")
    return fit


def _say_thread_change(resume: resumemod.Resume, world: int) -> None:
    """Runs on 1 and 2 threads differ in their last bits: a resume on another thread count than
    the run's so far (the user chose it) is said, once."""
    now = torch.get_num_threads()
    if resume.threads and resume.threads != now and resume.world_size == world:
        warn(f"the resumed part trains on {now} thread(s), the run so far on {resume.threads}: it will "
             f"not be bitwise identical to an uninterrupted run (leave --threads and $MNISTFLOW_THREADS "
             f"unset to keep {resume.threads})")


def _absolute_data(cfg: TrainConfig) -> str | None:
    """``cfg.data`` as the run records it: a path made absolute, ``$MNISTFLOW_DATA`` when it
    stood in for ``--data``; a known dataset's name as it is."""
    data = cfg.data
    if data is None and cfg.dataset is None:
        data = os.environ.get("MNISTFLOW_DATA") or None
    if data is None or not Path(data).exists():
        return data
    return os.path.abspath(data)


def check_input(model: torch.nn.Module, in_shape: tuple[int, int, int], num_classes: int,
                device: torch.device) -> None:
    """One forward of a dummy batch: a model that cannot take the data's input, or does not
    give one score per class, fails here with the shapes named (not with a raw traceback)."""
    shape = f"(N, {', '.join(map(str, in_shape))})"
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, *in_shape, device=device))
    except Exception as e:
        raise MnistflowError(f"model cannot take input of shape {shape}: "
                             f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    finally:
        model.train(was)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise MnistflowError(f"model output for input of shape {shape} is {got}; expected "
                             f"(N, {num_classes}): one score per class")
    if not out.is_floating_point():  # (integer scores have no gradient: a raw autograd error later)
        raise MnistflowError(f"model output for input of shape {shape} is a {out.dtype} tensor; expected "
                             "floating-point scores (logits)")


def _resolve_augment(cfg: TrainConfig, rec: Records, info: dist.DistInfo,
                     resume: resumemod.Resume | None) -> TrainConfig:
    """``--augment auto`` as the policy it means for these records (what config.toml and the
    summary record): the known dataset's own policy, ``shifts`` for other inputs (a note says
    so). A resumed run keeps the policy it was trained with."""
    if cfg.augment != "auto":
        return cfg
    if resume is not None:
        return dataclasses.replace(cfg, augment=resume.config.get("augment") or "off")
    policy, why = resolve_policy("auto", rec.name)
    if why and info.is_primary:
        note(why)
    return dataclasses.replace(cfg, augment=policy)


def _check_batch(batch: int, n_train: int, world: int, where: str) -> None:
    """The global batch fits the training set and splits evenly over the processes (each takes
    an equal share: DDP averages the processes' gradients as equals)."""
    if batch > n_train:
        raise MnistflowError(f"--batch-size {batch} is larger than the training set ({n_train:,} images)", where)
    if batch % world:
        lower, higher = batch - batch % world, batch + world - batch % world
        raise MnistflowError(f"--batch-size {batch} (the global batch) does not split evenly over {world} "
                             f"processes: give a multiple of {world}, e.g. "
                             + (f"{lower} or {higher}" if lower else f"{higher}"))


def _preflight_memory(cfg: TrainConfig, rec: Records, model: torch.nn.Module, world: int) -> None:
    """Refuse, before any work, a setting whose memory estimate would make the machine swap."""
    splits = [rec.split(s)[0] for s in ("train", "val", "test") if rec.has(s)]
    data_bytes = 0 if cfg.resident == "no" else sum(a.nbytes for a in splits) * (1 + rec.variants)
    opt_states = {"adam": 2, "adamw": 2, "adadelta": 2, "momentum": 1, "rmsprop": 1, "adagrad": 1}
    est = estimate_training_mb(model, rec.in_shape, cfg.batch_size // world, data_bytes,
                               opt_states.get(cfg.optimizer, 0))
    check_fits(est, cfg.memory_cap_mb, f"--batch-size {cfg.batch_size} with model {cfg.model}")


def build_run(cfg: TrainConfig, run_dir: Path, device: torch.device, info: dist.DistInfo,
              resume: resumemod.Resume | None = None, model: torch.nn.Module | None = None) -> Run:
    """Threads, data, model, optimizer, loaders, the run directory (rank 0). ``model``: a
    ready module to train instead of ``create_model(cfg.model)``."""
    cfg = dataclasses.replace(cfg, data=_absolute_data(cfg),  # config.toml works from any directory
                              run_dir=None if cfg.run_dir is None else os.path.abspath(run_dir))
    cfg = _machine(cfg, device, info, resume)
    precision = pick_precision(cfg.precision, device)
    cfg = dataclasses.replace(cfg, precision=precision)  # as resolved: a replay runs the same numerics
    with dist.local_rank_zero_first(info):  # one process per machine prepares the cache
        rec = open_records(prepare(cfg.dataset, cfg.data, quiet=cfg.quiet or cfg.json))
    check_ranks_agree(cfg, rec, device, info)  # the same settings and data on every rank, or one line
    configmod.check_target_split(cfg, rec.has, rec.path)
    n_train = rec.size(cfg.train_on)
    if cfg.batch_size != "auto":
        _check_batch(cfg.batch_size, n_train, info.world_size, rec.path)
    raw_model = _model(cfg, rec, device, info, model)
    if cfg.batch_size == "auto":
        cfg = _auto_batch(cfg, raw_model, rec, device, info, precision)
    cfg = _resolve_augment(cfg, rec, info, resume)
    _preflight_memory(cfg, rec, raw_model, info.world_size)
    optimizer = build_optimizer(cfg.optimizer, net_parameters(raw_model), cfg.lr, momentum=cfg.momentum,
                                nesterov=cfg.nesterov, weight_decay=cfg.weight_decay,
                                muon_lr=cfg.muon_lr, muon_momentum=cfg.muon_momentum,
                                bf16_products=precision == "bf16")
    model = raw_model
    if info.enabled:  # averages the gradients; broadcasts rank 0's parameters first
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:
        check_compile_room()  # a full cache or temporary directory: one line now, not a traceback later
        set_recompile_logs()  # a recompilation is reported with its reason
        model = torch.compile(model)
    train_loader, val_loader, test_loader = _loaders(cfg, rec, device, info)
    if resume is not None:
        resume.check(cfg, rec)
    run_id = resumemod.run_id_for(run_dir, resume)
    if info.is_primary:
        run_dir.mkdir(parents=True, exist_ok=True)
        configmod.save_toml(cfg, RunDir(run_dir).config, run_id)
    steps_per_epoch = len(train_loader)
    total = max(1, math.ceil(cfg.epochs * steps_per_epoch))
    total = min(total, cfg.max_steps) if cfg.max_steps else total
    return Run(cfg=cfg, rec=rec, device=device, precision=precision, amp=Amp.create(precision, device),
               model=model, raw_model=raw_model, optimizer=optimizer, train_loader=train_loader,
               val_loader=val_loader, test_loader=test_loader, dir=RunDir(run_dir), info=info,
               resume=resume, run_id=run_id, steps_per_epoch=steps_per_epoch,
               total=total, state=TrainState(total_steps=total))


def _machine(cfg: TrainConfig, device: torch.device, info: dist.DistInfo,
             resume: resumemod.Resume | None) -> TrainConfig:
    """This process's threads, GPU memory cap, allocator and denormals, as the run asks; ``cfg``
    with the thread count and native kernels it got (``fit`` switches them for the run), which
    decide the last bits of the weights (config.toml records them: a replay gets the same, on a
    busy machine too)."""
    threads = cfg.threads or (_threads_for_a_shared_machine() if device.type == "cpu" else 2)
    set_threads(threads)
    if resume is not None and info.is_primary:
        _say_thread_change(resume, info.world_size)
    limit_gpu_memory(cfg.gpu_memory_fraction, device)
    if device.type == "cpu":
        tune_malloc()
        flush_denormals()
    return dataclasses.replace(cfg, threads=torch.get_num_threads(),
                               kernels="auto" if kernels.enabled() else "off")


def _model(cfg: TrainConfig, rec: Records, device: torch.device, info: dist.DistInfo,
           model: torch.nn.Module | None) -> torch.nn.Module:
    """The model to train, on ``device``, checked against the data's shape and classes."""
    seed_everything(cfg.seed)
    name = cfg.model if model is None else type(model).__name__  # (a ready module's label is a path)
    if model is None:  # the same on every rank
        model = (build_from_path(cfg, rec.in_shape, rec.num_classes) if is_import_path(cfg.model)
                 else create_model(cfg.model, rec.in_shape, rec.num_classes))
    if info.rank > 0:
        torch.manual_seed(resumemod.rank_seed(cfg.seed, info.rank))
    memfmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    model = model.to(device=device, memory_format=memfmt)
    check_input(model, rec.in_shape, rec.num_classes, device)
    check_trainable(model, name)  # (after the shapes: a wrong output says more)
    if cfg.sync_bn and info.enabled:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if cfg.whiten:  # a model it cannot whiten fails here, before any work
        from mnistflow.models.whiten import first_conv

        first_conv(model, cfg.model)
    return model


def _auto_batch(cfg: TrainConfig, model: torch.nn.Module, rec: Records, device: torch.device,
                info: dist.DistInfo, precision: str) -> TrainConfig:
    """``--batch-size auto``: rank 0's choice for one process, times the processes (the global
    batch), for every rank."""
    from mnistflow.training.autobatch import choose_batch_size

    world = info.world_size
    choice = choose_batch_size(model, cfg, rec.in_shape, rec.num_classes, device, precision,
                               rec.size(cfg.train_on) // world) if info.is_primary else None
    batch, why = dist.broadcast_object(choice)
    if info.is_primary:
        note(f"batch size auto: {batch * world}" + (f" ({batch} per process x {world})" if world > 1 else "")
             + f" ({why})")
    return dataclasses.replace(cfg, batch_size=batch * world)


def _loaders(cfg: TrainConfig, rec: Records, device: torch.device, info: dist.DistInfo) -> tuple:
    """(train, val or None, test or None) loaders; evaluation shards count every image once (no
    padding; the sums are all-reduced), and validation never scores training images."""
    common = dict(device=device, channels_last=cfg.channels_last, resident=cfg.resident,
                  rank=info.rank, world_size=info.world_size)
    train = make_loader(rec, cfg.train_on, batch_size=cfg.batch_size // info.world_size, seed=cfg.seed,
                        drop_last=cfg.drop_last or cfg.compile,  # compiled: a short batch would recompile
                        augment=cfg.augment, **common)
    val = (make_loader(rec, "val", batch_size=cfg.eval_batch_size, train=False, pad=False, **common)
           if rec.has("val") and cfg.train_on == "train" else None)
    test = (make_loader(rec, "test", batch_size=cfg.eval_batch_size, train=False, pad=False, **common)
            if rec.has("test") else None)
    return train, val, test


def start(cfg: TrainConfig, device: torch.device, info: dist.DistInfo, held: contextlib.ExitStack, *,
          resume: resumemod.Resume | None = None, model: torch.nn.Module | None = None,
          callbacks: Sequence = (), loss_fn: Callable | None = None) -> Run:
    """The run, ready for its first step: its directory (owned until ``held`` closes), the
    checkpoint it continues from, data, model and optimizer (:func:`build_run`), the observers,
    hooks, saver and signals; then the start-up work outside the timer (``--init-from``, the
    warm-up, the restore of a checkpoint)."""
    resume, run_dir = claim_run_dir(cfg, info, held, resume)
    resumemod.remember_job_run(run_dir, info)  # a restart of this torchrun job continues it
    if resume is not None:
        resume.check(cfg)
    run = build_run(cfg, run_dir, device, info, resume, model)
    cfg, primary = run.cfg, info.is_primary
    run.loss_fn = loss_fn
    resume_step = (resume.step if resume is not None else 0) if cfg.resume else None
    if resume_step is not None and primary:
        truncate_metrics(run.dir.metrics, resume_step)
    run.console = ConsoleLogger(run.total, quiet=cfg.quiet or not primary)
    run.observers = obs = rank_zero_observers(run, run.console, resume_step)
    held.callback(obs.close)  # on a failure too, before the lock's release reads what they wrote
    run.guard = FinalizeGuard(run.raw_model)
    # the printing observers, the user's callbacks, then the guard (a model a callback changed is
    # named at once) and the writers (which so record what they return)
    run.hooks = Hooks([*obs.first, *callbacks, run.guard, *obs.writers])
    for cb in callbacks:  # a callback's close(): when the run ends, however it ends (a file, a tracker's run)
        if callable(getattr(cb, "close", None)):
            held.callback(cb.close)
    catch = cfg.keep_checkpoints > 0  # without checkpoints there is nothing to save on a signal
    run.signals = Signals(info, catch, quiet=not primary)
    if catch and primary:
        run.saver = Saver(checkpoint.CheckpointDir(run.dir.checkpoints, cfg.keep_checkpoints),
                          lambda rank_rng: payload(run, rank_rng), "val" if run.val_loader is not None else "test")
    for line in headline(run):
        run.console.message(line)
    run.step_fn = _step_fn(run)
    if cfg.init_from and resume is None:
        run.console.message(init_from(run))
    warm_up(run)
    if resume is not None:
        _restore(run, resume)
    return run


def _step_fn(run: Run) -> Callable:
    """The training step: replayed as a CUDA graph where ``--cuda-graphs auto`` and the run allow it."""
    cfg = run.cfg
    if cfg.cuda_graphs != "auto":
        return train_step
    blocker = graph_blocker(run.device, run.info.world_size, cfg.optimizer, run.precision, cfg.compile,
                            run.observers.profiler is not None)
    if blocker is None:
        return GraphedStep()
    if run.device.type == "cuda":
        note(f"--cuda-graphs auto: stepping eagerly ({blocker})")
    return train_step


def _restore(run: Run, resume: resumemod.Resume) -> None:
    """Continue from ``resume``: the states loaded strictly, and checkpoints newer than its step
    (saved by the interrupted process after it) moved aside."""
    info, state = run.info, run.state
    resume.restore(run.raw_model, run.optimizer, run.amp.scaler, state, run.cfg.seed, info.rank)
    run.console.message(f"resumed from {display(resume.path)}: step {state.step}, epoch {state.epoch} "
                        f"+ {state.step_in_epoch} batches"
                        + (f" (saved by {resume.world_size} process(es), continued by {info.world_size})"
                           if resume.world_size != info.world_size else ""))
    if run.saver is not None:
        moved = run.saver.ckpts.supersede_after(state.step)
        if moved:
            run.console.message(f"moved {len(moved)} checkpoint(s) newer than step {state.step} to "
                                f"{display(moved[0].parent)}")


def headline(run: Run) -> list[str]:
    """What the run is about to do (the console's first lines, each within 80 columns)."""
    cfg, info = run.cfg, run.info
    threads = torch.get_num_threads()
    lines = [f"training {cfg.model} on {run.rec.name} {cfg.train_on} ({run.rec.size(cfg.train_on):,} images, "
             f"{run.rec.num_classes} classes)",
             f"{run.device} {run.precision}{' channels_last' if cfg.channels_last else ''}, "
             f"{threads} thread{'s' if threads > 1 else ''}, batch {cfg.batch_size} x "
             f"{run.total:,} steps ({run.total / max(run.steps_per_epoch, 1):.2f} epochs)",
             f"run directory {display(run.dir.path)}"]
    if info.enabled:
        lines.append(f"data parallel: {info.world_size} processes ({info.backend}), the batch of "
                     f"{cfg.batch_size} split into {cfg.batch_size // info.world_size} per process: the "
                     "same steps and schedule as one process")
    return lines


def model_info(run: Run) -> ModelInfo:
    """What the model file records of this run: the model, the data, the latest evaluations."""
    info = info_from_records(run.cfg.model, run.rec, dict(run.state.metrics))
    if is_import_path(run.cfg.model):  # a user's model: how to rebuild it
        info = dataclasses.replace(info, factory=run.cfg.model, factory_kwargs=dict(run.cfg.model_kwargs or {}))
    return info


def payload(run: Run, rank_rng: list | None = None) -> dict:
    """Everything to continue from this step (``artifacts.checkpoint`` writes it). ``rank_rng``:
    every rank's RNG state, by rank (rank 0's is the payload's own)."""
    state = run.state
    ts = {"step": state.step, "epoch": state.epoch, "step_in_epoch": state.step_in_epoch,
          "samples": state.samples, "stop_reason": state.stop_reason, "metrics": dict(state.metrics),
          "world_size": run.info.world_size, "threads": torch.get_num_threads(), "run_id": run.run_id}
    out = checkpoint.capture(
        run.raw_model, run.optimizer, run.amp.scaler, ts,
        configmod.to_dict(dataclasses.replace(run.cfg, resume=None)),
        scheduler={"schedule": run.cfg.schedule, "step": state.step, "total_steps": state.total_steps,
                   "lr": run.lr_at(state.step), "note": "the learning rate is a pure function of the step"},
        data=data_fingerprint(run.rec), model_info=dataclasses.asdict(model_info(run)))
    if rank_rng is not None and len(rank_rng) > 1:
        out[checkpoint.RANK_RNG] = [None, *rank_rng[1:]]
    return out


@dataclass
class Observers:
    """What watches the run. ``first``: before a user's callbacks (they read or add to the
    logs, print); ``writers``: after them (so what a callback returned is in their record)."""

    first: list = field(default_factory=list)
    writers: list = field(default_factory=list)
    profiler: object | None = None

    def close(self) -> None:
        for w in self.writers:
            w.close()
        if self.profiler is not None:  # (stderr back to itself after a failure in the window)
            self.profiler.close()


def rank_zero_observers(run: Run, console: ConsoleLogger, resume_step: int | None) -> Observers:
    """The one place that decides what rank 0 alone does: metrics file, TensorBoard, MLflow,
    memory and input watches, profiler. Other ranks get none (and a quiet console)."""
    if not run.info.is_primary:
        return Observers()
    cfg = run.cfg
    metrics = MetricsFile(run.dir.metrics)
    tb = None
    if cfg.tensorboard:  # events after a resumed checkpoint's step are superseded
        tb = TensorBoardLogger(run.dir.tensorboard, purge_step=None if resume_step is None else resume_step + 1)
        tb.writer  # open it (and pay its import) before the timer starts
    profiler = None
    if cfg.profile_steps:
        from mnistflow.training.observe.profiler import ProfilerHook, parse_steps

        profiler = ProfilerHook(run.dir.profile, *parse_steps(cfg.profile_steps), run.device)
    mlflow = None
    if cfg.mlflow:
        from mnistflow.training.observe.mlflow_tracker import MLflowLogger

        mlflow = MLflowLogger(None if cfg.mlflow == "auto" else cfg.mlflow)
    # the memory watch first: it adds rss_mb to the logs the others print and write
    first = [MemoryWatch(run.device), StarvationWatch(queued=isinstance(run.train_loader, StreamLoader)),
             console]
    return Observers(first, [w for w in (metrics, tb, mlflow) if w is not None], profiler)


def warm_up(run: Run) -> None:
    """One throw-away forward/backward, and one evaluation forward, outside the timer:
    first-call costs (oneDNN kernel selection, lazy imports in the optimizer) are paid in
    setup, not charged to training."""
    xb = next(iter(run.train_loader))[0]  # the real batch shape: under --compile, no recompile later
    state = {k: v.clone() for k, v in run.raw_model.state_dict().items()}
    try:
        with run.amp.autocast():
            run.model(xb).float().sum().backward()  # under --compile: the compile
    except Exception as e:
        failure = compile_failure(e) if run.cfg.compile else None  # the disk filled meanwhile
        if failure is None:
            raise
        raise failure from None
    run.raw_model.load_state_dict(state)  # BN statistics back to their initial values
    run.optimizer.zero_grad(set_to_none=True)
    run.train_loader.stats.reset()
    eval_loader = run.val_loader or run.test_loader
    if eval_loader is not None:  # the evaluation's own kernels (its batch size, no autograd): ~30 ms
        run.raw_model.eval()
        with torch.inference_mode(), run.amp.autocast():
            run.raw_model(next(iter(eval_loader))[0])
        run.raw_model.train()


def whiten(run: Run) -> str:
    """``--whiten``: the first convolution from the patches of the first 1,000 training images
    (the same on every rank; rank 0's weights are broadcast all the same). What was set."""
    from mnistflow.models.whiten import first_conv, whiten_first_conv

    xb = normalize(run.rec.split("train")[0][:WHITEN_IMAGES], run.rec.mean, run.rec.std, run.device,
                   channels_last=run.cfg.channels_last)
    members = nets(run.raw_model)  # an ensemble: each member's first convolution
    said = [whiten_first_conv(m, xb) for m in members]  # every member, each the same way
    if run.info.enabled:
        for p in (p for m in members for p in first_conv(m)[1].parameters()):  # weight and bias
            torch.distributed.broadcast(p.data, 0)
    return said[0] + (f" (in each of {len(members)} members)" if len(members) > 1 else "")


def init_from(run: Run) -> str:
    """Start from the named arrays of an npz (``--init-from``, selected by ``--init-only``)."""
    from mnistflow.artifacts.npz import load_npz_into

    p = Path(run.cfg.init_from)
    if p.suffix.lower() != ".npz":
        raise MnistflowError("--init-from takes an npz of name -> array "
                             "(make one with: mnistflow export RUN --format npz)", p)
    report = load_npz_into(run.raw_model, p, only=run.cfg.init_only, flag="--init-only")
    if not report.loaded:
        if run.cfg.init_only and not report.missing and not report.mismatched:
            names = ", ".join(report.skipped[:4]) + (", ..." if len(report.skipped) > 4 else "")
            raise MnistflowError(f"--init-only {run.cfg.init_only!r} selects none of the model's parameters "
                                 f"(its names: {names})", p)
        raise MnistflowError(f"no parameter of the model was restored ({report.problems()})", p)
    return report.format()


def check_run_inputs(cfg: TrainConfig, *, check_model: bool = True) -> None:
    """What a ``TrainConfig`` cannot check by itself, before any work: the model (a registered
    name or a valid spec; ``check_model=False`` for a user's own module), the device, the
    ``--init-from`` file, ``--profile-steps``, and the environment variables that stand in for
    settings ($MNISTFLOW_THREADS, $MNISTFLOW_KERNELS...)."""
    from mnistflow.artifacts.model_file import import_factory
    from mnistflow.kernels import check_environment as check_kernels_environment
    from mnistflow.models import get_entry
    from mnistflow.models.spec import check_spec, looks_like_spec
    from mnistflow.runtime.cpu import check_environment
    from mnistflow.runtime.device import parse_device

    if check_model:
        if is_import_path(cfg.model):
            import_factory(cfg.model, None)  # not importable, or not a class or factory: one line
        elif looks_like_spec(cfg.model):
            check_spec(cfg.model)  # a zero or absurd kernel, stride or width: one line
        else:
            get_entry(cfg.model)  # unknown name: an error listing the known ones
    parse_device(cfg.device)  # a PyTorch device mnistflow does not support (meta, xla...)
    if cfg.init_from and not cfg.resume:  # (a resume does not read it: the checkpoint is the start)
        _check_init_from(Path(cfg.init_from))
    if cfg.profile_steps is not None:
        from mnistflow.training.observe.profiler import parse_steps

        parse_steps(cfg.profile_steps)
    if cfg.mlflow:
        from mnistflow.training.observe.mlflow_tracker import check_available

        check_available()  # not installed: one line now, not after the setup
    check_environment()
    check_kernels_environment()


def check_launch(cfg: TrainConfig, nproc: int, resume: resumemod.Resume | None = None) -> None:
    """What each of ``--nproc N``'s processes would refuse, checked once before they start: the
    collective timeout, the data (prepared here once: the processes then find it ready), the
    global batch's split over N, and the run directory (rank 0's claim, taken and released
    here, so a run directory in use or holding another run is named now)."""
    from mnistflow.core import log
    from mnistflow.training.claim import claim_run_dir

    dist.timeout_s()
    rec = open_records(prepare(cfg.dataset, _absolute_data(cfg), quiet=cfg.quiet or cfg.json))
    configmod.check_target_split(cfg, rec.has, rec.path)
    if cfg.batch_size != "auto":
        _check_batch(cfg.batch_size, rec.size(cfg.train_on), nproc, rec.path)
    with log.quiet(True), contextlib.ExitStack() as held:
        resume, _ = claim_run_dir(cfg, dist.DistInfo(), held, resume)
    if resume is not None:
        resume.check(_resolve_augment(cfg, rec, dist.DistInfo(), resume), rec)


def _check_init_from(p: Path) -> None:
    """``--init-from``: an existing npz file (checked before the run directory is made)."""
    if not p.exists():
        raise MnistflowError("--init-from: does not exist", p)
    if not p.is_file():
        raise MnistflowError("--init-from: is a directory, not a file" if p.is_dir() else
                             "--init-from: not a regular file", p)
    if p.suffix.lower() != ".npz":
        raise MnistflowError("--init-from takes an npz of name -> array "
                             "(make one with: mnistflow export RUN --format npz)", p)
