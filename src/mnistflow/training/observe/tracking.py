"""What the trackers (TensorBoard, MLflow) record of a run, the one owner of the names: the
tag of each scalar an event brings, the run's hyperparameters, and its final figures."""
from __future__ import annotations

import json
from numbers import Real

from mnistflow.training.hooks import EPOCH_KEYS

# A logged step's scalars -> their tags (the same in TensorBoard and MLflow)
_TRAIN_TAGS = {"loss": "train/loss", "acc": "train/acc", "lr": "lr", "img_per_s": "throughput/img_per_s",
               "data_wait_frac": "pipeline/data_wait_frac", "queue_depth": "pipeline/queue_depth"}
_TRAIN_OTHER = {"epoch", "rss_mb"}  # in a step's logs, not curves of their own
_EVAL_KEYS = {"split", "acc", "loss", "n", "eval_s"}  # an evaluation's logs: <split>/loss, <split>/acc

# Settings that say how a run is watched or where it goes, not what it trains: no hyperparameters
_NOT_HPARAMS = {"run_dir", "resume", "quiet", "json", "tensorboard", "mlflow", "log_every"}
# The summary's figures recorded at the end, as run/<name>
_FINAL = ("wall_s", "time_to_target_s", "train_s", "img_per_s", "train_img_per_s", "data_wait_frac",
          "peak_rss_mb")  # (val/acc, test/acc: curves of their own already)


def _is_number(v: object) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def _extras(logs: dict, known) -> dict:
    """The numbers in ``logs`` beyond ``known``: what a hook returned, under its own name."""
    return {k: v for k, v in logs.items() if k not in known and _is_number(v)}


def step_scalars(logs: dict) -> dict:
    """A logged step's scalars by tag (``train/loss``, ``lr``...), and what a hook returned."""
    return {tag: logs[k] for k, tag in _TRAIN_TAGS.items() if k in logs} | \
        _extras(logs, _TRAIN_TAGS.keys() | _TRAIN_OTHER)


def eval_scalars(logs: dict) -> dict:
    """An evaluation's scalars (``val/loss``, ``test/acc``...), and what a hook returned."""
    split = logs["split"]
    return {f"{split}/loss": logs["loss"], f"{split}/acc": logs["acc"]} | \
        _extras(logs, _EVAL_KEYS | {f"{split}_acc", f"{split}_loss"})


def epoch_scalars(logs: dict) -> dict:
    """What a hook returned at an epoch's end (the loop's own figures are curves already)."""
    return _extras(logs, EPOCH_KEYS)


def hparams(config: dict) -> dict:
    """The run's hyperparameters: its resolved settings (config.toml's), less those that only
    say how it is watched and those not set; a table or a list (``model_kwargs``) as its JSON
    text, since the trackers take numbers, strings and booleans only."""
    return {k: v if isinstance(v, (str, bool, Real)) else json.dumps(v, sort_keys=True)
            for k, v in config.items() if k not in _NOT_HPARAMS and v is not None}


def final_figures(summary: dict) -> dict:
    """The run's figures from its summary, as ``run/<name>`` (those it has)."""
    return {f"run/{k}": summary[k] for k in _FINAL if _is_number(summary.get(k))}
