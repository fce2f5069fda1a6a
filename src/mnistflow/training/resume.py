"""``--resume``: find the checkpoint, load it once, check it continues THIS run, restore it.

    mnistflow train --resume --run-dir runs/a              # the newest valid checkpoint of runs/a
    mnistflow train --resume runs/a/checkpoints/step-000400.pt
    mnistflow train --nproc 2 --max-restarts 3 ...         # a restart resumes by itself

Under torchrun a restarted job (a process died, ``--max-restarts``; a machine left or joined)
continues by itself: rank 0 records the run directory it trains in the job's store
(:func:`remember_job_run`), which lives as long as the job, and every new process finds it
there (:func:`restarted_run`) and resumes it from its newest checkpoint. Only a run this very
job started (or was resuming) is continued so: a new job never picks up an old run.

Resuming needs only the checkpoint: the learning rate is a pure function of the step and the
data order a pure function of (seed, epoch), so the loop continues at (epoch, step in epoch)
with the model, optimizer, scaler and RNG states loaded strictly into the live objects.

The checkpoint is read (and its checksum verified) once per process, as a :class:`Resume`:
``training.configure`` reads it for the saved configuration (the base that explicit settings
override) and hands that same object to ``fit``.
"""
from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from mnistflow.artifacts import checkpoint, rundir
from mnistflow.artifacts.rundir import RunDir
from mnistflow.core.errors import MnistflowError, display
from mnistflow.data.records import Records
from mnistflow.runtime import dist
from mnistflow.training.config import TrainConfig, load_toml, run_id_in
from mnistflow.training.engine import TrainState

# Settings that change the model or the data (its content or order): a resume that changes
# them would not continue the same run, so it is refused. Others (epochs, lr, ...) may change.
# (batch_size is the global batch, whatever the number of processes: a resume with another
# number of processes continues the same run.)
RESUME_IDENTITY = ("model", "model_kwargs", "seed", "batch_size", "drop_last", "augment", "optimizer", "train_on")


def rank_seed(seed: int, rank: int, step: int = 0) -> int:
    """The torch seed of rank ``rank`` > 0 after the model is built (dropout differs per rank;
    rank 0 keeps the single process's stream). ``step``: the step a resume starts at."""
    return (seed * 1_000_003 + rank * 7_919 + step * 104_729) % 2**63


def data_fingerprint(rec: Records) -> dict:
    files = rec.meta.get("files") or {}
    return {"name": rec.name, "records": str(Path(rec.path).resolve()), "shape": list(rec.shape),
            "splits": dict(rec.meta.get("splits", {})), "variants": rec.variants,
            "sha256": hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()}




def resume_differences(old: dict, cfg: TrainConfig, old_data: dict | None = None,
                       data: dict | None = None) -> list[str]:
    """``key: old -> new`` for each setting that changes the model or data. ``old``: the
    checkpoint's configuration (``Resume.config``); a ``--augment auto`` not resolved yet
    (the records not opened) is compared once it is."""
    diffs = []
    for k in RESUME_IDENTITY:
        if k not in old:
            continue
        if k == "augment" and cfg.augment == "auto":
            continue
        if old.get(k) != getattr(cfg, k):
            diffs.append(f"{k}: {old.get(k)} -> {getattr(cfg, k)}")
    if old_data and data and old_data.get("sha256") != data["sha256"]:
        diffs.append(f"data: {old_data.get('name')} ({old_data.get('sha256', '')[:8]}) -> "
                     f"{data['name']} ({data['sha256'][:8]})")
    return diffs


def _newest_run_with_checkpoints(root: Path = Path("runs")) -> Path | None:
    runs = [d for d in root.glob("*") if RunDir(d).checkpoints.is_dir()] if root.is_dir() else []
    return max(runs, key=lambda d: RunDir(d).checkpoints.stat().st_mtime, default=None)


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
        return checkpoint.find_latest(RunDir(rd).checkpoints, quiet=quiet), rd
    p = Path(resume)
    if p.is_dir():
        folder = p if p.name == checkpoint.CKPT_DIR else RunDir(p).checkpoints
        found = checkpoint.find_latest(folder, quiet=quiet)
        if found is None:
            raise MnistflowError("no valid checkpoint to resume from", folder)
        rd = folder.parent
    elif p.is_file() or os.path.lexists(p):  # a FIFO or a device: refused by the checkpoint reader
        found = p
        of = RunDir.of_checkpoint(p)
        rd = of.path if of is not None else p.parent
    else:
        raise MnistflowError("no such checkpoint or run directory", p)
    return found, Path(run_dir) if run_dir else rd


JOB_RUN_KEY = "mnistflow/run_dir"  # in the job's store: the run directory each training trains
_trainings = 0  # the trainings this process started so far (a script may train several runs)


def restarted_run() -> Path | None:
    """The run directory this torchrun job has been training, when this process belongs to a
    restart of it (its rank 0 recorded it); None on the job's first start, or without torchrun.
    The k-th training of a process continues the k-th run of the job (a script that trains
    two runs, restarted, continues each). Read before the process group is joined
    (``remember_job_run`` writes after it: no process of an attempt sees that attempt's record)."""
    store = dist.job_store()
    key = f"{JOB_RUN_KEY}/{_trainings}"
    if store is None or not store.check([key]):
        return None
    return Path(store.get(key).decode())


def remember_job_run(run_dir: Path, info: dist.DistInfo) -> None:
    """Rank 0: record ``run_dir`` in the job's store, for the restarts of this job to continue;
    every process has read the store (``restarted_run``) before this barrier."""
    global _trainings
    store = dist.job_store()
    if store is None:
        return
    dist.barrier()
    if info.is_primary:
        store.set(f"{JOB_RUN_KEY}/{_trainings}", str(Path(run_dir).resolve()))
    _trainings += 1


def _shown(v: object) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def check_same_run(resume: "Resume", run_dir: Path) -> None:
    """A checkpoint in ``run_dir``'s checkpoints/ was written by that run: it carries the run id
    of the run's config.toml (runs of an older mnistflow, without ids: the same model, data and
    the rest of RESUME_IDENTITY). One copied (or linked) in from another run would take the run
    over (its config.toml rewritten, its metrics cut back, another model trained into it);
    refused, naming what differs."""
    config = RunDir(run_dir).config
    if not config.is_file():  # killed before its config was written: nothing to compare with
        return
    own, saved = load_toml(config), resume.config
    own_id, saved_id = run_id_in(config), resume.run_id
    keys = ("data", "dataset", *RESUME_IDENTITY, *sorted(set(own) - {"data", "dataset", *RESUME_IDENTITY}))
    diffs = [f"{k} {_shown(saved.get(k))} (the run's: {_shown(own.get(k))})" for k in keys
             if k not in ("threads", "run_dir") and (k in own or k in saved) and own.get(k) != saved.get(k)]
    if own_id and saved_id:
        if own_id == saved_id:
            return  # the run's own (its config.toml edited since: training.configure says how)
        diffs = diffs or [f"run id {saved_id} (the run's: {own_id}), with the same settings"]
    else:  # no ids to tell: what makes the run (an edit of another setting is no other run)
        diffs = [d for d in diffs if d.split(" ", 1)[0] in ("data", "dataset", *RESUME_IDENTITY)]
    if diffs:
        what = ("was written by another run than the one in" if own_id and saved_id else
                "does not match the config.toml of the run in")  # (without ids: or an edit of it)
        raise MnistflowError(f"{what} {display(run_dir)}: it has {', '.join(diffs[:4])}"
                             f"{', ...' if len(diffs) > 4 else ''}; move it out of checkpoints/, or "
                             "resume it into another --run-dir", resume.path)


def config_edits(resume: "Resume", own: dict) -> dict:
    """{key: (the checkpoint's value, config.toml's)} for each setting of the run's config.toml
    that differs from the checkpoint's (an edit since the checkpoint, or a resume with other
    flags killed before its first checkpoint). The thread count is the checkpoint's business."""
    saved = resume.config
    return {k: (saved.get(k), v) for k, v in own.items()
            if k not in ("threads", "run_dir", "resume") and saved.get(k) != v}


def run_id_for(run_dir: Path, resume: "Resume | None") -> str:
    """The id of the run trained in ``run_dir``: its config.toml's (a resume or a restart), else
    the id of the checkpoint it continues when that is one of its own, else a new one (a new
    run, or a run started from another run's checkpoint)."""
    own = run_id_in(RunDir(run_dir).config) if RunDir(run_dir).config.is_file() else None
    if own:
        return own
    of = RunDir.of_checkpoint(resume.path) if resume is not None else None
    if of is not None and resume.run_id and os.path.realpath(of.path) == os.path.realpath(run_dir):
        return resume.run_id
    return uuid.uuid4().hex[:16]


def restart_config(run_dir: str | os.PathLike) -> Path | None:
    """``--resume`` of a run without a valid checkpoint (killed before its first one): its
    ``config.toml``, which it restarts from at step 0 (never the defaults: that would train
    another model into it). None: the directory is empty or missing (a new run starts there).
    Anything else (not a run, or a finished run that kept no checkpoint) is an error."""
    rd = RunDir(run_dir)
    if rd.is_empty():
        return None
    if rd.summary.is_file():
        raise MnistflowError("this run finished and kept no valid checkpoint: nothing to resume "
                             "(it would be trained again from step 0); pick another --run-dir for a "
                             "new run", rd.path)
    if not rd.config.is_file():
        raise MnistflowError(f"nothing to resume: no checkpoint and no {rundir.CONFIG} (not a run "
                             f"directory)", rd.path)
    return rd.config


def restart_base(config: Path, known: set[str], *, keep_threads: bool = True) -> dict:
    """The settings of a run's ``config.toml``, as the base layer of its restart."""
    base = {k: v for k, v in load_toml(config).items() if k in known - {"resume", "run_dir"}}
    if not keep_threads:
        base.pop("threads", None)
    return base


@dataclass
class Resume:
    """The checkpoint a run continues from, read (and verified) once."""

    path: Path
    payload: dict

    @classmethod
    def load(cls, path: str | Path) -> "Resume":
        return cls(Path(path), checkpoint.load(Path(path)))

    @property
    def config(self) -> dict:
        """The configuration the checkpoint's run trained with."""
        return dict(self.payload["config"])

    def config_base(self, known: set[str], *, keep_threads: bool = True) -> dict:
        """The checkpoint's configuration, as the base layer of a resumed run's settings.
        ``keep_threads``: the thread count the run used so far (the bits depend on it), unless
        the user chose one (then it is left out: their choice applies)."""
        base = {k: v for k, v in self.config.items() if k in known - {"resume", "run_dir"}}
        if not keep_threads:
            base.pop("threads", None)
        elif self.threads and self.world_size == dist.env_info().world_size:
            base["threads"] = self.threads  # (another world size: other bits anyway)
        return base

    @property
    def run_id(self) -> str | None:
        """The id of the run that saved it (None: saved by an older mnistflow)."""
        value = self.payload["train_state"].get("run_id")
        return value if isinstance(value, str) else None

    @property
    def step(self) -> int:
        return int(self.payload["train_state"]["step"])

    @property
    def threads(self) -> int | None:
        """The intra-op thread count of the process that saved it (None: not recorded)."""
        n = self.payload["train_state"].get("threads")
        return int(n) if n else None

    @property
    def world_size(self) -> int:
        """The number of processes that saved it."""
        return int(self.payload["train_state"].get("world_size", 1))

    def check(self, cfg: TrainConfig, rec: Records | None = None) -> None:
        """RESUME_IDENTITY (and, with ``rec``, the data): a difference is an error listing them."""
        diffs = resume_differences(self.config, cfg, self.payload.get("data") if rec else None,
                                   data_fingerprint(rec) if rec else None)
        if diffs:
            raise MnistflowError("cannot resume with a different model or data: " + "; ".join(diffs),
                                 self.path)

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                scaler: torch.amp.GradScaler | None,
                state: TrainState, seed: int, rank: int) -> None:
        """Load the states into the live objects (strictly) and ``state``."""
        checkpoint.restore(self.payload, model, optimizer, scaler, path=self.path)
        ts = self.payload["train_state"]
        state.step, state.epoch, state.step_in_epoch = ts["step"], ts["epoch"], ts["step_in_epoch"]
        state.samples, state.metrics = ts["samples"], dict(ts["metrics"])
        # only a reached target ends a run for good; any other stop is continued past
        state.stop_reason = "target" if ts.get("stop_reason") == "target" else ""
        if rank > 0:  # the checkpoint's own RNG is rank 0's; the others' are beside it
            ranks = self.payload.get(checkpoint.RANK_RNG) or []
            if self.world_size == dist.env_info().world_size and rank < len(ranks) and ranks[rank]:
                checkpoint.set_rng_state(ranks[rank])
            else:  # saved by another number of processes (or an older mnistflow): a fresh stream
                torch.manual_seed(rank_seed(seed, rank, state.step))
