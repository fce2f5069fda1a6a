"""Log a run to MLflow: its settings as params, the curves as metrics, its files as artifacts.

    mnistflow train --recipe fast --mlflow                  # $MLFLOW_TRACKING_URI, else MLflow's default
    mnistflow train --recipe fast --mlflow http://127.0.0.1:5000
    mnistflow.train("fast", callbacks=[mnistflow.MLflowLogger("sqlite:///mlflow.db")])

A hook (``training.hooks``), on rank 0 only. What it records, under the names TensorBoard uses
(``observe.tracking``): the run's hyperparameters (params), each logged step's scalars
(``train/loss``, ``lr``, ``throughput/img_per_s``...) and each evaluation's (``val/acc``,
``test/loss``...) at their step, what a hook returned, the final figures (``run/wall_s``...);
then ``config.toml``, ``summary.json`` and the model file (``model.safetensors``) as artifacts.
The MLflow run is tagged with the run directory; a resumed run continues its MLflow run.

MLflow is imported here only (``pip install 'mnistflow[mlflow]'``). A store that cannot be
reached when training starts is an error (one line); a failure later is one warning, and the
run goes on without MLflow (the run directory keeps every record).
"""
from __future__ import annotations

import hashlib
import importlib.util
import sys
import time
from pathlib import Path

from mnistflow.artifacts.rundir import RunDir
from mnistflow.core.errors import MnistflowError
from mnistflow.core.log import warn
from mnistflow.training.observe.tracking import (EVAL_KEYS, TRAIN_OTHER, TRAIN_TAGS, extras, final_figures,
                                                 hparams)

INSTALL = "pip install 'mnistflow[mlflow]'"
_PARAM_CHARS = 6000  # MLflow's limit on a param's value


def check_available() -> None:
    """Fail at once (one line) when MLflow is not installed: before a run starts."""
    if importlib.util.find_spec("mlflow") is None:
        raise MnistflowError(f"--mlflow needs the optional package 'mlflow': {INSTALL}")


def _first_sentence(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if "MLFLOW_ALLOW_FILE_STORE" in text or "maintenance mode" in text:
        return ("MLflow 3 refuses its file store unless MLFLOW_ALLOW_FILE_STORE=true is set; "
                "or use sqlite:///mlflow.db or a tracking server")
    if "sqlite" in text and ("registry" in text.lower() or "sqlalchemy" in text.lower()):
        return f"a sqlite store needs the full mlflow package ({INSTALL}), not mlflow-skinny"
    first = text.split(". ")[0]
    return first if len(first) <= 200 else first[:197] + "..."


class MLflowLogger:
    """Log the run to MLflow (the module docstring says what). ``tracking_uri``: a server
    (``http://host:5000``), a database (``sqlite:///mlflow.db``) or None (MLflow's choice:
    ``$MLFLOW_TRACKING_URI``, else its default); ``experiment``: the experiment's name (created
    when new); ``run_name``: the MLflow run's name (default: the run directory's); ``log_model``:
    upload the model file too; ``tags``: more tags for the MLflow run."""

    def __init__(self, tracking_uri: str | None = None, experiment: str = "mnistflow",
                 run_name: str | None = None, log_model: bool = True, tags: dict | None = None):
        check_available()
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.log_model, self.tags = log_model, dict(tags or {})
        self.client = None
        self.run_id: str | None = None
        self.run_dir: Path | None = None
        self._failed = False

    # --- the MLflow calls -----------------------------------------------------------------
    def _call(self, what: str, fn, *args, **kwargs):
        """An MLflow call during training: a failure is one warning, and MLflow is left alone
        from then on (the run goes on; its own files keep the record)."""
        if self.run_id is None or self._failed:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # MlflowException, a server gone, a full disk: the tracker's, not the run's
            self._failed = True
            warn(f"MLflow: {what} failed ({_first_sentence(e)}); the run goes on without MLflow")
            return None

    def _log(self, step: int, values: dict) -> None:
        if not values:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._call("logging metrics", self.client.log_batch, self.run_id,
                   metrics=[Metric(k, float(v), now, step) for k, v in values.items()])

    # --- hooks ----------------------------------------------------------------------------
    def on_train_start(self, logs: dict) -> None:
        if not _rank_zero():
            return
        self.run_dir = Path(logs["run_dir"]) if logs.get("run_dir") else None
        try:
            self._open(logs)
        except MnistflowError:
            raise
        except Exception as e:
            where = self.tracking_uri or "the default store"
            raise MnistflowError(f"MLflow ({where}): {_first_sentence(e)}") from None

    def _open(self, logs: dict) -> None:
        """Connect, find or make the experiment, continue this run directory's MLflow run (a
        resume) or start one, and record the params."""
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = client = MlflowClient(self.tracking_uri)
        exp = client.get_experiment_by_name(self.experiment)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(self.experiment)
        key = hashlib.sha256(str(self.run_dir).encode()).hexdigest()[:16]
        found = client.search_runs([exp_id], f"tags.`mnistflow.run_key` = '{key}'", max_results=1,
                                   order_by=["attributes.start_time DESC"]) if logs.get("start_step") else []
        if found:
            self.run_id = found[0].info.run_id
            client.update_run(self.run_id, status="RUNNING")
        else:
            tags = {"mnistflow.run_dir": str(self.run_dir), "mnistflow.run_key": key, **self.tags}
            name = self.run_name or (self.run_dir.name if self.run_dir else None)
            self.run_id = client.create_run(exp_id, run_name=name, tags=tags).info.run_id
        have = found[0].data.params if found else {}
        params = [Param(k, str(v)[:_PARAM_CHARS]) for k, v in hparams(logs.get("config") or {}).items()
                  if k not in have]  # (a resume keeps the params it was started with)
        for i in range(0, len(params), 100):  # MLflow takes 100 params a batch
            client.log_batch(self.run_id, params=params[i:i + 100])

    def on_step_end(self, step: int, logs: dict) -> None:
        if self.run_id is None or "loss" not in logs:  # logged steps only: the measured scalars
            return
        self._log(step, {tag: logs[k] for k, tag in TRAIN_TAGS.items() if k in logs}
                  | extras(logs, TRAIN_TAGS.keys() | TRAIN_OTHER))

    def on_validation_end(self, step: int, logs: dict) -> None:
        if self.run_id is None:
            return
        split = logs["split"]
        self._log(step, {f"{split}/loss": logs["loss"], f"{split}/acc": logs["acc"]}
                  | extras(logs, EVAL_KEYS | {f"{split}_acc", f"{split}_loss"}))

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        if self.run_id is not None:
            self._log(logs["step"], extras(logs, {"epoch", "step"}))

    def on_train_end(self, logs: dict) -> None:
        """The final figures, the run's files, and the MLflow run marked finished."""
        if self.run_id is None:
            return
        self._log(logs.get("steps", 0), final_figures(logs))
        self._call("logging summary.json", self.client.log_dict, self.run_id, logs, "summary.json")
        files = RunDir(self.run_dir) if self.run_dir else None
        for path, wanted in ((files.config, True), (files.model, self.log_model)) if files else ():
            if wanted and path.is_file():
                self._call(f"uploading {path.name}", self.client.log_artifact, self.run_id, str(path))
        self.close("FINISHED")

    def close(self, status: str | None = None) -> None:
        """End the MLflow run, once: FINISHED at the end of training; before it, FAILED while
        an exception unwinds (the run failed), else KILLED (interrupted: a resume continues it)."""
        if status is None:
            status = "FAILED" if sys.exc_info()[0] is not None else "KILLED"
        if self.run_id is not None:
            self._call("ending the run", self.client.set_terminated, self.run_id, status)
            self.run_id = None


def _rank_zero() -> bool:
    import torch.distributed as td

    return not (td.is_available() and td.is_initialized()) or td.get_rank() == 0
