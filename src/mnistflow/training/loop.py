"""``mnistflow train``: records -> a trained model in a run directory.

    mnistflow train --recipe softmax                    # the tutorial's softmax regression
    mnistflow train --recipe seed-cnn --data data/mnist # the tutorial's deep CNN
    mnistflow train --model "conv5x5x32-relu,maxpool2,fc10" --epochs 1 --json

    mnistflow train --model fast --run-dir runs/a --checkpoint-every 200   # then, after a crash:
    mnistflow train --resume --run-dir runs/a     # continues bitwise exactly (CPU, same seed)

    torchrun --standalone --nproc_per_node 2 -m mnistflow train --recipe fast   # data parallel
    mnistflow train --recipe fast --nproc 2                                      # the same

Run directory (``runs/<name>/``): config.toml, metrics.jsonl, tb/ (TensorBoard), model.safetensors,
summary.json, checkpoints/ (see ``mnistflow.artifacts.checkpoint``). The timer starts after setup (data on
the device, model built, writers open) and stops after the final test evaluation.

Resuming needs only the checkpoint: the learning rate is a pure function of the step and the
data order a pure function of (seed, epoch), so the loop continues at (epoch, step in epoch)
with the model, optimizer, scaler and RNG states loaded strictly into the live objects.
SIGINT/SIGTERM save a checkpoint at the end of the current step and exit (130/143).

Under torchrun (see ``mnistflow.runtime.dist``) every rank runs ``fit``: the model is wrapped in
DistributedDataParallel, each rank reads its shard, and ``rank_zero_hooks`` gives rank 0
alone the console, files and checkpoints. ``--batch-size`` is per process; the global batch
is batch size x world size. A signal to any rank stops all of them at the same step.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mnistflow.artifacts import checkpoint
from mnistflow.training.checkpointing import Checkpointer, Interrupt
from mnistflow.artifacts.model_file import (
    MODEL_FILE,
    ModelInfo,
    info_from_records,
    save_model,
)
from mnistflow.core.errors import MnistflowError, display
from mnistflow.core.log import warn
from mnistflow.data.loader import make_loader, normalized_batch
from mnistflow.data.records import Records, open_records
from mnistflow.models import create_model
from mnistflow.runtime import dist
from mnistflow.runtime.cpu import (
    busy_cores_elsewhere,
    default_threads,
    flush_denormals,
    set_interop_threads,
    set_threads,
    threads_for_load,
    tune_malloc,
    usable_cores,
)
from mnistflow.runtime.device import Amp, limit_gpu_memory, pick_device, pick_precision
from mnistflow.training import config as configmod
from mnistflow.training.config import TrainConfig
from mnistflow.training.engine import TrainState, call, evaluate, train_one_epoch
from mnistflow.training.observe.console import ConsoleLogger
from mnistflow.training.observe.finalize import FinalizeGuard
from mnistflow.training.observe.memory import (
    MemoryWatch,
    check_fits,
    estimate_training_mb,
    gpu_peaks_mb,
)
from mnistflow.training.observe.metrics import MetricsFile
from mnistflow.training.observe.starvation import StarvationWatch
from mnistflow.training.observe.tensorboard import TensorBoardLogger
from mnistflow.training.optim import build_optimizer, lr_factor


def resolve_records(cfg: TrainConfig) -> Records:
    """The record set to train on: a records dir, or raw data prepared into the cache once."""
    from mnistflow.data.prepare import prepare

    quiet = cfg.quiet or cfg.json
    path = prepare(cfg.dataset, cfg.data, quiet=quiet)
    return open_records(path)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rank_seed(seed: int, rank: int, step: int = 0) -> int:
    """The torch seed of rank ``rank`` > 0 after the model is built (dropout differs per rank;
    rank 0 keeps the single process's stream). ``step``: the step a resume starts at."""
    return (seed * 1_000_003 + rank * 7_919 + step * 104_729) % 2**63


def default_run_dir(cfg: TrainConfig) -> Path:
    name = (cfg.recipe or cfg.model).replace("/", "_")
    if "," in name:
        name = "spec"
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


@dataclass
class PeriodicEval:
    """Validation every ``every`` steps (or at epoch ends), and the early stop at the target."""

    run: "Run"
    every: int | None

    def on_step_end(self, step: int, state: TrainState) -> None:
        if self.every and step % self.every == 0:
            self.run.validate(step, state)


@dataclass
class Run:
    """Everything ``fit`` wires together; methods are the steps of the run."""

    cfg: TrainConfig
    rec: Records
    device: torch.device
    precision: str
    model: torch.nn.Module
    raw_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train_loader: object
    val_loader: object | None
    test_loader: object | None
    amp: Amp
    run_dir: Path
    info: dist.DistInfo = field(default_factory=dist.DistInfo)
    hooks: list = field(default_factory=list)
    console: ConsoleLogger | None = None
    t_start: float = 0.0
    time_to_target: float | None = None
    eval_s: float = 0.0  # seconds in validation/test passes (not training throughput)

    def validate(self, step: int, state: TrainState, split: str | None = None) -> dict:
        split = split or ("val" if self.val_loader is not None else "test")
        loader = self.val_loader if split == "val" else self.test_loader
        t0 = time.perf_counter()
        # The plain module: under torch.compile the train/eval switch would recompile.
        res = evaluate(self.raw_model, loader, self.amp, self.rec.num_classes, tta=self.cfg.tta)
        res.update(split=split, eval_s=time.perf_counter() - t0)
        self.eval_s += res["eval_s"]
        state.metrics[f"{split}_acc"] = res["acc"]
        state.metrics[f"{split}_loss"] = res["loss"]
        state.metrics[f"{split}_step"] = step
        call(self.hooks, "on_eval", step, res)
        cfg = self.cfg
        if cfg.target_acc is not None and self.time_to_target is None:
            tsplit = cfg.target_split
            if tsplit != split and split == "val":  # target on test: measure test too
                return self.validate(step, state, "test") and res
            if split == tsplit and res["acc"] >= cfg.target_acc:
                self.time_to_target = time.perf_counter() - self.t_start
                state.stop, state.stop_reason = True, "target"
        return res


def _threads_for_a_shared_machine() -> int | None:
    """The default thread count, lowered when other processes keep cores busy (only when no
    one chose: no ``--threads``, no ``$MNISTFLOW_THREADS``, not under torchrun, where the
    busy cores are the other ranks)."""
    if os.environ.get("MNISTFLOW_THREADS") or int(os.environ.get("LOCAL_WORLD_SIZE", 1) or 1) > 1:
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


def _build(cfg: TrainConfig, run_dir: Path, device: torch.device, info: dist.DistInfo) -> Run:
    threads = set_threads(cfg.threads or _threads_for_a_shared_machine()) if device.type == "cpu" \
        else set_threads(cfg.threads or 2)
    limit_gpu_memory(cfg.gpu_memory_fraction, device)
    if device.type == "cpu":
        tune_malloc()
        flush_denormals()
    precision = pick_precision(cfg.precision, device)
    with dist.local_rank_zero_first(info):  # one process per machine prepares the cache
        rec = resolve_records(cfg)
    h, w, c = rec.shape
    n_train = rec.size(cfg.train_on)
    if cfg.batch_size != "auto" and cfg.batch_size > n_train:
        raise MnistflowError(f"--batch-size {cfg.batch_size} is larger than the training set "
                             f"({n_train:,} images)", rec.path)
    seed_everything(cfg.seed)
    model = create_model(cfg.model, (c, h, w), rec.num_classes)  # the same on every rank
    if info.rank > 0:
        torch.manual_seed(rank_seed(cfg.seed, info.rank))
    memfmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    model = model.to(device=device, memory_format=memfmt)
    if cfg.sync_bn and info.enabled:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    raw_model = model
    if cfg.batch_size == "auto":
        from mnistflow.training.autobatch import choose_batch_size

        choice = choose_batch_size(model, cfg, (c, h, w), rec.num_classes, device, precision, n_train) \
            if info.is_primary else None
        cfg.batch_size, why = dist.broadcast_object(choice)  # every rank trains with rank 0's choice
        if info.is_primary and not cfg.quiet:
            print(f"batch size auto: {cfg.batch_size} ({why})")
    if cfg.whiten:  # a model it cannot whiten fails here, before any work
        from mnistflow.models.whiten import first_conv

        first_conv(model, cfg.model)
    _preflight_memory(cfg, rec, model, (c, h, w))
    optimizer = build_optimizer(cfg.optimizer, model.parameters(), cfg.lr, momentum=cfg.momentum,
                                nesterov=cfg.nesterov, weight_decay=cfg.weight_decay,
                                muon_lr=cfg.muon_lr, muon_momentum=cfg.muon_momentum,
                                bf16_products=precision == "bf16")
    if info.enabled:  # averages the gradients; broadcasts rank 0's parameters first
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    drop_last = cfg.drop_last
    if cfg.compile:
        torch._logging.set_logs(recompiles=True)  # a recompilation is reported with its reason
        model = torch.compile(model)
        drop_last = True  # a short last batch would recompile
    delay = float(os.environ.get("MNISTFLOW_INJECT_DATA_DELAY", 0) or 0)  # tests: a slow reader
    common = dict(device=device, channels_last=cfg.channels_last, resident="no" if delay else cfg.resident,
                  rank=info.rank, world_size=info.world_size)
    train_loader = make_loader(rec, cfg.train_on, batch_size=cfg.batch_size, seed=cfg.seed,
                               drop_last=drop_last, augment=cfg.augment, delay_s=delay, **common)
    # evaluation shards count every image once (no padding); the sums are all-reduced
    val_loader = (make_loader(rec, "val", batch_size=cfg.eval_batch_size, train=False, pad=False, **common)
                  if rec.has("val") and cfg.train_on == "train" else None)  # never score training images
    test_loader = (make_loader(rec, "test", batch_size=cfg.eval_batch_size, train=False, pad=False, **common)
                   if rec.has("test") else None)
    if info.is_primary:
        run_dir.mkdir(parents=True, exist_ok=True)
    return Run(cfg, rec, device, precision, model, raw_model, optimizer, train_loader, val_loader,
               test_loader, Amp.create(precision, device), run_dir, info)


def _preflight_memory(cfg: TrainConfig, rec: Records, model: torch.nn.Module, in_shape) -> None:
    """Refuse, before any work, a setting whose memory estimate would make the machine swap."""
    splits = [rec.split(s)[0] for s in ("train", "val", "test") if rec.has(s)]
    data_bytes = 0 if cfg.resident == "no" else sum(a.nbytes for a in splits) * (1 + rec.variants)
    opt_states = {"adam": 2, "adamw": 2, "adadelta": 2, "momentum": 1, "rmsprop": 1, "adagrad": 1}
    est = estimate_training_mb(model, in_shape, cfg.batch_size, data_bytes,
                               opt_states.get(cfg.optimizer, 0))
    check_fits(est, cfg.memory_cap_mb, f"--batch-size {cfg.batch_size} with model {cfg.model}")


def _warm_up(run: Run) -> None:
    """One throw-away forward/backward, and one evaluation forward, outside the timer:
    first-call costs (oneDNN kernel selection, lazy imports in the optimizer) are paid in
    setup, not charged to training."""
    xb = next(iter(run.train_loader))[0]  # the real batch shape: under --compile, no recompile later
    state = {k: v.clone() for k, v in run.raw_model.state_dict().items()}
    with run.amp.autocast():
        run.model(xb).float().sum().backward()
    run.raw_model.load_state_dict(state)  # BN statistics back to their initial values
    run.optimizer.zero_grad(set_to_none=True)
    run.train_loader.stats.__init__()
    eval_loader = run.val_loader or run.test_loader
    if eval_loader is not None:  # the evaluation's own kernels (its batch size, no autograd): ~30 ms
        run.raw_model.eval()  # the module evaluations use (Run.validate)
        with torch.inference_mode(), run.amp.autocast():
            run.raw_model(next(iter(eval_loader))[0])
        run.raw_model.train()


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM during training: a checkpoint was saved; exit code 128 + signal."""

    def __init__(self, signum: int, step: int, path: Path | None, run_dir: Path, rank: int = 0,
                 world_size: int = 1):
        self.signum, self.step, self.path, self.run_dir = signum, step, path, run_dir
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        if rank:
            super().__init__(f"rank {rank}: interrupted by {name} at step {step}; rank 0 saved the checkpoint")
            return
        saved = f"checkpoint saved: {display(path)}" if path else "no checkpoint (checkpoints are off)"
        again = f"mnistflow train --resume --run-dir {display(run_dir)}"
        if world_size > 1:
            again += f" --nproc {world_size} (or the same under torchrun)"
        super().__init__(f"interrupted by {name} at step {step}; {saved}; continue with: {again}")


# Settings that change the model or the data (its content or order): a resume that changes
# them would not continue the same run, so it is refused. Others (epochs, lr, ...) may change.
# batch_size is compared as the global batch (batch_size x processes): resuming under torchrun
# with another number of processes is allowed when the global batch stays the same.
RESUME_IDENTITY = ("model", "seed", "batch_size", "drop_last", "augment", "optimizer", "train_on")


def data_fingerprint(rec: Records) -> dict:
    files = rec.meta.get("files") or {}
    return {"name": rec.name, "records": str(Path(rec.path).resolve()), "shape": list(rec.shape),
            "splits": dict(rec.meta.get("splits", {})), "variants": rec.variants,
            "sha256": hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()}


def resume_differences(old: dict, cfg: TrainConfig, old_data: dict | None = None,
                       data: dict | None = None, *, old_world: int = 1, world: int = 1) -> list[str]:
    """``key: old -> new`` for each setting that changes the model or data. ``old_world`` and
    ``world``: the numbers of processes of the checkpoint's run and of this one."""
    diffs = []
    for k in RESUME_IDENTITY:
        if k not in old:
            continue
        if k == "batch_size" and old_world != world:
            if old[k] * old_world != cfg.batch_size * world:
                diffs.append(f"global batch (batch_size x processes): {old[k]} x {old_world} = "
                             f"{old[k] * old_world} -> {cfg.batch_size} x {world} = {cfg.batch_size * world}")
        elif old.get(k) != getattr(cfg, k):
            diffs.append(f"{k}: {old.get(k)} -> {getattr(cfg, k)}")
    if old_data and data and old_data.get("sha256") != data["sha256"]:
        diffs.append(f"data: {old_data.get('name')} ({old_data.get('sha256', '')[:8]}) -> "
                     f"{data['name']} ({data['sha256'][:8]})")
    return diffs


def _newest_run_with_checkpoints(root: Path = Path("runs")) -> Path | None:
    runs = [d for d in root.glob("*") if (d / checkpoint.CKPT_DIR).is_dir()] if root.is_dir() else []
    return max(runs, key=lambda d: (d / checkpoint.CKPT_DIR).stat().st_mtime, default=None)


def locate_resume(resume: str | os.PathLike | bool, run_dir: str | os.PathLike | None,
                  *, quiet: bool = False) -> tuple[Path | None, Path]:
    """(checkpoint to resume from or None, run directory) for ``--resume [PATH]``.

    ``latest`` (no PATH) takes the newest valid checkpoint of ``run_dir`` (or of the newest
    run under ./runs); None there means start from step 0. An explicit PATH (a checkpoint, a
    run directory or its checkpoints/) must hold a valid checkpoint.
    """
    if resume is True or str(resume) in ("latest", "last", ""):
        rd = Path(run_dir) if run_dir else _newest_run_with_checkpoints()
        if rd is None:
            raise MnistflowError("nothing to resume: no --run-dir given and no run with checkpoints "
                                 "under ./runs (pass --run-dir RUN or --resume PATH)")
        return checkpoint.find_latest(rd / checkpoint.CKPT_DIR, quiet=quiet), rd
    p = Path(resume)
    if p.is_dir():
        folder = p if p.name == checkpoint.CKPT_DIR else p / checkpoint.CKPT_DIR
        found = checkpoint.find_latest(folder, quiet=quiet)
        if found is None:
            raise MnistflowError("no valid checkpoint to resume from", folder)
        rd = folder.parent
    elif p.is_file():
        found = p
        rd = p.parent.parent if p.parent.name == checkpoint.CKPT_DIR else p.parent
    else:
        raise MnistflowError("no such checkpoint or run directory", p)
    return found, Path(run_dir) if run_dir else rd


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop records after ``step`` (logged by the interrupted process after its last
    checkpoint; the resumed run logs them again) and any torn last line."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("step", 0) <= step:
            keep.append(line)
    from mnistflow.core.fsutil import atomic_write_text

    atomic_write_text(path, "".join(ln + "\n" for ln in keep))


def _model_info(run: Run, state: TrainState) -> ModelInfo:
    return info_from_records(run.cfg.model, run.rec, {k: v for k, v in state.metrics.items()})


def _payload(run: Run, state: TrainState, lr_at) -> dict:
    ts = {"step": state.step, "epoch": state.epoch, "step_in_epoch": state.step_in_epoch,
          "samples": state.samples, "stop_reason": state.stop_reason, "metrics": dict(state.metrics),
          "world_size": run.info.world_size}
    return checkpoint.capture(
        run.raw_model, run.optimizer, run.amp.scaler, ts, configmod.to_dict(dataclasses.replace(run.cfg, resume=None)),
        scheduler={"schedule": run.cfg.schedule, "step": state.step, "total_steps": state.total_steps,
                   "lr": lr_at(state.step), "note": "the learning rate is a pure function of the step"},
        data=data_fingerprint(run.rec), model_info=dataclasses.asdict(_model_info(run, state)))


def _restore(run: Run, state: TrainState, payload: dict, path: Path) -> None:
    checkpoint.restore(payload, run.raw_model, run.optimizer, run.amp.scaler, path=path)
    ts = payload["train_state"]
    state.step, state.epoch, state.step_in_epoch = ts["step"], ts["epoch"], ts["step_in_epoch"]
    state.samples, state.metrics = ts["samples"], dict(ts["metrics"])
    state.stop_reason = ts.get("stop_reason") if ts.get("stop_reason") == "target" else ""
    state.stop = state.stop_reason == "target"
    if run.info.rank > 0:  # the checkpoint holds rank 0's RNG; the others take a fresh stream
        torch.manual_seed(rank_seed(run.cfg.seed, run.info.rank, state.step))


class _SignalHandlers:
    """SIGINT/SIGTERM set a flag the checkpoint hook acts on at the end of the step; a second
    signal stops at once. Installed only in the main thread, restored on exit."""

    def __init__(self, interrupt: Interrupt, quiet: bool = False):
        self.interrupt = interrupt
        self.quiet = quiet
        self.old: dict = {}

    def _handle(self, signum, frame):
        if self.interrupt.signum:
            raise KeyboardInterrupt
        self.interrupt.signum = signum
        if not self.quiet:
            sys.stderr.write(f"mnistflow: {signal.Signals(signum).name}: saving a checkpoint at the end "
                             "of this step, then stopping (again to stop at once)\n")
            sys.stderr.flush()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, h in self.old.items():
            signal.signal(sig, h)


@dataclass
class InterruptSync:
    """Under torchrun: a signal to any rank stops every rank at the same step.

    Each process's signal handler sets ``pending``; once per step (and at epoch ends) the
    largest pending signal over the ranks is agreed on (one tiny collective) and copied into
    ``interrupt``, which the loop acts on: rank 0's Checkpointer saves and stops, the other
    ranks stop at exactly the points where it does. Used only when world size > 1."""

    pending: Interrupt
    interrupt: Interrupt
    steps_per_epoch: int
    primary: bool

    def _sync(self) -> None:
        signum = dist.max_over_ranks(self.pending.signum)
        if signum and not self.interrupt.signum:
            self.interrupt.signum = signum

    def on_step_end(self, step: int, state: TrainState) -> None:
        self._sync()
        # the Checkpointer's rule: the last step and epoch ends are handled after the loop
        if self.interrupt.signum and not self.primary and state.step < state.total_steps \
                and state.step_in_epoch < self.steps_per_epoch:
            state.stop, state.stop_reason = True, "interrupted"

    def on_epoch_end(self, state: TrainState) -> None:
        self._sync()
        if self.interrupt.signum and not self.primary and state.step < state.total_steps:
            state.stop, state.stop_reason = True, "interrupted"


@dataclass
class RankZeroHooks:
    """What prints or writes files. ``rank_zero_hooks`` decides; the other ranks get none."""

    metrics: MetricsFile | None = None
    tb: TensorBoardLogger | None = None
    memwatch: MemoryWatch | None = None
    starvation: StarvationWatch | None = None
    profiler: object | None = None

    def ordered(self, console: ConsoleLogger | None) -> list:
        # memwatch first: it adds rss_mb to the logs the others write.
        return [h for h in (self.memwatch, self.starvation, console, self.metrics, self.tb) if h is not None]

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.tb is not None:
            self.tb.close()


def rank_zero_hooks(run: Run, resume_step: int | None) -> RankZeroHooks:
    """The one place that decides what rank 0 alone does: metrics file, TensorBoard, memory
    and input watches, profiler. Other ranks get an empty set (and a quiet console)."""
    if not run.info.is_primary:
        return RankZeroHooks()
    from mnistflow.data.loader import StreamLoader

    cfg = run.cfg
    metrics = MetricsFile(run.run_dir / "metrics.jsonl")
    tb = TensorBoardLogger(run.run_dir / "tb") if cfg.tensorboard else None
    if tb is not None and resume_step is not None:
        try:  # events after the checkpoint's step are superseded by the resumed run's
            from torch.utils.tensorboard import SummaryWriter

            tb._w = SummaryWriter(str(tb.logdir), purge_step=resume_step + 1)
        except ImportError:
            pass
    if tb is not None:
        tb.writer  # open it (and pay its import) before the timer starts
    profiler = None
    if cfg.profile_steps:
        from mnistflow.training.observe.profiler import ProfilerHook, parse_steps

        profiler = ProfilerHook(run.run_dir / "profile", *parse_steps(cfg.profile_steps), run.device)
    return RankZeroHooks(metrics, tb, MemoryWatch(run.device),
                         StarvationWatch(queued=isinstance(run.train_loader, StreamLoader)), profiler)


def _decide_run(cfg: TrainConfig, info: dist.DistInfo) -> tuple[Path | None, Path]:
    """(checkpoint to resume from, run directory): decided by rank 0 and broadcast, so every
    rank uses the same ones (a default run name holds the time of day)."""
    decision = None
    if info.is_primary:
        try:
            if cfg.resume:
                resume_path, run_dir = locate_resume(cfg.resume, cfg.run_dir)
                if resume_path is None:
                    sys.stderr.write(f"mnistflow: note: no checkpoint in {display(run_dir)}; "
                                     "starting from step 0\n")
            else:
                resume_path, run_dir = None, Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg)
                if checkpoint.step_files(run_dir / checkpoint.CKPT_DIR):
                    raise MnistflowError("this run directory already holds checkpoints: continue it with "
                                         "--resume, or pick another --run-dir", run_dir)
            decision = ("ok", None if resume_path is None else str(resume_path), str(run_dir))
        except MnistflowError as e:
            dist.broadcast_object(("error", e.detail, e.path))  # the other ranks stop with the same error
            raise
    status, a, b = dist.broadcast_object(decision)
    if status == "error":
        raise MnistflowError(a, b)
    return (None if a is None else Path(a)), Path(b)


def fit(cfg: TrainConfig) -> dict:
    """Train as configured; returns the run summary (the ``--json`` object).

    With ``cfg.resume`` (``latest`` or a path) the run continues from a checkpoint; otherwise a
    run directory that already holds checkpoints is refused (nothing is overwritten). Under
    torchrun every process calls it (see the module docstring).
    """
    configmod.validate(cfg)
    set_interop_threads(cfg.interop_threads)  # first: PyTorch fixes this pool at its first use
    device = pick_device(cfg.device)
    env = dist.env_info()
    if cfg.sync_bn and env.enabled and device.type != "cuda":
        raise MnistflowError("--sync-bn needs CUDA GPUs (PyTorch's SyncBatchNorm has no CPU kernel); "
                             "leave it out on CPUs")
    owned = env.enabled and not dist.initialized()
    info = dist.init(device.type)
    device = dist.device_for(info, device)
    try:
        summary = _fit(cfg, device, info)
    except TrainingInterrupted:
        if owned:
            dist.cleanup()
        raise
    except Exception as e:
        if info.enabled and not isinstance(e, MnistflowError) and dist.is_comm_failure(e):
            raise MnistflowError(dist.comm_failure_message(info, e)) from None
        raise
    if owned:
        dist.cleanup()
    return summary


def _fit(cfg: TrainConfig, device: torch.device, info: dist.DistInfo) -> dict:
    primary = info.is_primary
    payload = None
    resume_path, run_dir = _decide_run(cfg, info)
    old_world = 1
    if resume_path is not None:
        payload = checkpoint.load(resume_path)  # every rank reads the same file
        old_world = int(payload["train_state"].get("world_size", 1))
        diffs = resume_differences(payload["config"], cfg, old_world=old_world, world=info.world_size)
        if diffs:
            raise MnistflowError("cannot resume with a different model or data: " + "; ".join(diffs),
                                 resume_path)
    run = _build(cfg, run_dir, device, info)
    if payload is not None:
        diffs = resume_differences(payload["config"], cfg, payload.get("data"), data_fingerprint(run.rec),
                                   old_world=old_world, world=info.world_size)
        if diffs:
            raise MnistflowError("cannot resume with a different model or data: " + "; ".join(diffs),
                                 resume_path)
    if primary:
        configmod.save_toml(cfg, run.run_dir / "config.toml")
    steps_per_epoch = len(run.train_loader)  # the same on every rank, and for any world size
    total = max(1, math.ceil(cfg.epochs * steps_per_epoch))
    if cfg.max_steps:
        total = min(total, cfg.max_steps)
    start_step = payload["train_state"]["step"] if payload is not None else 0
    if cfg.resume and primary:
        _truncate_metrics(run.run_dir / "metrics.jsonl", start_step)
    console = ConsoleLogger(total, quiet=cfg.quiet or not primary)
    rz = rank_zero_hooks(run, start_step if cfg.resume else None)
    guard = FinalizeGuard(run.raw_model)
    run.hooks = rz.ordered(console if primary else None)
    run.hooks += [guard, PeriodicEval(run, cfg.eval_every)]
    if rz.profiler is not None:
        run.hooks.append(rz.profiler)
    lr_at = lambda step: cfg.lr * lr_factor(step, total, cfg.schedule, warmup=cfg.warmup,  # noqa: E731
                                            steps_per_epoch=steps_per_epoch,
                                            step_every=cfg.step_every, gamma=cfg.step_gamma)
    # Signals: without checkpoints there is nothing to save, so they keep their default
    # behaviour. Under torchrun the handler's flag (pending) is agreed on by all ranks first.
    interrupt = Interrupt()
    catch_signals = cfg.keep_checkpoints > 0
    isync = None
    pending = interrupt
    if catch_signals and info.enabled:
        pending = Interrupt()
        isync = InterruptSync(pending, interrupt, steps_per_epoch, primary)
        run.hooks.append(isync)  # before the Checkpointer: it acts on the agreed flag
    ckpt = None
    if cfg.keep_checkpoints > 0 and primary:
        ckpt = Checkpointer(
            checkpoint.CheckpointDir(run.run_dir / checkpoint.CKPT_DIR, cfg.keep_checkpoints),
            lambda st: _payload(run, st, lr_at), steps_per_epoch, every=cfg.checkpoint_every,
            secs=cfg.checkpoint_secs, metric_split="val" if run.val_loader is not None else "test",
            interrupt=interrupt)
        run.hooks.append(ckpt)  # after PeriodicEval: a checkpoint includes this step's evaluation
    run.console = console
    console.message(
        f"training {cfg.model} on {run.rec.name} {cfg.train_on} ({run.rec.size(cfg.train_on):,} images, "
        f"{run.rec.num_classes} classes) | {run.device} {run.precision}"
        f"{' channels_last' if cfg.channels_last else ''} threads={torch.get_num_threads()} | "
        f"batch {cfg.batch_size * info.world_size} x {total} steps | {run.run_dir}")
    if info.enabled:
        console.message(f"data parallel: {info.world_size} processes ({info.backend}), batch "
                        f"{cfg.batch_size} per process x {info.world_size} = global batch "
                        f"{cfg.batch_size * info.world_size}")
    if cfg.init_from and payload is None:
        _init_from(run, cfg, console)
    _warm_up(run)
    state = TrainState(total_steps=total)
    if payload is not None:
        _restore(run, state, payload, resume_path)
        console.message(f"resumed from {display(resume_path)}: step {state.step}, epoch {state.epoch} "
                        f"+ {state.step_in_epoch} batches"
                        + (f" (saved by {old_world} process(es), continued by {info.world_size})"
                           if old_world != info.world_size else ""))
    if ckpt is not None and cfg.resume:
        moved = ckpt.ckpts.supersede_after(state.step)
        if moved:
            console.message(f"moved {len(moved)} checkpoint(s) newer than step {state.step} to "
                            f"{display(moved[0].parent)}")
    start_samples = state.samples
    run.t_start = time.perf_counter()
    if cfg.whiten and payload is None and not cfg.init_from:  # data-dependent init: training time
        _whiten(run, console)
    with _SignalHandlers(pending, quiet=not primary) if catch_signals else contextlib.nullcontext(), guard:
        while not state.stop and state.step < total:
            run.train_loader.set_epoch(state.epoch, state.step_in_epoch)
            train_one_epoch(run.model, run.train_loader, run.optimizer, state, amp=run.amp, lr_at=lr_at,
                            label_smoothing=cfg.label_smoothing, log_every=cfg.log_every,
                            hooks=run.hooks, max_steps=total)
            if state.stop_reason == "interrupted":
                break
            epoch_done = state.step_in_epoch >= steps_per_epoch
            if not cfg.validate:
                pass
            elif not cfg.eval_every and (epoch_done or state.step >= total) and not state.stop_reason == "target":
                run.validate(state.step, state)
            elif state.step >= total and cfg.eval_every and state.step % cfg.eval_every:
                run.validate(state.step, state)
            if epoch_done:
                state.epoch += 1
                state.step_in_epoch = 0
            if isync is not None:
                isync.on_epoch_end(state)
            if ckpt is not None:
                ckpt.on_epoch_end(state)
    if state.stop_reason == "interrupted":
        rz.close()
        dist.barrier()  # rank 0 has saved: no rank exits (and gets the job torn down) before
        raise TrainingInterrupted(interrupt.signum, state.step, ckpt.last_path if ckpt else None,
                                  run.run_dir, rank=info.rank, world_size=info.world_size)
    test = None
    if run.test_loader is not None:
        # the test pass of this very step (records without a val split, or a target on test) counts
        test = {"acc": state.metrics["test_acc"]} if state.metrics.get("test_step") == state.step \
            else run.validate(state.step, state, "test")
    wall = time.perf_counter() - run.t_start
    # Training throughput counts the steps only: wall time less evaluations and checkpoint writes.
    train_s = wall - run.eval_s - (ckpt.save_s if ckpt is not None else 0.0)
    if rz.profiler is not None:
        rz.profiler.close()
        console.message(rz.profiler.report or f"profiler: the run ended before step {rz.profiler.stop}; "
                                               "nothing was recorded")
    if ckpt is not None:
        ckpt.save(state, "final")
    warnings = [w for w in (rz.starvation and rz.starvation.message, rz.memwatch and rz.memwatch.leak_message)
                if w]
    in_sync = None
    if info.enabled:  # DDP keeps the ranks' parameters equal: check it, once, at the end
        in_sync = dist.params_in_sync(run.raw_model)
        if not in_sync:
            warnings.append("mnistflow: warning: the model's parameters differ between ranks at the end "
                            "of training (a non-deterministic model or a bug); rank 0's were saved")
            console.message(warnings[-1])
    return _finish(run, state, wall, train_s, test, rz.metrics, rz.tb, state.samples - start_samples,
                   resumed_from=resume_path, checkpoint_path=ckpt.last_path if ckpt else None,
                   warnings=warnings, ranks_in_sync=in_sync)


WHITEN_IMAGES = 1000


def _whiten(run: Run, console: ConsoleLogger) -> None:
    """``--whiten``: the first convolution from the patches of the first 1,000 training images
    (the same on every rank; rank 0's weights are broadcast all the same)."""
    from mnistflow.models.whiten import first_conv, whiten_first_conv

    xb = normalized_batch(run.rec.split("train")[0][:WHITEN_IMAGES], run.rec.mean, run.rec.std,
                          run.device, run.cfg.channels_last)
    console.message(whiten_first_conv(run.raw_model, xb))
    if run.info.enabled:
        for p in first_conv(run.raw_model)[1].parameters():  # weight and bias
            torch.distributed.broadcast(p.data, 0)


def _init_from(run: Run, cfg: TrainConfig, console: ConsoleLogger) -> None:
    """Start from the named arrays of an npz (``--init-from``, selected by ``--init-only``)."""
    from mnistflow.exporting import load_npz_into

    p = Path(cfg.init_from)
    if p.suffix.lower() != ".npz":
        raise MnistflowError("--init-from takes an npz of name -> array "
                             "(make one with: mnistflow export RUN --format npz)", p)
    report = load_npz_into(run.raw_model, p, only=cfg.init_only)
    if not report.loaded:
        raise MnistflowError(f"no parameter of the model was restored ({report.problems()})", p)
    console.message(report.format())


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _finish(run: Run, state: TrainState, wall: float, train_s: float, test, metrics, tb, samples: int,
            resumed_from: Path | None = None, checkpoint_path: Path | None = None,
            warnings: list | None = None, ranks_in_sync: bool | None = None) -> dict:
    """The summary (every rank returns it); rank 0 writes the model, summary.json, the graph."""
    cfg = run.cfg
    primary = run.info.is_primary
    if primary:
        save_model(run.run_dir / MODEL_FILE, run.raw_model, _model_info(run, state))
    stats = run.train_loader.stats
    summary = {
        "wall_s": round(wall, 3),
        "time_to_target_s": None if run.time_to_target is None else round(run.time_to_target, 3),
        "epochs": round(state.epoch + state.step_in_epoch / max(len(run.train_loader), 1), 3),
        "steps": state.step,
        "img_per_s": round(samples / wall, 1) if wall > 0 else None,
        "train_s": round(train_s, 3),
        "train_img_per_s": round(samples / train_s, 1) if train_s > 0 else None,
        "data_wait_frac": round(stats.wait_s / wall, 4) if wall > 0 else None,
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        **{k: round(v, 1) for k, v in gpu_peaks_mb(run.device).items()},
        "val_acc": state.metrics.get("val_acc"),
        "test_acc": state.metrics.get("test_acc"),
        "tta": cfg.tta,  # the accuracies above average over this many extra shifted views
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
        "run_dir": str(run.run_dir),
        "resumed_from": None if resumed_from is None else str(resumed_from),
        "checkpoint": None if checkpoint_path is None else str(checkpoint_path),
        "warnings": warnings or [],
    }
    if not primary:
        return summary
    if tb is not None:
        xb = next(iter(run.val_loader or run.test_loader))[0][:1]
        tb.add_graph(run.raw_model.eval(), xb)
        tb.close()
    metrics.close()
    from mnistflow.core.fsutil import atomic_write_text

    atomic_write_text(run.run_dir / "summary.json", json.dumps(summary, indent=1) + "\n")
    if run.console is not None:
        run.console.message(end_of_run_table(summary, cfg.target_acc))
    if cfg.json:
        print(json.dumps(summary))
    return summary


def end_of_run_table(s: dict, target: float | None) -> str:
    """The short fixed-width table every run ends with."""
    pct = lambda v: "-" if v is None else f"{100 * v:.2f}%"  # noqa: E731
    rows = [("wall time", f"{s['wall_s']:.2f} s")]
    if target is not None:
        ttt = s["time_to_target_s"]
        rows.append((f"time to {100 * target:.2f}%", "not reached" if ttt is None else f"{ttt:.2f} s"))
    rows += [("throughput", f"{s['img_per_s']:,.0f} img/s ({s['train_img_per_s'] or 0:,.0f} img/s "
                            f"in training steps)"),
             ("data wait", pct(s["data_wait_frac"])),
             ("peak memory", f"{s['peak_rss_mb']:,.0f} MB RSS"),
             *([("GPU peak memory", f"{s['gpu_peak_allocated_mb']:,.0f} MB allocated, "
                                    f"{s['gpu_peak_reserved_mb']:,.0f} MB reserved")]
               if "gpu_peak_allocated_mb" in s else []),
             ("val accuracy", pct(s["val_acc"])),
             ("test accuracy", pct(s["test_acc"]) + (f" (mean of {s['tta'] + 1} shifted views)"
                                                     if s.get("tta") and s["test_acc"] is not None else "")),
             ("run directory", s["run_dir"])]
    w = max(len(k) for k, _ in rows)
    line = "-" * (w + 3 + max(len(v) for _, v in rows))
    return "\n".join([line] + [f"{k:<{w}}   {v}" for k, v in rows] + [line])


def _keep_global_batch(base: dict, old_world: int, given: bool) -> None:
    """Resuming under another number of processes without ``--batch-size``: the per-process
    batch that keeps the checkpoint's global batch (when it divides evenly)."""
    world = dist.env_info().world_size
    if given or old_world == world or "batch_size" not in base:
        return
    global_batch = base["batch_size"] * old_world
    if global_batch % world == 0:
        base["batch_size"] = global_batch // world


def train(config: str | Path | None = None, **overrides) -> dict:
    """Python twin of ``mnistflow train``: ``train(recipe="seed-cnn", epochs=2)``."""
    from mnistflow.training.recipes import get_recipe

    file = configmod.load_toml(config) if config else None
    recipe_name = overrides.get("recipe") or (file or {}).get("recipe")
    recipe = get_recipe(recipe_name) if recipe_name else None
    for k in ("data", "run_dir", "resume", "init_from"):
        if isinstance(overrides.get(k), os.PathLike):
            overrides[k] = str(overrides[k])
    if overrides.get("resume") is True:
        overrides["resume"] = "latest"
    resume = overrides.get("resume") or (file or {}).get("resume")
    if resume:
        # The checkpoint's configuration is the base; what is given explicitly overrides it.
        path, rd = locate_resume(resume, overrides.get("run_dir") or (file or {}).get("run_dir"), quiet=True)
        if not overrides.get("run_dir"):
            overrides["run_dir"] = str(rd)
        if path is not None:
            known = configmod.field_names() - {"resume", "run_dir"}
            saved = checkpoint.load(path)
            base = {k: v for k, v in saved["config"].items() if k in known}
            given = any((d or {}).get("batch_size") is not None for d in (recipe, file, overrides))
            _keep_global_batch(base, int(saved["train_state"].get("world_size", 1)), given)
            recipe = {**base, **(recipe or {})}
    cfg = configmod.resolve(recipe, file, overrides)
    return fit(cfg)
