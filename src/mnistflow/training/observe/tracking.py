"""What the trackers (TensorBoard, MLflow) record of a run, the one owner of the names: the
tag of each logged scalar, the run's hyperparameters, and its final figures."""
from __future__ import annotations

from numbers import Real

# A logged step's scalars -> their tags (the same in TensorBoard and MLflow)
TRAIN_TAGS = {"loss": "train/loss", "acc": "train/acc", "lr": "lr", "img_per_s": "throughput/img_per_s",
              "data_wait_frac": "pipeline/data_wait_frac", "queue_depth": "pipeline/queue_depth"}
TRAIN_OTHER = {"epoch", "rss_mb"}  # in the logs, not curves of their own
EVAL_KEYS = {"split", "acc", "loss", "n", "eval_s"}  # an evaluation's logs: <split>/loss, <split>/acc

# Settings that say how a run is watched or where it goes, not what it trains: no hyperparameters
_NOT_HPARAMS = {"run_dir", "resume", "quiet", "json", "tensorboard", "mlflow", "log_every"}
# The summary's figures recorded at the end, as run/<name>
FINAL = ("wall_s", "time_to_target_s", "train_s", "img_per_s", "train_img_per_s", "data_wait_frac",
         "peak_rss_mb")  # (val/acc, test/acc: curves of their own already)


def is_number(v: object) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def hparams(config: dict) -> dict:
    """The run's hyperparameters: its resolved settings (config.toml's), less those that only
    say how it is watched, and less those not set (None)."""
    return {k: v for k, v in config.items() if k not in _NOT_HPARAMS and v is not None}


def extras(logs: dict, known) -> dict:
    """The numbers in ``logs`` beyond ``known``: what a hook returned, under its own name."""
    return {k: v for k, v in logs.items() if k not in known and is_number(v)}


def final_figures(summary: dict) -> dict:
    """The run's figures from its summary, as ``run/<name>`` (those it has)."""
    return {f"run/{k}": summary[k] for k in FINAL if is_number(summary.get(k))}
