"""The run directory: the contract between ``train`` and every verb that reads a run.

    runs/<name>/
      config.toml        the resolved configuration (``mnistflow train --config`` reads it back)
      metrics.jsonl      one JSON object per logged step / evaluation
      summary.json       the final figures, the warnings the run printed, the kernels it used
      model.safetensors  the trained weights and how to rebuild the model (its metadata)
      tb/                TensorBoard event files
      profile/           the profiler's Chrome trace and tables
      checkpoints/       step-NNNNNN.pt, and the ``last`` / ``best`` pointer files
      report/            ``mnistflow report``'s page and plots
      .lock              held (``flock``) by the one training that writes the run

This module is the one place that names these files; everything else asks it. Their contents
are read back by ``runlog`` (metrics.jsonl, summary.json, config.toml for reports),
``checkpoint`` and ``model_file``.
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from mnistflow.core.errors import MnistflowError
from mnistflow.core.fsutil import pid_alive
from mnistflow.data.records import is_record_set

try:
    import fcntl
except ImportError:  # not POSIX: runs are not locked
    fcntl = None

CONFIG = "config.toml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
MODEL = "model.safetensors"
TENSORBOARD = "tb"
PROFILE = "profile"
CHECKPOINTS = "checkpoints"
REPORT = "report"
LOCK = ".lock"
# what a training writes: a directory holding any of them is a run (not to be trained into anew)
RUN_FILES = (CONFIG, METRICS, SUMMARY, MODEL, CHECKPOINTS)


def _entry(name: str) -> property:
    """A read-only attribute: the path of ``name`` inside the run directory."""
    return property(lambda self: self.path / name, doc=f"``RUN/{name}``")


@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory (nothing is created or read here)."""

    path: Path

    def __init__(self, path: str | Path) -> None:
        object.__setattr__(self, "path", Path(path))

    config = _entry(CONFIG)
    metrics = _entry(METRICS)
    summary = _entry(SUMMARY)
    model = _entry(MODEL)
    tensorboard = _entry(TENSORBOARD)
    profile = _entry(PROFILE)
    checkpoints = _entry(CHECKPOINTS)
    report = _entry(REPORT)
    lock = _entry(LOCK)

    @classmethod
    def of_checkpoint(cls, checkpoint_file: str | Path) -> "RunDir | None":
        """The run a checkpoint file belongs to (``RUN/checkpoints/step-N.pt``), else None."""
        p = Path(checkpoint_file)
        return cls(p.parent.parent) if p.parent.name == CHECKPOINTS else None

    def is_run(self) -> bool:
        """A directory that a ``train`` wrote (or is writing): it has a config or checkpoints."""
        return self.config.is_file() or self.checkpoints.is_dir() or self.model.is_file()

    def run_files(self) -> list[str]:
        """The entries of ``RUN_FILES`` present (an empty ``checkpoints/`` does not count): a
        training that is not a resume must not write over them."""
        found = []
        for name in RUN_FILES:
            p = self.path / name
            if (p.is_dir() and any(p.iterdir())) if name == CHECKPOINTS else p.exists():
                found.append(name)
        return found

    def refuse_new_run(self) -> None:
        """A training that is not a resume never writes over another run's files, nor among
        the files of a record set."""
        found = self.run_files()
        if found:
            raise MnistflowError(f"this run directory holds a run already ({', '.join(found)}): continue it "
                                 "with --resume, or pick another --run-dir", self.path)
        if is_record_set(self.path, among_others=True):
            raise MnistflowError("this directory holds prepared records (meta.json and its data): a run's "
                                 "files do not go among them; pick another --run-dir", self.path)
        runs = self.runs_inside()
        if runs:
            raise MnistflowError(f"this directory holds other runs ({', '.join(runs[:3])}"
                                 f"{', ...' if len(runs) > 3 else ''}): a run directory is one run's; pick a "
                                 "new folder (e.g. a name inside it) as --run-dir", self.path)

    def runs_inside(self, limit: int = 1000) -> list[str]:
        """The names of the runs among the first ``limit`` entries of this directory (a folder of
        runs such as ``runs/``), sorted."""
        try:
            with os.scandir(self.path) as it:
                entries = [e for _, e in zip(range(limit), it)]
        except OSError:
            return []
        return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False) and e.name != CHECKPOINTS
                      and RunDir(e.path).is_run())

    def has_steps(self) -> bool:
        """Whether a training recorded any of its steps here: a metrics line, a checkpoint, a
        profile, the model or the summary (config.toml and TensorBoard's empty event file are
        written before the first step)."""
        def nonempty(p: Path) -> bool:
            try:
                return p.stat().st_size > 0 if p.is_file() else p.is_dir() and any(p.iterdir())
            except OSError:
                return True  # cannot tell: keep it
        return any(nonempty(p) for p in (self.metrics, self.checkpoints, self.profile, self.model, self.summary))

    def training_pid(self) -> int | None:
        """The process id of the training that holds this run's lock now (a run being trained:
        its files are those of a step in the middle), else None. A lock file a killed training
        left is not held (``/proc/locks``; where the system does not tell: its pid is gone)."""
        try:
            fd = os.open(self.lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            text = os.pread(fd, 32, 0).strip() if stat.S_ISREG(st.st_mode) else b""
        finally:
            os.close(fd)
        if not text.isdigit():
            return None
        held = _flocked(st)
        return int(text) if held or (held is None and pid_alive(int(text))) else None

    def is_empty(self) -> bool:
        """Missing, or holding nothing but a lock file (of a training killed at its start)."""
        try:
            return all(p.name == LOCK for p in self.path.iterdir())
        except FileNotFoundError:
            return True
        except NotADirectoryError:
            return False


def _flocked(st: os.stat_result) -> bool | None:
    """Whether the file ``st`` describes is held by an ``flock`` now, from ``/proc/locks``
    (None: the system does not tell). Read only: taking the lock to find out would make a
    training that starts at that moment fail."""
    try:
        with open("/proc/locks", "rb") as f:
            text = f.read(1 << 20).decode("ascii", "replace")
    except OSError:
        return None
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(line.split()[1:2] == ["FLOCK"] and want in line.split() for line in text.splitlines())


def _a_lock_file(fd: int) -> bool:
    """Whether the open ``RUN/.lock`` is one a training wrote: a regular file holding nothing or
    a pid (a user's own file of that name is not truncated and removed)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > 32:
        return False
    text = os.pread(fd, 32, 0).strip()
    return not text or text.isdigit()


class RunBusy(MnistflowError):
    """Another training holds the run directory's lock."""


class RunLock:
    """Exclusive ownership of a run directory by one training: ``flock`` on ``RUN/.lock``, taken
    before anything else is written there and held until :meth:`release` (the kernel drops it
    when the process dies, so a killed training leaves nothing stuck; the file may stay behind
    and means nothing). A second holder fails at once (one line, naming the holder's pid).

    The directory (and its missing parents) is created here; :meth:`release` removes what was
    created when nothing but the lock was written (a training that failed before it began).

    The path is resolved once, when the lock is taken: ``self.dir`` is the real directory that
    was locked, and every later write goes there (through ``self.dir``), even when a symbolic
    link on the way (``runs/current``) is repointed during the run: another run's files are
    never written through a link that moved.

    ``new_run``: the lock of a new training (not a resume). When it fails before it recorded
    a step (:meth:`RunDir.has_steps`; an exception leaving the ``with`` block, or
    :meth:`discard`), everything it wrote into the directory since :meth:`acquire` is removed,
    so the directory is as it was and the same command can be run again; what was there
    before stays. A resumed run's directory is never touched."""

    def __init__(self, path: str | Path, *, new_run: bool = False):
        self.dir = RunDir(path)
        self.new_run = new_run
        self._fd: int | None = None
        self._created: list[Path] = []
        self._before: set[str] = set()  # the entries the directory held when it was taken

    def acquire(self) -> RunLock:
        p = self.dir.path
        try:
            missing = [d for d in (p, *p.parents) if not d.exists()]
            p.mkdir(parents=True, exist_ok=True)
            # resolved once, now: the directory locked is the one written (see the docstring)
            self.dir = RunDir(os.path.realpath(p))  # (errors below name the path as given)
            self._created = [Path(os.path.realpath(d)) for d in missing]  # deepest first
            self._before = {e.name for e in os.scandir(self.dir.path)} - {LOCK}
            while self._fd is None:
                # O_NOFOLLOW: a link named .lock is refused (ELOOP, below), never truncated through
                fd = os.open(self.dir.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o666)
                if fcntl is None:
                    self._fd = fd
                    break
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                    os.close(fd)
                    raise RunBusy("another training is using this run directory"
                                  + (f" (pid {holder})" if holder.isdigit() else ""), p) from None
                try:  # the file we locked must still be the one at the path (a releaser unlinks it)
                    same = os.stat(self.dir.lock).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same and not _a_lock_file(fd):
                    os.close(fd)
                    raise MnistflowError(f"{LOCK} here is not a run lock (it holds other data, or is not a "
                                         "regular file); mnistflow would replace it: move it away", p)
                if same:
                    self._fd = fd
                else:
                    os.close(fd)
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)
        except MnistflowError:
            raise
        except OSError as e:
            self.release()
            if e.errno == errno.ELOOP:
                raise MnistflowError(f"{LOCK} here is a symbolic link, not a run lock; mnistflow would "
                                     "replace it: move it away", p) from None
            raise MnistflowError(f"cannot use as a run directory: {e.strerror}", p) from None
        return self

    def discard(self) -> None:
        """A new training failed: unless it recorded a step, remove what it wrote since
        :meth:`acquire` (the entries that were not there then); then :meth:`release` (which
        removes the directories the lock created). Best effort: what cannot be removed stays."""
        if self.new_run and self._fd is not None and not self.dir.has_steps():
            try:
                entries = list(os.scandir(self.dir.path))
            except OSError:
                entries = []
            for e in entries:
                if e.name == LOCK or e.name in self._before:
                    continue
                try:
                    if e.is_dir(follow_symlinks=False):
                        shutil.rmtree(e.path, ignore_errors=True)
                    else:
                        os.unlink(e.path)
                except OSError:
                    pass
        self.new_run = False
        self.release()

    def release(self) -> None:
        """Unlock; remove the lock file, and the directories :meth:`acquire` created if nothing
        else was written in them."""
        if self._fd is not None:
            try:
                os.unlink(self.dir.lock)  # before unlocking: a waiter re-checks the path (see acquire)
            except OSError:
                pass
            os.close(self._fd)
            self._fd = None
        created, self._created = self._created, []
        for d in created:
            try:
                d.rmdir()
            except OSError:  # not empty: a training wrote there (or another one took it since)
                break

    def __enter__(self):
        return self.acquire()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and self.new_run:
            self.discard()
        else:
            self.release()
