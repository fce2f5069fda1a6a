"""Training configuration: one frozen dataclass, and the pure merge of its layers.

Each field is declared once with :func:`setting`: its type, ``--help`` text and help section,
the values it accepts (a :class:`Rule`) and how its flag is parsed. ``mnistflow train --help``,
the TOML reader and the checks all come from that declaration. A ``TrainConfig`` is checked when
it is built (``__post_init__``), so every one in existence is valid; derive another with
``dataclasses.replace``. :func:`resolve` merges defaults < base < recipe < file < flags, and
``config.toml`` in a run directory reproduces the run (``mnistflow train --config``).

No torch here: the CLI's ``--help`` and the resolution are testable and fast without it.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from mnistflow.artifacts import rundir
from mnistflow.core import choices, compat, limits
from mnistflow.core.errors import MnistflowError
from mnistflow.data import known

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

MAX_RATE = 1000  # a learning rate or decay above this is a typo, not a setting
MAX_EPOCHS = 1_000_000  # epochs x batches must count in 64 bits; --max-steps stops one sooner


@dataclass(frozen=True)
class Rule:
    """The values a setting accepts: its ``kind`` (bool, int, float, str), ``choices`` (the only
    values of that kind, or words accepted beside numbers, as ``auto`` for --batch-size) and
    bounds, exclusive (``above``, ``below``) or inclusive (``at_least``, ``at_most``). Numbers
    are finite; text holds no NUL and is valid UTF-8 (config.toml must hold it)."""

    kind: type = str
    choices: tuple = ()
    above: float | None = None
    at_least: float | None = None
    below: float | None = None
    at_most: float | None = None

    def describe(self) -> str:
        """What a valid value is, in the words of an error message: 'positive', 'in [0, 1)',
        'one of val, test', 'a positive integer or auto'."""
        if self.kind is bool:
            return "true or false"
        same = [c for c in self.choices if type(c) is self.kind]
        if same:
            return "one of " + ", ".join(map(str, same))
        if self.kind is str:
            return "text"
        words = [c for c in self.choices if isinstance(c, str)]
        return " or ".join([self._bounds(), *words])

    def _bounds(self) -> str:
        lo, lo_open = (self.above, True) if self.above is not None else (self.at_least, False)
        hi, hi_open = (self.below, True) if self.below is not None else (self.at_most, False)
        integer = self.kind is int
        noun = "an integer" if integer else "a number"
        if lo is not None and hi is not None:
            where = f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
            return f"{noun} {where}" if integer else where
        if lo is not None:
            if (lo_open and lo == 0) or (integer and not lo_open and lo == 1):
                return "a positive integer" if integer else "positive"
            return f"{noun} {'>' if lo_open else '>='} {lo}"
        return noun

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not valid (``None``: it is)."""
        if any(type(value) is type(c) and value == c for c in self.choices):
            return None  # one of the choices (True is no 1: the types must match)
        if self.kind is dict:
            return None if isinstance(value, dict) and tomlable(value) else (
                "a table of names to plain values (text, numbers, true/false, lists, tables; "
                "no null: config.toml must hold it)")
        if self.kind is bool:
            return None if isinstance(value, bool) else "true or false"
        if self.kind is str:
            if not isinstance(value, str):
                return "text"
            if "\0" in value:
                return "text without NUL characters"
            if not _utf8(value):  # undecodable bytes of a path (surrogate escapes)
                return "valid UTF-8 text (config.toml and the model file cannot record other bytes)"
            return self.describe() if self.choices else None
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if self.kind is int and not is_int:  # (a word beside the numbers: say both)
            return self.describe() if any(isinstance(c, str) for c in self.choices) else "an integer"
        if self.kind is float and not (is_int or isinstance(value, float)):
            return "a number"
        if not math.isfinite(value):  # nan passes every comparison below
            return "a finite number"
        if any(type(c) is self.kind for c in self.choices):  # numbers to choose from: not one of them
            return self.describe()
        if ((self.above is not None and not value > self.above)
                or (self.at_least is not None and not value >= self.at_least)
                or (self.below is not None and not value < self.below)
                or (self.at_most is not None and not value <= self.at_most)):
            return self.describe()
        if is_int and not -limits.MAX_INT - 1 <= value <= limits.MAX_INT:
            return f"at most {limits.MAX_INT} (a 64-bit integer)"
        return None


def tomlable(v: Any) -> bool:
    """Whether ``v`` can be written to config.toml and read back the same: text, finite numbers,
    booleans, and lists and tables (string keys) of them."""
    if isinstance(v, dict):
        return all(isinstance(k, str) and _utf8(k) and tomlable(x) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return all(tomlable(x) for x in v)
    if isinstance(v, float):
        return math.isfinite(v)
    return isinstance(v, (bool, int)) or (isinstance(v, str) and "\0" not in v and _utf8(v))


def _json_table(text: str) -> dict:
    """--model-kwargs: a JSON object."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object like '{{\"width\": 64}}', got '{text}'")
    return value


def _utf8(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8: a path holding bytes that are not UTF-8 reaches
    Python as lone surrogates ('\\udcff'), which no UTF-8 file (config.toml) can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _batch_size(text: str) -> int | str:
    """--batch-size: a number or ``auto``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or auto, got '{text}'") from None


def setting(default: Any, group: str, help: str, *, kind: type | None = None, choices: tuple = (),
            above: float | None = None, at_least: float | None = None, below: float | None = None,
            at_most: float | None = None, optional: bool | None = None,
            parse: Callable[[str], Any] | None = None, flag: dict | None = None) -> Any:
    """A ``TrainConfig`` field: its ``--help`` text and section (one of ``GROUPS``), the values it
    accepts (a :class:`Rule`; ``kind`` defaults to the default's type; ``optional``: None, 'not
    set', is a value, as it is where the default is None) and its flag: ``parse``
    turns the flag's text into a value (default: ``kind``), ``flag`` holds argparse options
    beyond it (``nargs``, ``const``, ``metavar``; ``"off"``: a ``--no-<flag>`` that stores it)."""
    if group not in GROUPS:
        raise ValueError(f"unknown help group '{group}' (known: {', '.join(GROUPS)})")
    kind = kind or type(default)
    rule = Rule(kind, tuple(choices), above, at_least, below, at_most)
    return dataclasses.field(default=default, metadata={
        "group": group, "help": help, "rule": rule, "parse": parse or kind, "flag": dict(flag or {}),
        "optional": default is None if optional is None else optional})


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run (the flags of ``mnistflow train``). Checked when built,
    frozen after: what was resolved is what runs and what config.toml records."""

    recipe: str | None = setting(
        None, "run", "a preset: softmax, seed-cnn, fast, fast-plus, mid, best (flags override its values)",
        kind=str)
    model: str = setting(
        "seed-cnn", "model", "a registered model (see 'mnistflow models'), a layer spec string, or "
                             "'package.module:name', a model class or factory of yours (importable)")
    model_kwargs: dict | None = setting(
        None, "model", "the keyword arguments of --model package.module:name, as a JSON object (e.g. "
                       "'{\"width\": 64}'); in_shape and num_classes come from the data when it takes them",
        kind=dict, parse=_json_table)
    data: str | None = setting(
        None, "data", "records directory or raw data, prepared into the cache on first use "
                      "(default: $MNISTFLOW_DATA, else mnist)", kind=str)
    dataset: str | None = setting(None, "data", f"a known dataset: {known.HELP}", kind=str)
    run_dir: str | None = setting(
        None, "run", "where to write the run (default: runs/<recipe or model>-<time>)", kind=str)
    epochs: float = setting(1.0, "optimization", "epochs to train (fractions allowed)", above=0,
                            at_most=MAX_EPOCHS)
    max_steps: int | None = setting(None, "optimization", "stop after this many steps", kind=int,
                                    at_least=1)
    target_acc: float | None = setting(
        None, "optimization", "stop once this accuracy (e.g. 0.99) is reached; reports the time to it",
        kind=float, above=0, at_most=1)
    target_split: str = setting("val", "optimization", "split the target is measured on: val or test",
                                choices=("val", "test"))
    batch_size: int | str = setting(
        128, "optimization", "images per step, all processes together (under --nproc N or torchrun each "
                             "process takes 1/N of it); auto: the fastest (CPU) or the largest that fits "
                             "(GPU) per process",
        choices=("auto",), at_least=1, parse=_batch_size)
    optimizer: str = setting(
        "adam", "optimization", "sgd, momentum, adadelta, adagrad, adam, adamw, rmsprop, muon "
                                "(orthogonalized updates for the hidden weight matrices, Nesterov "
                                "SGD for the rest)", choices=choices.OPTIMIZERS)
    lr: float = setting(1e-3, "optimization", "learning rate (under --optimizer muon: of all but "
                                              "the hidden weight matrices)", above=0, at_most=MAX_RATE)
    momentum: float = setting(0.9, "optimization", "momentum of --optimizer momentum, and of the "
                                                   "SGD part of muon", at_least=0, below=1)
    nesterov: bool = setting(False, "optimization", "Nesterov momentum (--optimizer momentum, muon)")
    weight_decay: float = setting(0.0, "optimization", "weight decay (L2 penalty; decoupled for adamw)",
                                  at_least=0, at_most=MAX_RATE)
    muon_lr: float = setting(
        0.1, "optimization", "--optimizer muon: learning rate of the hidden weight matrices (--lr: the rest)",
        above=0, at_most=MAX_RATE)
    muon_momentum: float = setting(
        0.8, "optimization", "--optimizer muon: momentum of the hidden weight matrices", at_least=0, below=1)
    schedule: str = setting("constant", "optimization", "constant, step, cosine, onecycle, linear",
                            choices=choices.SCHEDULES)
    warmup: float = setting(
        0.0, "optimization", "linear warm-up: fraction of all steps (<1) or a number of steps", at_least=0)
    step_every: float = setting(1.0, "optimization", "--schedule step: epochs between decays", above=0)
    step_gamma: float = setting(0.7, "optimization", "--schedule step: the factor of each decay",
                                above=0, at_most=1)
    label_smoothing: float = setting(0.0, "optimization", "label smoothing of the cross-entropy, in [0, 1)",
                                     at_least=0, below=1)
    augment: str = setting(
        "off", "data", "augment the training batches on the device: auto (the dataset's own policy; "
                       "shifts for inputs it does not know), off, or a policy: glyphs (small shifts "
                       "and rotations, never flips: digits, letters), elastic (glyphs plus elastic "
                       "distortion), clothing (horizontal flips and "
                       "shifted crops), photos (padded crops, flips and cutout), shifts (small shifts "
                       "only); the run records the policy it used",
        choices=choices.AUGMENT, flag=dict(nargs="?", const="auto", metavar="POLICY", off="off"))
    train_on: str = setting(
        "train", "data", "train, or train+val: every labelled image (no validation passes then)",
        choices=("train", "train+val"))
    tta: int = setting(
        0, "logging", "test-time augmentation: also average the predictions for N images shifted "
                      "by one pixel (2: left/right, 4: + up/down, 8: + diagonals) in evaluations",
        choices=choices.TTA_VIEWS)
    whiten: bool = setting(
        False, "model", "initialise the first convolution to whiten its input patches "
                        "(from 1,000 training images)")
    drop_last: bool = setting(
        False, "data", "drop the short last batch of each epoch (stable shapes) instead of training on it")
    seed: int = setting(0, "optimization", "seed of the initialisation, the data order and the augmentation",
                        at_least=0, at_most=limits.MAX_SEED)
    precision: str = setting(
        "auto", "precision/devices", "fp32, bf16, fp16 (CUDA) or auto (bf16 where the hardware is fast at it)",
        choices=choices.PRECISIONS)
    channels_last: bool = setting(
        False, "precision/devices", "channels-last memory layout for the model and its batches")
    device: str = setting(
        "auto", "precision/devices", "auto, cpu, cuda, cuda:N (among CUDA_VISIBLE_DEVICES) or mps")
    kernels: str = setting(
        "auto", "precision/devices", "mnistflow's native CPU kernels: auto (those this CPU runs, each "
        "checked against PyTorch when loaded) or off (PyTorch's ops only); the run records which it "
        "used", choices=("auto", "off"))
    threads: int | None = setting(
        None, "precision/devices", "intra-op CPU threads (default: $MNISTFLOW_THREADS, else the usable "
                                   "cores other processes leave free, shared among the processes per machine)",
        kind=int, at_least=1, at_most=limits.MAX_THREADS)
    interop_threads: int | None = setting(
        None, "precision/devices", "PyTorch's inter-op threads (default: PyTorch's, the number of cores)",
        kind=int, at_least=1, at_most=limits.MAX_THREADS)
    gpu_memory_fraction: float | None = setting(
        None, "precision/devices", "cap this process's share of its GPU's memory, 0 < F <= 1 (CUDA only)",
        kind=float, above=0, at_most=1)
    sync_bn: bool = setting(
        False, "precision/devices", "under torchrun on GPUs: batch norm statistics over the global batch")
    compile: bool = setting(False, "precision/devices", "compile the model with torch.compile")
    cuda_graphs: str = setting(
        "off", "precision/devices", "auto: on a CUDA GPU, replay the whole training step (forward, "
        "backward, Muon) as one CUDA graph after 3 eager steps, where the run allows it (one "
        "process, --optimizer muon, not fp16 or --compile); off: launch every kernel each step",
        choices=("auto", "off"))
    log_every: int = setting(100, "logging", "steps between progress lines (and device syncs)", at_least=1)
    eval_every: int | None = setting(
        None, "logging", "steps between validation passes (default: every epoch)", kind=int, at_least=1)
    # larger evaluation batches fall out of the CPU caches (BENCHMARKS.md)
    eval_batch_size: int = setting(500, "logging", "batch size of the evaluation passes", at_least=1)
    validate: bool = setting(
        True, "logging", "evaluate the validation split at each epoch end (or every --eval-every steps)")
    profile_steps: str | None = setting(
        None, "logging", "A:B profiles optimizer steps A..B: Chrome trace, op tables, step breakdown",
        kind=str)
    resident: str = setting(
        "auto", "data", "keep the data on the device: auto (when it fits), yes, or no (stream it from disk)",
        choices=("auto", "yes", "no"))
    memory_cap_mb: float | None = setting(
        None, "precision/devices", "refuse settings estimated to need more memory than this "
                                   "(default: what is free)", kind=float, above=0)
    checkpoint_every: int | None = setting(
        None, "checkpoints", f"steps between checkpoints (RUN/{rundir.CHECKPOINTS}; also at the end "
                             "and on a new best)", kind=int, at_least=1)
    checkpoint_secs: float | None = setting(600.0, "checkpoints", "seconds between checkpoints", above=0,
                                            optional=True)
    keep_checkpoints: int = setting(
        3, "checkpoints", "checkpoints to keep (plus the best); 0 turns checkpoints off", at_least=0)
    # an action, not a setting: never saved in config.toml
    resume: str | None = setting(
        None, "checkpoints", "continue from the latest checkpoint of --run-dir, or from PATH "
                             "(a checkpoint or run directory)",
        kind=str, flag=dict(nargs="?", const="latest", metavar="PATH"))
    init_from: str | None = setting(
        None, "model", "start from the arrays of an npz (mnistflow export --format npz), by name", kind=str)
    init_only: str | None = setting(
        None, "model", "glob(s), comma separated, of the names --init-from restores (e.g. 'conv*')", kind=str)
    tensorboard: bool = setting(True, "logging", f"write TensorBoard event files (RUN/{rundir.TENSORBOARD})")
    mlflow: str | None = setting(
        None, "logging", "log the run to MLflow (settings, metrics, model file) at URI: a server "
                         "(http://host:5000), a database (sqlite:///mlflow.db); auto, or no URI: "
                         "$MLFLOW_TRACKING_URI, else MLflow's default (pip install 'mnistflow[mlflow]')",
        kind=str, flag=dict(nargs="?", const="auto", metavar="URI"))
    json: bool = setting(False, "logging", "print a JSON summary of the run as the last line")
    quiet: bool = setting(
        False, "logging", "no progress lines or warnings on the console (warnings stay in summary.json)")

    def __post_init__(self) -> None:
        check_config(self)


def flag(name: str) -> str:
    """The command-line flag of field ``name``: ``batch_size`` -> ``--batch-size``."""
    return "--" + name.replace("_", "-")


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in fields(TrainConfig)}


def _show(value: Any) -> str:
    text = repr(value)  # one line whatever the value holds (newlines are escaped)
    return text if len(text) <= 60 else text[:57] + "..."


def check_value(name: str, value: Any, label: str | None = None) -> None:
    """Check one value of setting ``name`` against its :class:`Rule`; an error names it as
    ``label`` (default: its flag, ``--name``). ``None`` is 'not set', allowed where the default is."""
    f = FIELDS[name]
    if value is None and f.metadata["optional"]:
        return
    problem = f.metadata["rule"].problem(value)
    if problem:
        raise MnistflowError(f"{label or flag(name)} must be {problem}, got {_show(value)}")


def check_config(cfg: TrainConfig) -> None:
    """Every field against its own rule, then the rules that involve several fields. What needs
    the machine (the model registry, the device, files, the environment) is checked by
    ``training.setup.check_run_inputs``."""
    for f in fields(cfg):
        check_value(f.name, getattr(cfg, f.name))
    if cfg.target_acc is not None and cfg.target_split == "val":
        # the target is only compared after a validation pass (records without a val split:
        # check_target_split, once they are open)
        if cfg.train_on == "train+val":
            raise MnistflowError("--target-acc is measured on the validation split, which --train-on "
                                 "train+val trains on: add --target-split test")
        if not cfg.validate and not cfg.eval_every:
            raise MnistflowError("--target-acc is measured on the validation split, which a run with "
                                 "validation off (--no-validate) never evaluates: add --target-split test "
                                 "(or --validate)")
    if cfg.nesterov and cfg.optimizer == "momentum" and cfg.momentum == 0:
        raise MnistflowError("--nesterov needs a --momentum above 0")
    if cfg.init_only is not None and not cfg.init_from:
        raise MnistflowError("--init-only selects what --init-from loads: give --init-from NPZ too")
    if cfg.model_kwargs is not None and not is_import_path(cfg.model):
        raise MnistflowError(f"--model-kwargs are the arguments of a model class or factory "
                             f"(--model package.module:name); '{_show(cfg.model)[1:-1]}' is a registered "
                             "name or a spec")


def is_import_path(model: str) -> bool:
    """Whether ``model`` names a user's class or factory, ``package.module:name`` (a registered
    name or a layer spec holds no colon)."""
    return ":" in model


def check_target_split(cfg: TrainConfig, holds: Callable[[str], bool], where: str | Path) -> None:
    """``--target-acc`` is compared on ``cfg.target_split``: records that do not hold that split
    (``holds``: ``Records.has``; prep --val-size 0 makes none for val) could never stop the run."""
    if cfg.target_acc is None or holds(cfg.target_split):
        return
    other = "test" if cfg.target_split == "val" else "val"
    raise MnistflowError(f"--target-acc is measured on the {cfg.target_split} split, which these records "
                         "do not hold" + (f": add --target-split {other}" if holds(other) else ""), where)


# Other frameworks' names for settings mnistflow has under another name (for "did you mean")
_OTHER_NAMES = {"learning_rate": "lr", "max_epochs": "epochs", "num_epochs": "epochs", "bs": "batch_size",
                "train_batch_size": "batch_size", "optim": "optimizer", "scheduler": "schedule",
                "lr_scheduler": "schedule", "max_iters": "max_steps", "num_workers": "threads"}


def suggest(key: str) -> str | None:
    """The setting a mistyped or foreign ``key`` most likely means (``learning_rate`` -> ``lr``)."""
    key = key.replace("-", "_")
    if key in _OTHER_NAMES:
        return _OTHER_NAMES[key]
    close = difflib.get_close_matches(key, FIELDS, n=1, cutoff=0.75)
    return close[0] if close else None


def _check_keys(d: dict, where: str) -> None:
    unknown = sorted(set(d) - set(FIELDS))
    if unknown:
        hints = [f"{k} -> {s}" for k in unknown if (s := suggest(k))]
        raise MnistflowError(f"unknown configuration key(s): {', '.join(unknown)}"
                             + (f" (did you mean: {', '.join(hints)}?)" if hints else ""), where)


def merge(recipe: dict | None = None, file: dict | None = None, flags: dict | None = None, *,
          base: dict | None = None) -> dict:
    """The settings given, layer over layer (later wins; a ``None`` value means 'not given'):
    ``base`` (a resumed run's own) < ``recipe`` < ``file`` < ``flags``. Unknown keys are errors."""
    merged: dict = {}
    for layer, where in ((base, "resumed run"), (recipe, "recipe"), (file, "config file"), (flags, "flags")):
        if layer:
            _check_keys(layer, where)
            merged.update({k: v for k, v in layer.items() if v is not None})
    return merged


def resolve(recipe: dict | None = None, file: dict | None = None, flags: dict | None = None, *,
            base: dict | None = None) -> TrainConfig:
    """The configuration of these layers (:func:`merge`), checked."""
    return TrainConfig(**merge(recipe, file, flags, base=base))


RUN_ID = "run_id"  # written in config.toml beside the settings: the run the file belongs to


def load_toml(path: str | Path) -> dict:
    """Flat ``key = value`` pairs from a TOML file (UTF-8, at most ``limits.MAX_TOML_BYTES``); unknown
    keys and values of the wrong type or out of range are errors naming the file and the key."""
    tomllib = compat.tomllib()
    p = Path(path)
    try:
        with open(p, "rb") as fh:  # bounded: --config /dev/zero is not read to the end
            data = fh.read(limits.MAX_TOML_BYTES + 1)
    except OSError as e:
        raise MnistflowError(f"cannot read: {e.strerror}", p) from None
    if len(data) > limits.MAX_TOML_BYTES:
        raise MnistflowError(f"larger than {limits.MAX_TOML_BYTES >> 20} MiB: not a configuration file", p)
    try:
        d = tomllib.loads(data.decode("utf-8-sig"))  # a BOM, as some editors write, is no error
    except UnicodeDecodeError as e:
        raise MnistflowError(f"not UTF-8 text (byte {e.start})", p) from None
    except RecursionError:
        raise MnistflowError("not valid TOML (nested too deeply)", p) from None
    except ValueError as e:  # TOMLDecodeError, and an integer of more than 4300 digits
        raise MnistflowError(f"not valid TOML ({str(e).splitlines()[0]})", p) from None
    d.pop("version", None)  # written by save_toml for the reader's benefit
    d.pop(RUN_ID, None)  # which run wrote the file (run_id_in): not a setting
    _check_keys(d, str(p))
    for key, value in d.items():
        try:
            check_value(key, value, label=key)
        except MnistflowError as e:
            raise MnistflowError(e.detail, p) from None
    return d


def to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)


def save_toml(cfg: TrainConfig, path: str | Path, run_id: str | None = None) -> None:
    """Write the resolved configuration as TOML (``None`` values and ``resume``, an action, left
    out), with ``tomli_w``; ``load_toml`` reads back the same values, whatever the text holds.
    ``run_id``: the run the file belongs to (its checkpoints carry it too: ``training.resume``)."""
    import tomli_w

    from mnistflow.core.fsutil import atomic_write_text

    values = {k: v for k, v in to_dict(cfg).items() if v is not None and k != "resume"}
    head = {"version": 1, **({RUN_ID: run_id} if run_id else {})}
    atomic_write_text(path, "# mnistflow resolved configuration: mnistflow train --config THIS_FILE\n"
                      + tomli_w.dumps({**head, **values}))


def run_id_in(path: str | Path) -> str | None:
    """The ``run_id`` a run's config.toml records (None: none, from an older mnistflow)."""
    tomllib = compat.tomllib()
    try:
        with open(path, "rb") as fh:
            value = tomllib.loads(fh.read(limits.MAX_TOML_BYTES).decode("utf-8-sig")).get(RUN_ID)
    except (OSError, ValueError, RecursionError):  # (load_toml names what is wrong with it)
        return None
    return value if isinstance(value, str) else None
