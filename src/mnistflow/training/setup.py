"""Building a training run: the configuration, the run directory, the data, the model, the
optimizer and the observers; everything ``training.loop.fit`` needs before its first step.

The resolved ``TrainConfig`` is never changed here: what is decided at run time (the batch
size of ``--batch-size auto``, the run directory, the device and precision) lives in
:class:`Run`; ``Run.cfg`` is the configuration the run really uses (a new object, built once
with ``dataclasses.replace``), the one saved as ``config.toml``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from mnistflow.artifacts.rundir import CONFIG, RunBusy, RunDir, RunLock
from mnistflow.core import openmp
from mnistflow.core.errors import MnistflowError, display
from mnistflow.core.log import note, warn
from mnistflow.data.augment import resolve_policy
from mnistflow.data.loader import StreamLoader, make_loader
from mnistflow.data.normalize import normalize
from mnistflow.data.records import Records, open_records
from mnistflow.models import create_model
from mnistflow.models.ensemble import nets
from mnistflow.models.registry import check_trainable
from mnistflow.runtime import dist
from mnistflow.runtime.cpu import (
    busy_cores_elsewhere,
    cpu_has_fast_bf16,
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
from mnistflow.training.config import TrainConfig
from mnistflow.training.observe.memory import (
    MemoryWatch,
    check_fits,
    estimate_training_mb,
)
from mnistflow.training.observe.metrics import MetricsFile
from mnistflow.training.observe.starvation import StarvationWatch
from mnistflow.training.observe.tensorboard import TensorBoardLogger
from mnistflow.training.optim import build_optimizer, net_parameters

if TYPE_CHECKING:
    from mnistflow.training.observe.console import ConsoleLogger

WHITEN_IMAGES = 1000


def resolve_config(config: str | os.PathLike | None = None, **overrides) -> TrainConfig:
    """The configuration of ``mnistflow train [--config FILE] --flag value ...``: defaults <
    recipe < file < flags. With ``resume``, the checkpoint's configuration is the base that
    the recipe, the file and the flags given override (and ``resume`` names that checkpoint)."""
    from mnistflow.data.open import known_name, policy_of
    from mnistflow.training.recipes import FOR_DATA, for_data, get_recipe, pick_for_target

    if config is not None and not isinstance(config, (str, os.PathLike)):
        raise MnistflowError(f"config is the path of a TOML file (e.g. RUN/{CONFIG}); got a "
                             f"{type(config).__name__}: give settings as keyword arguments (epochs=2)")
    file = configmod.load_toml(config) if config else None
    recipe_name = overrides.get("recipe") or (file or {}).get("recipe")
    given = {k: overrides.get(k) if overrides.get(k) is not None else (file or {}).get(k)
             for k in ("dataset", "data", "model", "target_acc", "target_split", "resume", "device")}
    if recipe_name is None and given["target_acc"] is not None and not given["model"] and not given["resume"]:
        # the cheapest recipe known to reach the target on this dataset (an error if none is)
        configmod.check_value("target_acc", given["target_acc"])
        device = str(given["device"] or "auto")
        gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
        machine = "gpu" if gpu else "cpu-bf16" if cpu_has_fast_bf16() else "cpu"
        recipe_name, why = pick_for_target(given["target_acc"], known_name(given["dataset"], given["data"]), machine)
        overrides["recipe"] = recipe_name
        chosen = get_recipe(recipe_name)
        # the recipe as the file and the flags given change it: does the run validate?
        planned = {**chosen, **{k: v for d in (file or {}, overrides) for k, v in d.items() if v is not None}}
        if not given["target_split"] and (planned.get("train_on") == "train+val"
                                          or planned.get("validate") is False):
            overrides["target_split"] = "test"  # no validation pass: the final test pass judges it
        if dist.env_info().is_primary and not (overrides.get("quiet") or overrides.get("json")):
            note(why)
    recipe = get_recipe(recipe_name) if recipe_name else None
    for k in ("data", "run_dir", "resume", "init_from"):
        if isinstance(overrides.get(k), os.PathLike):
            overrides[k] = str(overrides[k])
    if recipe is not None and FOR_DATA.get(recipe_name):  # the recipe's choices for this data
        kind = policy_of(given["dataset"], given["data"])
        recipe.update(for_data(recipe_name, kind) if kind else {})
    if overrides.get("resume") is True:
        overrides["resume"] = "latest"
    resume = overrides.get("resume") or (file or {}).get("resume")
    if resume:
        # the run's own quiet is not known before its config is: only an explicit one silences
        # what is said here (corrupt checkpoints skipped on the way to the newest valid one)
        quiet = bool(overrides.get("quiet", (file or {}).get("quiet")) or overrides.get("json"))
        path, rd = resumemod.locate_resume(resume, overrides.get("run_dir") or (file or {}).get("run_dir"),
                                           quiet=quiet)
        overrides["run_dir"] = overrides.get("run_dir") or str(rd)
        # the run's own thread count (the bits depend on it), unless one is chosen now
        keep_threads = env_threads() is None and all((d or {}).get("threads") is None for d in (file, overrides))
        known = configmod.field_names()
        if path is not None:
            given = any((d or {}).get("batch_size") is not None for d in (recipe, file, overrides))
            base = resumemod.config_base(path, given, known, keep_threads=keep_threads)
            recipe = {**base, **(recipe or {})}
            overrides["resume"] = str(path)  # fit continues from this one, not a newer one since
        else:  # killed before its first checkpoint: that run again, from its own config.toml
            own = resumemod.restart_config(rd)
            if own is not None:
                recipe = {**resumemod.restart_base(own, known, keep_threads=keep_threads), **(recipe or {})}
    return configmod.resolve(recipe, file, overrides)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def default_run_dir(cfg: TrainConfig) -> Path:
    name = (cfg.recipe or cfg.model).replace("/", "_").replace(":", "_")
    if "," in name:
        name = "spec"
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


MAX_DEFAULT_RUNS = 100  # runs/<name>-<time>-N: runs started in the same second


def _own(held: contextlib.ExitStack, run_dir: Path, new_run: bool) -> None:
    """Take the run directory for this training (its lock, released when ``held`` closes; then,
    for a new run that failed before it recorded a step, what it wrote is removed: ``RunLock``)."""
    held.enter_context(RunLock(run_dir, new_run=new_run))


def _new_default_run(cfg: TrainConfig, held: contextlib.ExitStack) -> Path:
    """``runs/<name>-<time>``, or ``-2``, ``-3``... when another training took that name."""
    base = default_run_dir(cfg)
    for i in range(1, MAX_DEFAULT_RUNS + 1):
        run_dir = base if i == 1 else base.with_name(f"{base.name}-{i}")
        lock = RunLock(run_dir, new_run=True)
        try:
            lock.acquire()
        except RunBusy:
            continue
        if not RunDir(run_dir).run_files():
            held.push(lock)  # its __exit__: released (and discarded on a failure) when ``held`` closes
            return run_dir
        lock.release()
    raise MnistflowError(f"{MAX_DEFAULT_RUNS} runs named {base.name} exist already: pick a --run-dir",
                         base.parent)


def decide_run(cfg: TrainConfig, info: dist.DistInfo, held: contextlib.ExitStack) -> tuple[Path | None, Path]:
    """(checkpoint to resume from, run directory): decided by rank 0 and broadcast, so every
    rank uses the same ones (a default run name holds the time of day).

    Rank 0 owns the run directory from here (``RunLock``, before anything is written there)
    until ``held`` closes: another training on it fails at once. A new run never goes into a
    directory that holds one (that needs ``--resume``), and one that fails before it recorded a
    step leaves the directory as it was (``RunLock(new_run=True)``)."""
    decision = None
    if info.is_primary:
        try:
            if cfg.resume:
                if cfg.run_dir:
                    _own(held, Path(cfg.run_dir), new_run=False)
                resume_path, run_dir = resumemod.locate_resume(cfg.resume, cfg.run_dir)
                if not cfg.run_dir:
                    _own(held, run_dir, new_run=False)
                if resume_path is not None:
                    of = RunDir.of_checkpoint(resume_path)
                    if of is None or of.path.resolve() != Path(run_dir).resolve():
                        RunDir(run_dir).refuse_new_run()  # another run's checkpoint starts a run of its own here
                    else:
                        resumemod.check_same_run(resume_path, run_dir)  # not one copied in from another
                else:
                    own = resumemod.restart_config(run_dir)
                    note(f"no checkpoint in {display(run_dir)}; "
                         + ("restarting it from step 0 with its " + CONFIG if own else "starting from step 0"))
            elif cfg.run_dir:
                resume_path, run_dir = None, Path(cfg.run_dir)
                _own(held, run_dir, new_run=True)
                RunDir(run_dir).refuse_new_run()
            else:
                resume_path, run_dir = None, _new_default_run(cfg, held)
            decision = ("ok", None if resume_path is None else str(resume_path), str(run_dir))
        except MnistflowError as e:
            dist.broadcast_object(("error", e.detail, e.path))  # the other ranks stop with the same error
            raise
    status, a, b = dist.broadcast_object(decision)
    if status == "error":
        raise MnistflowError(a, b)
    return (None if a is None else Path(a)), Path(b)


@dataclass
class Run:
    """Everything ``fit`` wires together, decided once before the first step."""

    cfg: TrainConfig  # as the run uses it (``--batch-size auto`` resolved): config.toml
    rec: Records
    device: torch.device
    precision: str
    model: torch.nn.Module  # what trains (DDP / torch.compile wrapped)
    raw_model: torch.nn.Module  # the plain module: evaluation, checkpoints, the model file
    optimizer: torch.optim.Optimizer
    train_loader: object
    val_loader: object | None
    test_loader: object | None
    amp: Amp
    dir: RunDir
    info: dist.DistInfo = field(default_factory=dist.DistInfo)
    resume: resumemod.Resume | None = None
    model_factory: dict | None = None  # {"factory": "pkg.mod:name", "kwargs": {...}} of a user's model


def _threads_for_a_shared_machine() -> int | None:
    """The default thread count, lowered when other processes keep cores busy (only when no
    one chose: no ``--threads``, no ``$MNISTFLOW_THREADS``, not under torchrun, where the
    busy cores are the other ranks), and only when mnistflow did not see an idle machine at
    import (``core.openmp``; the 0.25 s sample would be a sixth of a `fast` run). A thread that
    shares a core with a busy process slows every op: 2 spinning threads beside one took 4.6x
    their idle time on a Zen 4 VM, 2 passive ones 3.4x, 1 thread 1.2x (Zen 2: 2.4x, 1.3x,
    1.3x; benchmarks/busy_neighbour.py)."""
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


def _resolve_augment(cfg: TrainConfig, rec: Records, info: dist.DistInfo,
                     resume: resumemod.Resume | None) -> TrainConfig:
    """``--augment auto`` as the policy it means for these records (what config.toml and the
    summary record): the known dataset's own policy, ``shifts`` for other inputs (a note says
    so). A resumed run keeps the policy it was trained with."""
    if cfg.augment != "auto":
        return cfg
    if resume is not None:
        return dataclasses.replace(cfg, augment=resumemod.saved_config(resume.payload).get("augment") or "off")
    policy, why = resolve_policy("auto", rec.name)
    if why and info.is_primary:
        note(why)
    return dataclasses.replace(cfg, augment=policy)


def _preflight_memory(cfg: TrainConfig, rec: Records, model: torch.nn.Module, in_shape) -> None:
    """Refuse, before any work, a setting whose memory estimate would make the machine swap."""
    splits = [rec.split(s)[0] for s in ("train", "val", "test") if rec.has(s)]
    data_bytes = 0 if cfg.resident == "no" else sum(a.nbytes for a in splits) * (1 + rec.variants)
    opt_states = {"adam": 2, "adamw": 2, "adadelta": 2, "momentum": 1, "rmsprop": 1, "adagrad": 1}
    est = estimate_training_mb(model, in_shape, cfg.batch_size, data_bytes,
                               opt_states.get(cfg.optimizer, 0))
    check_fits(est, cfg.memory_cap_mb, f"--batch-size {cfg.batch_size} with model {cfg.model}")


def build_run(cfg: TrainConfig, run_dir: Path, device: torch.device, info: dist.DistInfo,
              resume: resumemod.Resume | None = None, model: torch.nn.Module | None = None,
              model_factory: dict | None = None) -> Run:
    """Threads, data, model, optimizer, loaders, the run directory (rank 0). ``model``: a
    ready module to train instead of ``create_model(cfg.model)``."""
    cfg = dataclasses.replace(cfg, data=_absolute_data(cfg),  # config.toml works from any directory
                              run_dir=None if cfg.run_dir is None else os.path.abspath(run_dir))
    threads = cfg.threads or (_threads_for_a_shared_machine() if device.type == "cpu" else 2)
    set_threads(threads)
    if resume is not None and info.is_primary:
        _say_thread_change(resume, info.world_size)
    limit_gpu_memory(cfg.gpu_memory_fraction, device)
    if device.type == "cpu":
        tune_malloc()
        flush_denormals()
    precision = pick_precision(cfg.precision, device)
    with dist.local_rank_zero_first(info):  # one process per machine prepares the cache
        from mnistflow.data.prepare import prepare

        rec = open_records(prepare(cfg.dataset, cfg.data, quiet=cfg.quiet or cfg.json))
    configmod.check_target_split(cfg, rec.has, rec.path)
    h, w, c = rec.shape
    n_train = rec.size(cfg.train_on)
    if cfg.batch_size != "auto" and cfg.batch_size > n_train:
        raise MnistflowError(f"--batch-size {cfg.batch_size} is larger than the training set "
                             f"({n_train:,} images)", rec.path)
    seed_everything(cfg.seed)
    name = cfg.model if model is None else type(model).__name__  # (a ready module's label is a path)
    if model is None:
        model = create_model(cfg.model, (c, h, w), rec.num_classes)  # the same on every rank
    if info.rank > 0:
        torch.manual_seed(resumemod.rank_seed(cfg.seed, info.rank))
    memfmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    model = model.to(device=device, memory_format=memfmt)
    check_input(model, (c, h, w), rec.num_classes, device)
    check_trainable(model, name)  # (after the shapes: a wrong output says more)
    if cfg.sync_bn and info.enabled:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    raw_model = model
    if cfg.batch_size == "auto":
        from mnistflow.training.autobatch import choose_batch_size

        choice = choose_batch_size(model, cfg, (c, h, w), rec.num_classes, device, precision, n_train) \
            if info.is_primary else None
        batch, why = dist.broadcast_object(choice)  # every rank trains with rank 0's choice
        cfg = dataclasses.replace(cfg, batch_size=batch)
        if info.is_primary and not cfg.quiet:
            print(f"batch size auto: {batch} ({why})")
    cfg = _resolve_augment(cfg, rec, info, resume)
    if cfg.whiten:  # a model it cannot whiten fails here, before any work
        from mnistflow.models.whiten import first_conv

        first_conv(model, cfg.model)
    _preflight_memory(cfg, rec, model, (c, h, w))
    optimizer = build_optimizer(cfg.optimizer, net_parameters(model), cfg.lr, momentum=cfg.momentum,
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
    delay = configmod.data_delay()  # tests: a slow reader
    common = dict(device=device, channels_last=cfg.channels_last, resident="no" if delay else cfg.resident,
                  rank=info.rank, world_size=info.world_size)
    train_loader = make_loader(rec, cfg.train_on, batch_size=cfg.batch_size, seed=cfg.seed,
                               drop_last=drop_last, augment=cfg.augment, delay_s=delay, **common)
    # evaluation shards count every image once (no padding); the sums are all-reduced
    val_loader = (make_loader(rec, "val", batch_size=cfg.eval_batch_size, train=False, pad=False, **common)
                  if rec.has("val") and cfg.train_on == "train" else None)  # never score training images
    test_loader = (make_loader(rec, "test", batch_size=cfg.eval_batch_size, train=False, pad=False, **common)
                   if rec.has("test") else None)
    if resume is not None:
        resume.check(cfg, info.world_size, rec)
    if info.is_primary:
        run_dir.mkdir(parents=True, exist_ok=True)
        configmod.save_toml(cfg, RunDir(run_dir).config)
    return Run(cfg, rec, device, precision, model, raw_model, optimizer, train_loader, val_loader,
               test_loader, Amp.create(precision, device), RunDir(run_dir), info, resume, model_factory)


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


def rank_zero_observers(run: Run, console: ConsoleLogger, resume_step: int | None) -> Observers:
    """The one place that decides what rank 0 alone does: metrics file, TensorBoard, memory
    and input watches, profiler. Other ranks get none (and a quiet console)."""
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
    # the memory watch first: it adds rss_mb to the logs the others print and write
    first = [MemoryWatch(run.device), StarvationWatch(queued=isinstance(run.train_loader, StreamLoader)),
             console]
    return Observers(first, [w for w in (metrics, tb) if w is not None], profiler)


def warm_up(run: Run) -> None:
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
