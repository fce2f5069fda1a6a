"""Training configuration: one dataclass; defaults < recipe < TOML file < flags.

Unknown keys (in a TOML file or a recipe) are errors. The resolved configuration is saved
in the run directory as ``config.toml`` and ``mnistflow train --config`` on it reproduces it.
"""
from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from mnistflow.core.errors import MnistflowError


@dataclass
class TrainConfig:
    # what to train on what
    recipe: str | None = None
    model: str = "seed-cnn"
    data: str | None = None  # records dir or raw input; None: $MNISTFLOW_DATA or mnist
    dataset: str | None = None  # a known dataset name (mnist, fashion-mnist, ...)
    run_dir: str | None = None  # default runs/<recipe-or-model>-<time>
    # how long
    epochs: float = 1.0
    max_steps: int | None = None  # stop after this many steps (tests, dry runs)
    target_acc: float | None = None  # stop once this accuracy is reached
    target_split: str = "val"  # which split the target is measured on: val or test
    # optimisation
    batch_size: int | str = 128  # per process; "auto": the fastest (CPU) / largest that fits (GPU)
    optimizer: str = "adam"
    lr: float = 1e-3
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    muon_lr: float = 0.1  # --optimizer muon: learning rate of the orthogonalized matrices
    muon_momentum: float = 0.8  # --optimizer muon: their momentum
    schedule: str = "constant"  # constant, step, cosine, onecycle, linear
    warmup: float = 0.0  # warm-up length as a fraction of all steps (or steps when >= 1)
    step_every: float = 1.0  # step schedule: epochs between decays
    step_gamma: float = 0.7
    label_smoothing: float = 0.0
    augment: bool = False  # on-device augmentation
    train_on: str = "train"  # train, or train+val: every labelled image (then no validation split)
    tta: int = 0  # test-time augmentation: average over this many extra 1-pixel shifts (0, 2, 4, 8)
    whiten: bool = False  # first convolution initialised to whiten its input patches (data-dependent)
    drop_last: bool = False  # the short last batch: drop it (stable shapes) or keep it
    # numerics and devices
    seed: int = 0
    precision: str = "auto"  # fp32, bf16, fp16, auto
    channels_last: bool = False
    device: str = "auto"  # auto, cpu, cuda, cuda:N (among CUDA_VISIBLE_DEVICES), mps
    threads: int | None = None  # intra-op; default $MNISTFLOW_THREADS, else the cores that other
    # processes leave free, shared among this machine's training processes
    interop_threads: int | None = None  # PyTorch's inter-op pool; default: PyTorch's (the cores)
    gpu_memory_fraction: float | None = None  # cap this process's share of its GPU's memory
    sync_bn: bool = False  # under torchrun on GPUs: batch norm statistics over the global batch
    compile: bool = False
    # observing
    log_every: int = 100  # steps between progress lines (and device syncs)
    eval_every: int | None = None  # steps between validation passes (default: each epoch)
    eval_batch_size: int = 500  # larger batches fall out of the CPU caches: 2.5x slower at 2000
    validate: bool = True  # evaluate the validation split at epoch ends (or every eval_every steps)
    profile_steps: str | None = None  # "A:B": profile optimizer steps A..B (Chrome trace, op tables)
    # memory
    resident: str = "auto"  # keep the data on the device: auto (when it fits), yes, no (stream it)
    memory_cap_mb: float | None = None  # refuse settings estimated to need more (default: free memory)
    # checkpoints (RUN/checkpoints) and resuming
    checkpoint_every: int | None = None  # steps between checkpoints
    checkpoint_secs: float | None = 600.0  # seconds between checkpoints
    keep_checkpoints: int = 3  # the last K are kept (plus the best); 0: no checkpoints
    resume: str | None = None  # "latest" or a checkpoint / run directory; never saved in config.toml
    init_from: str | None = None  # an npz (mnistflow export --format npz) to start from, by name
    init_only: str | None = None  # glob(s), comma separated: the names of init_from to restore
    tensorboard: bool = True
    json: bool = False
    quiet: bool = False


TRAIN_ON = ("train", "train+val")
TTA_VIEWS = (0, 2, 4, 8)  # extra views: left/right, + up/down, + the diagonals


def check_tta(views: int) -> None:
    """``--tta`` of ``train`` and ``eval``: one of ``TTA_VIEWS``."""
    if views not in TTA_VIEWS:
        raise MnistflowError(f"--tta must be one of {', '.join(map(str, TTA_VIEWS))}; got {views}")


def field_names() -> set[str]:
    return {f.name for f in fields(TrainConfig)}


def _check_keys(d: dict, where: str) -> None:
    unknown = sorted(set(d) - field_names())
    if unknown:
        raise MnistflowError(f"unknown configuration key(s): {', '.join(unknown)}", where)


def load_toml(path: str | Path) -> dict:
    """Flat ``key = value`` pairs from a TOML file; unknown keys are errors."""
    p = Path(path)
    try:
        d = tomllib.loads(p.read_text())
    except OSError as e:
        raise MnistflowError(f"cannot read: {e.strerror}", p) from None
    except tomllib.TOMLDecodeError as e:
        raise MnistflowError(f"not valid TOML ({e})", p) from None
    d.pop("version", None)  # written by save_toml for the reader's benefit
    _check_keys(d, str(p))
    return d


def resolve(recipe: dict | None = None, file: dict | None = None, flags: dict | None = None) -> TrainConfig:
    """Merge the layers (later wins; ``None`` flag values mean 'not given')."""
    merged: dict = {}
    for layer, where in ((recipe, "recipe"), (file, "config file"), (flags, "flags")):
        if layer:
            _check_keys(layer, where)
            merged.update({k: v for k, v in layer.items() if v is not None})
    cfg = TrainConfig(**merged)
    validate(cfg)
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Impossible settings fail before any work starts."""
    if cfg.lr <= 0:
        raise MnistflowError(f"--lr must be positive, got {cfg.lr}")
    if cfg.muon_lr <= 0:
        raise MnistflowError(f"--muon-lr must be positive, got {cfg.muon_lr}")
    if not 0 <= cfg.muon_momentum < 1:
        raise MnistflowError(f"--muon-momentum must be in [0, 1), got {cfg.muon_momentum}")
    if cfg.batch_size != "auto" and (not isinstance(cfg.batch_size, int) or cfg.batch_size <= 0):
        raise MnistflowError(f"--batch-size must be a positive integer or auto, got {cfg.batch_size}")
    if cfg.epochs <= 0:
        raise MnistflowError(f"--epochs must be positive, got {cfg.epochs}")
    if cfg.max_steps is not None and cfg.max_steps <= 0:
        raise MnistflowError(f"--max-steps must be positive, got {cfg.max_steps}")
    if cfg.target_acc is not None and not 0 < cfg.target_acc <= 1:
        raise MnistflowError(f"--target-acc must be in (0, 1], got {cfg.target_acc}")
    if cfg.target_split not in ("val", "test"):
        raise MnistflowError(f"--target-split must be val or test, got '{cfg.target_split}'")
    if cfg.precision not in ("auto", "fp32", "bf16", "fp16"):
        raise MnistflowError(f"--precision must be one of auto, fp32, bf16, fp16; got '{cfg.precision}'")
    if not 0 <= cfg.label_smoothing < 1:
        raise MnistflowError(f"--label-smoothing must be in [0, 1), got {cfg.label_smoothing}")
    if cfg.train_on not in TRAIN_ON:
        raise MnistflowError(f"--train-on must be one of {', '.join(TRAIN_ON)}; got '{cfg.train_on}'")
    if cfg.train_on == "train+val" and cfg.target_acc is not None and cfg.target_split == "val":
        raise MnistflowError("--target-acc is measured on the validation split, which --train-on "
                             "train+val trains on: add --target-split test")
    check_tta(cfg.tta)
    if cfg.resident not in ("auto", "yes", "no"):
        raise MnistflowError(f"--resident must be auto, yes or no; got '{cfg.resident}'")
    if cfg.profile_steps is not None:
        from mnistflow.training.observe.profiler import parse_steps

        parse_steps(cfg.profile_steps)
    if cfg.log_every <= 0:
        raise MnistflowError(f"--log-every must be positive, got {cfg.log_every}")
    if cfg.checkpoint_every is not None and cfg.checkpoint_every <= 0:
        raise MnistflowError(f"--checkpoint-every must be positive, got {cfg.checkpoint_every}")
    if cfg.checkpoint_secs is not None and cfg.checkpoint_secs <= 0:
        raise MnistflowError(f"--checkpoint-secs must be positive, got {cfg.checkpoint_secs}")
    if cfg.keep_checkpoints < 0:
        raise MnistflowError(f"--keep-checkpoints must be 0 or more, got {cfg.keep_checkpoints}")
    if cfg.threads is not None and cfg.threads <= 0:
        raise MnistflowError(f"--threads must be positive, got {cfg.threads}")
    if cfg.interop_threads is not None and cfg.interop_threads <= 0:
        raise MnistflowError(f"--interop-threads must be positive, got {cfg.interop_threads}")
    if cfg.gpu_memory_fraction is not None and not 0 < cfg.gpu_memory_fraction <= 1:
        raise MnistflowError(f"--gpu-memory-fraction must be in (0, 1], got {cfg.gpu_memory_fraction}")
    from mnistflow.models import get_entry
    from mnistflow.models.spec import looks_like_spec
    from mnistflow.training.optim import OPTIMIZERS, SCHEDULES

    if not looks_like_spec(cfg.model):
        get_entry(cfg.model)  # unknown name: an error listing the known ones

    if cfg.optimizer not in OPTIMIZERS:
        raise MnistflowError(f"unknown optimizer '{cfg.optimizer}' (known: {', '.join(OPTIMIZERS)})")
    if cfg.schedule not in SCHEDULES:
        raise MnistflowError(f"unknown schedule '{cfg.schedule}' (known: {', '.join(SCHEDULES)})")


def to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)


def save_toml(cfg: TrainConfig, path: str | Path) -> None:
    """Write the resolved configuration as TOML (``None`` values are left out)."""
    lines = ["# mnistflow resolved configuration: mnistflow train --config THIS_FILE", "version = 1"]
    for k, v in to_dict(cfg).items():
        if v is None or k == "resume":  # resuming is an action, not a setting
            continue
        lines.append(f"{k} = {json.dumps(v)}")  # JSON scalars are valid TOML scalars
    from mnistflow.core.fsutil import atomic_write_text

    atomic_write_text(path, "\n".join(lines) + "\n")
