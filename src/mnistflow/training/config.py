"""Training configuration: one dataclass; defaults < recipe < TOML file < flags.

Each field carries its own ``--help`` text and help section (``dataclasses.field`` metadata,
see :func:`setting`): ``mnistflow train --help`` is generated from them, so a new setting is
documented where it is declared. Unknown keys (in a TOML file or a recipe) are errors. The
resolved configuration is saved in the run directory as ``config.toml`` and ``mnistflow
train --config`` on it reproduces it; once resolved, a ``TrainConfig`` is not changed (derive
a new one with ``dataclasses.replace``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from mnistflow.artifacts import rundir
from mnistflow.core.errors import MnistflowError

#: The sections of ``mnistflow train --help``, in order: name -> what they hold.
GROUPS: dict[str, str] = {
    "run": "what to run and where it goes",
    "data": "what to train on",
    "model": "the network and the weights it starts from",
    "optimization": "how long, and how the weights are updated",
    "precision/devices": "numerics, devices, threads and memory",
    "logging": "progress, evaluation, profiling and what the run writes",
    "checkpoints": "saving and resuming",
}


def setting(default: Any, group: str, help: str) -> Any:
    """A ``TrainConfig`` field with its ``--help`` text and section (one of ``GROUPS``)."""
    if group not in GROUPS:
        raise ValueError(f"unknown help group '{group}' (known: {', '.join(GROUPS)})")
    return dataclasses.field(default=default, metadata={"group": group, "help": help})


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run (the flags of ``mnistflow train``). Frozen: what was
    resolved is what runs and what config.toml records (``dataclasses.replace`` derives another)."""

    recipe: str | None = setting(
        None, "run", "a preset: softmax, seed-cnn, fast, best (flags override its values)")
    model: str = setting(
        "seed-cnn", "model", "a registered model (see 'mnistflow models') or a layer spec string")
    data: str | None = setting(
        None, "data", "records directory or raw data, prepared into the cache on first use "
                      "(default: $MNISTFLOW_DATA, else mnist)")
    dataset: str | None = setting(
        None, "data", "a known dataset name: mnist, fashion-mnist, kmnist, cifar10")
    run_dir: str | None = setting(
        None, "run", "where to write the run (default: runs/<recipe or model>-<time>)")
    epochs: float = setting(1.0, "optimization", "epochs to train (fractions allowed)")
    max_steps: int | None = setting(None, "optimization", "stop after this many steps")
    target_acc: float | None = setting(
        None, "optimization", "stop once this accuracy (e.g. 0.99) is reached; reports the time to it")
    target_split: str = setting("val", "optimization", "split the target is measured on: val or test")
    batch_size: int | str = setting(
        128, "optimization", "per process; under torchrun the global batch is this x processes; "
                             "auto: the fastest (CPU) or the largest that fits (GPU)")
    optimizer: str = setting(
        "adam", "optimization", "sgd, momentum, adadelta, adagrad, adam, adamw, rmsprop, muon "
                                "(orthogonalized updates for the hidden weight matrices, Nesterov "
                                "SGD for the rest)")
    lr: float = setting(1e-3, "optimization", "learning rate (under --optimizer muon: of all but "
                                              "the hidden weight matrices)")
    momentum: float = setting(0.9, "optimization", "momentum of --optimizer momentum, and of the "
                                                   "SGD part of muon")
    nesterov: bool = setting(False, "optimization", "Nesterov momentum (--optimizer momentum, muon)")
    weight_decay: float = setting(0.0, "optimization", "weight decay (L2 penalty; decoupled for adamw)")
    muon_lr: float = setting(
        0.1, "optimization", "--optimizer muon: learning rate of the hidden weight matrices (--lr: the rest)")
    muon_momentum: float = setting(
        0.8, "optimization", "--optimizer muon: momentum of the hidden weight matrices")
    schedule: str = setting("constant", "optimization", "constant, step, cosine, onecycle, linear")
    warmup: float = setting(
        0.0, "optimization", "linear warm-up: fraction of all steps (<1) or a number of steps")
    step_every: float = setting(1.0, "optimization", "--schedule step: epochs between decays")
    step_gamma: float = setting(0.7, "optimization", "--schedule step: the factor of each decay")
    label_smoothing: float = setting(0.0, "optimization", "label smoothing of the cross-entropy, in [0, 1)")
    augment: bool = setting(
        False, "data", "augment the training batches on the device (digits: small shifts and "
                       "rotations; colour images: padded crops and flips)")
    train_on: str = setting(
        "train", "data", "train, or train+val: every labelled image (no validation passes then)")
    tta: int = setting(
        0, "logging", "test-time augmentation: also average the predictions for N images shifted "
                      "by one pixel (2: left/right, 4: + up/down, 8: + diagonals) in evaluations")
    whiten: bool = setting(
        False, "model", "initialise the first convolution to whiten its input patches "
                        "(from 1,000 training images)")
    drop_last: bool = setting(
        False, "data", "drop the short last batch of each epoch (stable shapes) instead of training on it")
    seed: int = setting(0, "optimization", "seed of the initialisation, the data order and the augmentation")
    precision: str = setting(
        "auto", "precision/devices", "fp32, bf16, fp16 (CUDA) or auto (bf16 where the hardware is fast at it)")
    channels_last: bool = setting(
        False, "precision/devices", "channels-last memory layout for the model and its batches")
    device: str = setting(
        "auto", "precision/devices", "auto, cpu, cuda, cuda:N (among CUDA_VISIBLE_DEVICES) or mps")
    threads: int | None = setting(
        None, "precision/devices", "intra-op CPU threads (default: $MNISTFLOW_THREADS, else the usable "
                                   "cores other processes leave free, shared among the processes per machine)")
    interop_threads: int | None = setting(
        None, "precision/devices", "PyTorch's inter-op threads (default: PyTorch's, the number of cores)")
    gpu_memory_fraction: float | None = setting(
        None, "precision/devices", "cap this process's share of its GPU's memory, 0 < F <= 1 (CUDA only)")
    sync_bn: bool = setting(
        False, "precision/devices", "under torchrun on GPUs: batch norm statistics over the global batch")
    compile: bool = setting(False, "precision/devices", "compile the model with torch.compile")
    log_every: int = setting(100, "logging", "steps between progress lines (and device syncs)")
    eval_every: int | None = setting(
        None, "logging", "steps between validation passes (default: every epoch)")
    # larger evaluation batches fall out of the CPU caches: 2.5x slower at 2000
    eval_batch_size: int = setting(500, "logging", "batch size of the evaluation passes")
    validate: bool = setting(
        True, "logging", "evaluate the validation split at each epoch end (or every --eval-every steps)")
    profile_steps: str | None = setting(
        None, "logging", "A:B profiles optimizer steps A..B: Chrome trace, op tables, step breakdown")
    resident: str = setting(
        "auto", "data", "keep the data on the device: auto (when it fits), yes, or no (stream it from disk)")
    memory_cap_mb: float | None = setting(
        None, "precision/devices", "refuse settings estimated to need more memory than this "
                                   "(default: what is free)")
    checkpoint_every: int | None = setting(
        None, "checkpoints", f"steps between checkpoints (RUN/{rundir.CHECKPOINTS}; also at the end "
                             "and on a new best)")
    checkpoint_secs: float | None = setting(600.0, "checkpoints", "seconds between checkpoints")
    keep_checkpoints: int = setting(
        3, "checkpoints", "checkpoints to keep (plus the best); 0 turns checkpoints off")
    # an action, not a setting: never saved in config.toml
    resume: str | None = setting(
        None, "checkpoints", "continue from the latest checkpoint of --run-dir, or from PATH "
                             "(a checkpoint or run directory)")
    init_from: str | None = setting(
        None, "model", "start from the arrays of an npz (mnistflow export --format npz), by name")
    init_only: str | None = setting(
        None, "model", "glob(s), comma separated, of the names --init-from restores (e.g. 'conv*')")
    tensorboard: bool = setting(True, "logging", f"write TensorBoard event files (RUN/{rundir.TENSORBOARD})")
    json: bool = setting(False, "logging", "print a JSON summary of the run as the last line")
    quiet: bool = setting(False, "logging", "no progress lines on the console")


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
    import tomllib

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
    import json

    lines = ["# mnistflow resolved configuration: mnistflow train --config THIS_FILE", "version = 1"]
    for k, v in to_dict(cfg).items():
        if v is None or k == "resume":  # resuming is an action, not a setting
            continue
        lines.append(f"{k} = {json.dumps(v)}")  # JSON scalars are valid TOML scalars
    from mnistflow.core.fsutil import atomic_write_text

    atomic_write_text(path, "\n".join(lines) + "\n")
