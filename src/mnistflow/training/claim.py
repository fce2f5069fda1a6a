"""Which run directory a training writes to, and owning it for the run's lifetime.

Rank 0 decides (a new default name holds the time of day) and locks the directory
(``artifacts.rundir.RunLock``) before anything is written there; every rank gets the decision.
A new run never goes into a directory that holds one, a resume only continues its own run, and
a new run that fails before it recorded a step leaves the directory as it was.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

from mnistflow.artifacts.rundir import CONFIG, RunBusy, RunDir, RunLock
from mnistflow.core.errors import MnistflowError, display
from mnistflow.core.log import note
from mnistflow.runtime import dist
from mnistflow.training import resume as resumemod
from mnistflow.training.config import TrainConfig


def default_run_dir(cfg: TrainConfig) -> Path:
    name = (cfg.recipe or cfg.model).replace("/", "_").replace(":", "_")
    if "," in name:
        name = "spec"
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


MAX_DEFAULT_RUNS = 100  # runs/<name>-<time>-N: runs started in the same second


def _own(held: contextlib.ExitStack, run_dir: Path, new_run: bool) -> Path:
    """Take the run directory for this training (its lock, released when ``held`` closes; then,
    for a new run that failed before it recorded a step, what it wrote is removed: ``RunLock``).
    Returns the real directory locked: the run writes there, wherever a link on the way points
    later."""
    return held.enter_context(RunLock(run_dir, new_run=new_run)).dir.path


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
        if not lock.dir.run_files():
            held.push(lock)  # its __exit__: released (and discarded on a failure) when ``held`` closes
            return lock.dir.path
        lock.release()
    raise MnistflowError(f"{MAX_DEFAULT_RUNS} runs named {base.name} exist already: pick a --run-dir",
                         base.parent)


def _reuse(given: resumemod.Resume | None, path: Path) -> resumemod.Resume:
    """The checkpoint at ``path``: the one configuration read already, else read now."""
    return given if given is not None and given.path == Path(path) else resumemod.Resume.load(path)


def claim_run_dir(cfg: TrainConfig, info: dist.DistInfo, held: contextlib.ExitStack,
               given: resumemod.Resume | None = None) -> tuple[resumemod.Resume | None, Path]:
    """(the checkpoint to resume from, the run directory): decided by rank 0 and broadcast, so
    every rank uses the same ones (a default run name holds the time of day). ``given``: the
    checkpoint configuration read, if any (not read again).

    Rank 0 owns the run directory from here (``RunLock``, before anything is written there)
    until ``held`` closes: another training on it fails at once. A new run never goes into a
    directory that holds one (that needs ``--resume``), and one that fails before it recorded a
    step leaves the directory as it was (``RunLock(new_run=True)``)."""
    decision, resume = None, None
    if info.is_primary:
        try:
            resume_path, run_dir = _claim(cfg, held)
            if resume_path is not None:
                resume = _reuse(given, resume_path)
                of = RunDir.of_checkpoint(resume_path)
                if of is None or of.path.resolve() != Path(run_dir).resolve():
                    RunDir(run_dir).refuse_new_run()  # another run's checkpoint starts a run of its own here
                else:
                    resumemod.check_same_run(resume, run_dir)  # not one copied in from another
            decision = ("ok", None if resume_path is None else str(resume_path), str(run_dir))
        except MnistflowError as e:
            dist.broadcast_object(("error", e.detail, e.path))  # the other ranks stop with the same error
            raise
    status, a, b = dist.broadcast_object(decision)
    if status == "error":
        raise MnistflowError(a, b)
    if a is not None and resume is None:
        resume = _reuse(given, Path(a))
    return resume, Path(b)


def _claim(cfg: TrainConfig, held: contextlib.ExitStack) -> tuple[Path | None, Path]:
    """Rank 0: lock the run directory and find the checkpoint to continue from (None: start)."""
    if not cfg.resume:
        if not cfg.run_dir:
            return None, _new_default_run(cfg, held)
        run_dir = _own(held, Path(cfg.run_dir), new_run=True)
        RunDir(run_dir).refuse_new_run()
        return None, run_dir
    run_dir = _own(held, Path(cfg.run_dir), new_run=False) if cfg.run_dir else None
    resume_path, run_dir = resumemod.locate_resume(cfg.resume, run_dir)
    if not cfg.run_dir:
        run_dir = _own(held, run_dir, new_run=False)
    if resume_path is None:
        own = resumemod.restart_config(run_dir)
        note(f"no checkpoint in {display(run_dir)}; "
             + ("restarting it from step 0 with its " + CONFIG if own else "starting from step 0"))
    return resume_path, Path(run_dir)
