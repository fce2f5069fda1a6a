"""``mnistflow train``: records -> a trained model in a run directory.

    mnistflow train --recipe softmax                    # the tutorial's softmax regression
    mnistflow train --recipe seed-cnn --data data/mnist # the tutorial's deep CNN
    mnistflow train --model "conv5x5x32-relu,maxpool2,fc10" --epochs 1 --json

Run directory (``runs/<name>/``): config.toml, metrics.jsonl, tb/ (TensorBoard), model.safetensors,
summary.json. The timer starts after setup (data on the device, model built, writers open)
and stops after the final test evaluation.
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import config as configmod
from .artifacts import MODEL_FILE, ModelInfo, save_model, unwrap
from .config import TrainConfig
from .data.loader import make_loader
from .data.records import Records, open_records
from .engine import TrainState, call, evaluate, train_one_epoch
from .errors import MnistflowError
from .models import create_model
from .observe.console import ConsoleLogger
from .observe.metrics import MetricsFile
from .observe.tensorboard import TensorBoardLogger
from .optim import build_optimizer, lr_factor
from .runtime import Amp, pick_device, pick_precision, set_threads, tune_malloc


def resolve_records(cfg: TrainConfig) -> Records:
    """The record set to train on: a records dir, or raw data prepared into the cache once."""
    from .prep import prepare

    quiet = cfg.quiet or cfg.json
    path = prepare(cfg.dataset, cfg.data, quiet=quiet)
    return open_records(path)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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
    hooks: list = field(default_factory=list)
    console: ConsoleLogger | None = None
    t_start: float = 0.0
    time_to_target: float | None = None

    def validate(self, step: int, state: TrainState, split: str | None = None) -> dict:
        split = split or ("val" if self.val_loader is not None else "test")
        loader = self.val_loader if split == "val" else self.test_loader
        t0 = time.perf_counter()
        res = evaluate(self.model, loader, self.amp, self.rec.num_classes)
        res.update(split=split, eval_s=time.perf_counter() - t0)
        state.metrics[f"{split}_acc"] = res["acc"]
        state.metrics[f"{split}_loss"] = res["loss"]
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


def _build(cfg: TrainConfig) -> Run:
    device = pick_device(cfg.device)
    threads = set_threads(cfg.threads) if device.type == "cpu" else set_threads(cfg.threads or 2)
    if device.type == "cpu":
        tune_malloc()
    precision = pick_precision(cfg.precision, device)
    rec = resolve_records(cfg)
    h, w, c = rec.shape
    n_train = rec.meta["splits"]["train"]
    if cfg.batch_size > n_train:
        raise MnistflowError(f"--batch-size {cfg.batch_size} is larger than the training set "
                             f"({n_train:,} images)", rec.path)
    seed_everything(cfg.seed)
    model = create_model(cfg.model, (c, h, w), rec.num_classes)
    memfmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    model = model.to(device=device, memory_format=memfmt)
    raw_model = model
    optimizer = build_optimizer(cfg.optimizer, model.parameters(), cfg.lr, momentum=cfg.momentum,
                                nesterov=cfg.nesterov, weight_decay=cfg.weight_decay)
    if cfg.compile:
        model = torch.compile(model)
    common = dict(device=device, channels_last=cfg.channels_last)
    train_loader = make_loader(rec, "train", batch_size=cfg.batch_size, seed=cfg.seed,
                               drop_last=cfg.drop_last, augment=cfg.augment, **common)
    val_loader = (make_loader(rec, "val", batch_size=cfg.eval_batch_size, train=False, **common)
                  if rec.has("val") else None)
    test_loader = (make_loader(rec, "test", batch_size=cfg.eval_batch_size, train=False, **common)
                   if rec.has("test") else None)
    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    return Run(cfg, rec, device, precision, model, raw_model, optimizer, train_loader, val_loader,
               test_loader, Amp.create(precision, device), run_dir)


def _warm_up(run: Run) -> None:
    """One throw-away forward/backward outside the timer: first-call costs (oneDNN kernel
    selection, lazy imports in the optimizer) are paid in setup, not charged to training."""
    xb = next(iter(run.train_loader))[0][:2]
    state = {k: v.clone() for k, v in run.raw_model.state_dict().items()}
    with run.amp.autocast():
        run.model(xb).float().sum().backward()
    run.raw_model.load_state_dict(state)  # BN statistics back to their initial values
    run.optimizer.zero_grad(set_to_none=True)
    run.train_loader.stats.__init__()


def fit(cfg: TrainConfig) -> dict:
    """Train as configured; returns the run summary (the ``--json`` object)."""
    configmod.validate(cfg)
    run = _build(cfg)
    cfg_path = run.run_dir / "config.toml"
    configmod.save_toml(cfg, cfg_path)
    steps_per_epoch = len(run.train_loader)
    total = max(1, math.ceil(cfg.epochs * steps_per_epoch))
    if cfg.max_steps:
        total = min(total, cfg.max_steps)
    console = ConsoleLogger(total, quiet=cfg.quiet)
    metrics = MetricsFile(run.run_dir / "metrics.jsonl")
    tb = TensorBoardLogger(run.run_dir / "tb") if cfg.tensorboard else None
    if tb is not None:
        tb.writer  # open it (and pay its import) before the timer starts
    run.hooks = [h for h in (console, metrics, tb) if h is not None]
    run.hooks.append(PeriodicEval(run, cfg.eval_every))
    run.console = console
    console.message(
        f"training {cfg.model} on {run.rec.name} ({run.rec.meta['splits']['train']:,} images, "
        f"{run.rec.num_classes} classes) | {run.device} {run.precision}"
        f"{' channels_last' if cfg.channels_last else ''} threads={torch.get_num_threads()} | "
        f"batch {cfg.batch_size} x {total} steps | {run.run_dir}")
    lr_at = lambda step: cfg.lr * lr_factor(step, total, cfg.schedule, warmup=cfg.warmup,  # noqa: E731
                                            steps_per_epoch=steps_per_epoch,
                                            step_every=cfg.step_every, gamma=cfg.step_gamma)
    _warm_up(run)
    state = TrainState(total_steps=total)
    run.t_start = time.perf_counter()
    while not state.stop and state.step < total:
        run.train_loader.set_epoch(state.epoch, state.step_in_epoch)
        train_one_epoch(run.model, run.train_loader, run.optimizer, state, amp=run.amp, lr_at=lr_at,
                        label_smoothing=cfg.label_smoothing, log_every=cfg.log_every,
                        hooks=run.hooks, max_steps=total)
        epoch_done = state.step_in_epoch >= steps_per_epoch
        if not cfg.eval_every and (epoch_done or state.step >= total) and not state.stop_reason == "target":
            run.validate(state.step, state)
        elif state.step >= total and cfg.eval_every and state.step % cfg.eval_every:
            run.validate(state.step, state)
        if epoch_done:
            state.epoch += 1
            state.step_in_epoch = 0
    test = None
    if run.test_loader is not None:
        test = run.validate(state.step, state, "test") if "test_acc" not in state.metrics or \
            cfg.target_split != "test" else {"acc": state.metrics["test_acc"]}
    wall = time.perf_counter() - run.t_start
    return _finish(run, state, wall, test, metrics, tb)


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _finish(run: Run, state: TrainState, wall: float, test, metrics, tb) -> dict:
    cfg = run.cfg
    info = ModelInfo(model=cfg.model, in_shape=[run.rec.shape[2], *run.rec.shape[:2]],
                     class_names=run.rec.class_names, mean=run.rec.mean, std=run.rec.std,
                     dataset=run.rec.name, records=str(run.rec.path.resolve()),
                     metrics={k: v for k, v in state.metrics.items()})
    save_model(run.run_dir / MODEL_FILE, run.raw_model, info)
    stats = run.train_loader.stats
    summary = {
        "wall_s": round(wall, 3),
        "time_to_target_s": None if run.time_to_target is None else round(run.time_to_target, 3),
        "epochs": round(state.epoch + state.step_in_epoch / max(len(run.train_loader), 1), 3),
        "steps": state.step,
        "img_per_s": round(state.samples / wall, 1) if wall > 0 else None,
        "data_wait_frac": round(stats.wait_s / wall, 4) if wall > 0 else None,
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "val_acc": state.metrics.get("val_acc"),
        "test_acc": state.metrics.get("test_acc"),
        "stop_reason": state.stop_reason or ("max_steps" if cfg.max_steps and state.step >= cfg.max_steps
                                             else "epochs"),
        "model": cfg.model,
        "precision": run.precision,
        "device": str(run.device),
        "threads": torch.get_num_threads(),
        "run_dir": str(run.run_dir),
    }
    if tb is not None:
        xb = next(iter(run.val_loader or run.test_loader))[0][:1]
        tb.add_graph(run.raw_model.eval(), xb)
        tb.close()
    metrics.close()
    from .fsutil import atomic_write_text

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
    rows += [("throughput", f"{s['img_per_s']:,.0f} img/s"),
             ("data wait", pct(s["data_wait_frac"])),
             ("peak memory", f"{s['peak_rss_mb']:,.0f} MB RSS"),
             ("val accuracy", pct(s["val_acc"])),
             ("test accuracy", pct(s["test_acc"])),
             ("run directory", s["run_dir"])]
    w = max(len(k) for k, _ in rows)
    line = "-" * (w + 3 + max(len(v) for _, v in rows))
    return "\n".join([line] + [f"{k:<{w}}   {v}" for k, v in rows] + [line])


def train(config: str | Path | None = None, **overrides) -> dict:
    """Python twin of ``mnistflow train``: ``train(recipe="seed-cnn", epochs=2)``."""
    from .recipes import get_recipe

    file = configmod.load_toml(config) if config else None
    recipe_name = overrides.get("recipe") or (file or {}).get("recipe")
    recipe = get_recipe(recipe_name) if recipe_name else None
    for k in ("data", "run_dir"):
        if isinstance(overrides.get(k), os.PathLike):
            overrides[k] = str(overrides[k])
    cfg = configmod.resolve(recipe, file, overrides)
    return fit(cfg)
