"""Log a run to MLflow: its settings as params, the curves as metrics, its files as artifacts.

    mnistflow train --recipe fast --mlflow                  # $MLFLOW_TRACKING_URI, else MLflow's default
    mnistflow train --recipe fast --mlflow http://127.0.0.1:5000
    mnistflow.train(recipe="fast", callbacks=[mnistflow.MLflowLogger("sqlite:///mlflow.db")])

A hook (``training.hooks``), on rank 0 only. It records, under the names TensorBoard uses
(``observe.tracking``): the run's hyperparameters (params), each logged step's and each
evaluation's scalars at their step (``train/loss``, ``lr``, ``val/acc``...), what a hook
returned, the final figures (``run/wall_s``...); then ``summary.json``, ``config.toml`` and
the model file as artifacts. The MLflow run is tagged with the run directory: a resumed run
continues its MLflow run.

MLflow is imported here only (``pip install 'mnistflow[mlflow]'``). A store that cannot be
reached when training starts is an error (one line); a failure later is one warning, and the
run goes on without MLflow (the run directory keeps every record).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import sys
import time
from pathlib import Path
from typing import Iterator

from mnistflow.artifacts.rundir import RunDir
from mnistflow.core.errors import MnistflowError
from mnistflow.core.log import warn
from mnistflow.training.observe.tracking import epoch_scalars, eval_scalars, final_figures, hparams, step_scalars

INSTALL = "pip install 'mnistflow[mlflow]'"
_PARAM_CHARS = 6000  # MLflow's limit on a param's value
# How long a call waits for a server that does not answer, unless the user set MLflow's own
# variables: by MLflow's defaults (7 retries, backoff 2) each call tries for about 4 minutes.
_PATIENCE = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
             "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}


def check_available() -> None:
    """Fail at once (one line) when MLflow is not installed: before a run starts."""
    if importlib.util.find_spec("mlflow") is None:
        raise MnistflowError(f"--mlflow needs the optional package 'mlflow': {INSTALL}")


@contextlib.contextmanager
def _patience() -> Iterator[None]:
    """MLflow's HTTP retries bounded (``_PATIENCE``) for the calls inside, where not set."""
    unset = [k for k in _PATIENCE if k not in os.environ]
    os.environ.update({k: _PATIENCE[k] for k in unset})
    try:
        yield
    finally:
        for k in unset:
            os.environ.pop(k, None)


def _reason(e: BaseException) -> str:
    """MLflow's error in a line: its first sentence, or what to do for the stores it refuses."""
    text = " ".join(str(e).split())
    if "MLFLOW_ALLOW_FILE_STORE" in text or "maintenance mode" in text:
        return ("MLflow 3 refuses its file store unless MLFLOW_ALLOW_FILE_STORE=true is set; "
                "or use sqlite:///mlflow.db or a tracking server")
    if "sqlite" in text and "registry" in text.lower():
        return f"a sqlite store needs the full mlflow package ({INSTALL}), not mlflow-skinny"
    if "Max retries exceeded" in text:  # requests' words for a server that never answered
        why = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
        return f"no answer from the server ({why.group(1).strip() if why else 'it timed out'})"
    first = text.split(". ")[0]
    return first if len(first) <= 200 else first[:197] + "..."


class MLflowLogger:
    """Log the run to MLflow (the module docstring says what). ``tracking_uri``: a server
    (``http://host:5000``), a database (``sqlite:///mlflow.db``) or None (MLflow's choice:
    ``$MLFLOW_TRACKING_URI``, else its default); ``experiment``: the experiment's name (created
    when new); ``run_name``: the MLflow run's name (default: the run directory's); ``log_model``:
    upload the model file too; ``tags``: more tags for the MLflow run. Its ``close()`` ends the
    MLflow run as the training run ends (``setup.start``: a callback's close, a writer's)."""

    def __init__(self, tracking_uri: str | None = None, experiment: str = "mnistflow",
                 run_name: str | None = None, log_model: bool = True, tags: dict | None = None):
        check_available()
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.log_model, self.tags = log_model, dict(tags or {})
        self.client = None
        self.run_id: str | None = None  # set while the MLflow run is open and healthy
        self.run_dir: Path | None = None

    def on_train_start(self, logs: dict) -> None:
        if not _rank_zero():
            return
        self.run_dir = Path(logs["run_dir"])
        try:
            with _patience():
                self._open(logs)
        except Exception as e:  # whatever the store raised: one line, before the first step
            raise MnistflowError(f"MLflow at {self.tracking_uri or 'its default store'}: {_reason(e)}") from None

    def _open(self, logs: dict) -> None:
        """Connect, find or make the experiment, continue this run directory's MLflow run (a
        resume) or start one, and record the params (a resume keeps those it started with)."""
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.tracking_uri)
        exp = client.get_experiment_by_name(self.experiment)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(self.experiment)
        key = hashlib.sha256(str(self.run_dir).encode()).hexdigest()[:16]  # (a path may hold quotes)
        found = client.search_runs([exp_id], f"tags.`mnistflow.run_key` = '{key}'", max_results=1,
                                   order_by=["attributes.start_time DESC"]) if logs.get("start_step") else []
        if found:
            run_id = found[0].info.run_id
            client.update_run(run_id, status="RUNNING")
        else:
            tags = {"mnistflow.run_dir": str(self.run_dir), "mnistflow.run_key": key, **self.tags}
            run_id = client.create_run(exp_id, run_name=self.run_name or self.run_dir.name, tags=tags).info.run_id
        have = found[0].data.params if found else {}
        params = [Param(k, str(v)[:_PARAM_CHARS]) for k, v in hparams(logs.get("config") or {}).items()
                  if k not in have]
        for i in range(0, len(params), 100):  # MLflow takes 100 params a call
            client.log_batch(run_id, params=params[i:i + 100])
        self.client, self.run_id = client, run_id

    def _call(self, what: str, method: str, *args, **kwargs) -> None:
        """``MlflowClient.<method>(run_id, ...)`` during training: a failure is one warning, and
        MLflow is left alone from then on (the run goes on; its own files keep the record)."""
        if self.run_id is None:
            return
        try:
            with _patience():
                getattr(self.client, method)(self.run_id, *args, **kwargs)
        except Exception as e:  # a server gone, a full disk: the tracker's trouble, not the run's
            self.run_id = None
            warn(f"MLflow: {what} failed ({_reason(e)}); the run goes on without MLflow")

    def _log(self, step: int, values: dict) -> None:
        if values and self.run_id is not None:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            self._call("logging metrics", "log_batch",
                       metrics=[Metric(k, float(v), now, step) for k, v in values.items()])

    def on_step_end(self, step: int, logs: dict) -> None:
        if "loss" in logs:  # logged steps only: the measured scalars
            self._log(step, step_scalars(logs))

    def on_validation_end(self, step: int, logs: dict) -> None:
        self._log(step, eval_scalars(logs))

    def on_epoch_end(self, logs: dict) -> None:
        self._log(logs["step"], epoch_scalars(logs))

    def on_train_end(self, logs: dict) -> None:
        """The final figures, the run's files, and the MLflow run marked finished."""
        self._log(logs.get("steps", 0), final_figures(logs))
        self._call("logging summary.json", "log_dict", logs, "summary.json")
        if self.run_dir is not None:  # (saved before this hook: loop.finish)
            files = RunDir(self.run_dir)
            for path in (files.config, files.model) if self.log_model else (files.config,):
                self._call(f"uploading {path.name}", "log_artifact", str(path))
        self.close("FINISHED")

    def close(self, status: str | None = None) -> None:
        """End the MLflow run, once: FINISHED at the end of training; before it, FAILED while
        an exception unwinds (the run failed), else KILLED (interrupted, Ctrl-C or a signal's
        ``TrainingInterrupted`` included: a resume continues it)."""
        if status is None:
            unwinding = sys.exc_info()[1]
            status = "FAILED" if unwinding is not None and not isinstance(unwinding, KeyboardInterrupt) else "KILLED"
        self._call("ending the run", "set_terminated", status)
        self.run_id = None


def _rank_zero() -> bool:
    import torch.distributed as td

    return not (td.is_available() and td.is_initialized()) or td.get_rank() == 0
