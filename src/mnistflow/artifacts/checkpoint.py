"""Checkpoints: atomic, checksummed, rotated, and loaded strictly into the live objects.

    mnistflow train --recipe fast --run-dir runs/a --checkpoint-every 200   # kill it any time...
    mnistflow train --resume --run-dir runs/a                               # ...it continues exactly
    mnistflow train --resume runs/a/checkpoints/step-000400.pt              # or from a given one
    python -c "import torch; print(torch.load('runs/a/checkpoints/step-000400.pt', weights_only=True).keys())"

A run keeps ``RUN/checkpoints/step-NNNNNN.pt``: the last ``keep`` of them plus the best by
validation accuracy, and two pointer files, ``last`` and ``best``, naming them. When to save
is the training loop's business (``training.checkpointing``); this module is the file format
and the folder.

File format (version 1): a standard ``torch.save`` zip archive of the payload dict, so plain
``torch.load(path, weights_only=True)`` opens it, plus one more zip entry,
``<archive>/mnistflow.json``, that torch ignores::

    {"format_version": 1, "payload_bytes": N, "payload_sha256": "...", "step": ..., "metric": ...}

where the checksum covers the first N bytes of the file: every entry torch wrote (its pickle
and tensor data). mnistflow verifies size and checksum before anything is unpickled, so a
truncated or corrupted file is detected, never loaded. The payload is read with
``torch.load(weights_only=True)``: tensors and plain Python values only; a file whose pickle
would build other objects (and could execute code) is refused. RNG states are stored as
tensors and plain numbers for that.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mnistflow.artifacts.model_file import load_weights, unwrap
from mnistflow.artifacts.rundir import CHECKPOINTS
from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError, display
from mnistflow.core.fsutil import NotReadable, atomic_write, atomic_write_text, fsync_dir, open_regular, \
    read_regular, sweep_stale
from mnistflow.core.log import warn

FORMAT_VERSION = 1
ZIP_MAGIC = b"PK\x03\x04"
META_ENTRY = "mnistflow.json"  # inside the torch archive's folder: <archive>/mnistflow.json
CKPT_DIR = CHECKPOINTS
LAST, BEST = "last", "best"  # pointer files in the folder, each naming one step file
SUPERSEDED = "superseded"  # checkpoints of an abandoned timeline (a resume from an older one)
_STEP_FILE = re.compile(r"^step-(\d+)\.pt$")
PAYLOAD_KEYS = ("format_version", "model", "optimizer", "scheduler", "scaler", "rng", "train_state",
                "config", "data", "model_info")
# optional: the RNG states (as ``rng``) of every process of a data parallel run, by rank (rank 0's
# is ``rng``), so each continues its own stream (dropout) as if never stopped
RANK_RNG = "rank_rng"

class CorruptCheckpoint(MnistflowError):
    """A checkpoint file that is truncated, altered or not a checkpoint at all."""


# --- RNG states as weights_only-loadable values ------------------------------------------

def rng_state() -> dict:
    """Python, NumPy, torch CPU and (when present) CUDA generator states, as tensors/numbers."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    out = {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64),
                   "gauss": gauss},
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return out


def set_rng_state(s: dict) -> None:
    p = s["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["state"].tolist()), p["gauss"]))
    n = s["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(s["torch"])
    if s.get("cuda") and torch.cuda.is_available():
        if len(s["cuda"]) != torch.cuda.device_count():
            warn(f"checkpoint has CUDA RNG states for {len(s['cuda'])} GPU(s), this machine has "
                 f"{torch.cuda.device_count()}; restoring the common ones")
        for i, st in enumerate(s["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(st, i)


# --- one file -----------------------------------------------------------------------------

def _serialize(payload: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(payload, buf)
    return buf.getvalue()


def seal(body: bytes, meta: dict | None = None) -> bytes:
    """A checkpoint file: the torch.save archive ``body`` plus the ``mnistflow.json``
    entry holding ``meta``, the size and sha256 of torch's entries."""
    buf = io.BytesIO(body)
    with zipfile.ZipFile(buf) as z:
        folder = z.namelist()[0].split("/")[0]
        entries = z.start_dir  # torch's entries end where its central directory starts
    head = dict(meta or {})
    head.update(format_version=FORMAT_VERSION, payload_bytes=entries,
                payload_sha256=hashlib.sha256(body[:entries]).hexdigest())
    # appending writes the new entry where the central directory was (and a new directory
    # after it), so the file's first ``entries`` bytes stay exactly torch's entries
    with zipfile.ZipFile(buf, "a") as z:
        z.writestr(f"{folder}/{META_ENTRY}", json.dumps(head, sort_keys=True))
    return buf.getvalue()


def write(path: str | Path, payload: dict, meta: dict | None = None) -> Path:
    """Write ``payload`` atomically (temp file, fsync, rename, fsync dir) with its checksum."""
    data = seal(_serialize(payload), meta)
    atomic_write(path, lambda f: f.write(data))
    return Path(path)


def _zip_header(src, path: Path, verify_body: bool = False, data: bytes | None = None) -> tuple[dict, int]:
    """(the mnistflow.json header, its entry's offset) of a checkpoint file. ``verify_body``:
    check the size and sha256 of torch's entries, then the zip directory against every entry
    (names, CRC-32s), so nothing torch would read is unchecked."""
    try:
        with zipfile.ZipFile(src) as z:
            entry = next((i for i in z.infolist() if i.filename.endswith("/" + META_ENTRY)), None)
            if entry is None:
                raise CorruptCheckpoint("not a mnistflow checkpoint (a torch file without "
                                        f"{META_ENTRY})", path)
            head = json.loads(z.read(entry))
            if verify_body:
                if not isinstance(head, dict):
                    raise CorruptCheckpoint("corrupt checkpoint header", path)
                _check_body(head, memoryview(data if data is not None else src.getvalue())
                            [:entry.header_offset], path)
                bad = z.testzip()
                if bad is not None:
                    raise CorruptCheckpoint(f"corrupt checkpoint (entry {bad} does not match the "
                                            "zip directory)", path)
            return head, entry.header_offset
    except zipfile.BadZipFile as e:
        if "not a zip file" in str(e).lower():
            raise CorruptCheckpoint("truncated or corrupt checkpoint (the zip directory at its end "
                                    "is missing)", path) from None
        raise CorruptCheckpoint(f"corrupt checkpoint ({e})", path) from None
    except (ValueError, KeyError, EOFError, NotImplementedError) as e:
        raise CorruptCheckpoint(f"corrupt checkpoint header ({e.__class__.__name__})", path) from None


def read_header(path: str | Path) -> dict:
    """The header (step, epoch, metric, reason, sizes) without reading the payload; not verified."""
    p = Path(path)
    try:
        with _open(p) as f:
            if f.read(len(ZIP_MAGIC)) == ZIP_MAGIC:
                f.seek(0)
                return _zip_header(f, p)[0]
    except OSError as e:
        raise CorruptCheckpoint(f"cannot read: {e.strerror}", p) from None
    except ValueError:
        raise CorruptCheckpoint("corrupt checkpoint header", p) from None
    raise CorruptCheckpoint("not a mnistflow checkpoint (no header)", p)


def _open(path: Path):
    """``path`` opened for reading if it is a regular file (``fsutil.open_regular``: a FIFO is
    refused at once, never waited on); anything else is a ``CorruptCheckpoint`` (or "no such
    file")."""
    try:
        return open_regular(path, limits.MAX_CHECKPOINT_BYTES, "checkpoint")
    except MnistflowError as e:  # NotReadable, or a file gone meanwhile
        raise CorruptCheckpoint(e.detail, path) from None


def _check_body(head: dict, body: bytes | memoryview, path: Path) -> None:
    """``body`` (the bytes the checksum covers) against the header's size and sha256."""
    try:
        size, digest = int(head["payload_bytes"]), str(head["payload_sha256"])
    except (KeyError, TypeError, ValueError):
        raise CorruptCheckpoint("corrupt checkpoint header", path) from None
    if len(body) != size:
        raise CorruptCheckpoint(f"truncated or altered checkpoint ({len(body):,} of {size:,} "
                                "payload bytes)", path)
    if hashlib.sha256(body).hexdigest() != digest:
        raise CorruptCheckpoint("corrupt checkpoint (sha256 of the payload does not match)", path)
    if head.get("format_version") != FORMAT_VERSION:
        raise MnistflowError(f"checkpoint format version {head.get('format_version')} is not "
                             f"supported (this mnistflow reads version {FORMAT_VERSION})", path)


def _read_verified(path: Path) -> tuple[dict, bytes]:
    """(header, the bytes torch.load reads) after checking size and checksum."""
    # read whole, the checksum before any unpickling: a file over the cap (a sparse file, a link to
    # /dev/zero) is refused before a byte is read, a corrupt candidate that find_latest skips
    try:
        data = read_regular(path, limits.MAX_CHECKPOINT_BYTES, "checkpoint")
    except NotReadable as e:
        raise CorruptCheckpoint(e.detail, path) from None
    if not data.startswith(ZIP_MAGIC):
        raise CorruptCheckpoint("not a mnistflow checkpoint (no header)", path)
    head, _ = _zip_header(io.BytesIO(data), path, verify_body=True, data=data)
    return head, data


def safe_torch_load(data: bytes | str | Path, path: str | Path) -> object:
    """``torch.load(weights_only=True)``; a payload that needs arbitrary pickle is refused."""
    import pickle

    src = io.BytesIO(data) if isinstance(data, bytes) else str(data)
    try:
        with warnings.catch_warnings():  # e.g. 'Detected pickle protocol 51' for a damaged file:
            warnings.simplefilter("ignore")  # the load's result or our one-line error says it all
            return torch.load(src, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).split("Weights only load failed.")[-1].strip().splitlines()
        why = next((ln.strip() for ln in first if "Unsupported" in ln or "GLOBAL" in ln), "")
        raise MnistflowError("refused: the file carries a pickle payload that is not plain weights "
                             "(loading it could execute code)" + (f" [{why}]" if why else ""),
                             path) from None
    except Exception as e:  # noqa: BLE001 -- a damaged archive or pickle fails in many ways
        # (RuntimeError, EOFError, struct.error, IndexError, ... found by fuzzing); nothing but
        # plain weights was built, so whatever it is, the file is unreadable
        why = (str(e).splitlines() or [""])[0][:120] or e.__class__.__name__
        raise CorruptCheckpoint(f"not a readable torch file ({why})", path) from None


def load(path: str | Path) -> dict:
    """The verified payload of a checkpoint (plain dict of tensors and Python values), with its
    header under ``"header"``."""
    p = Path(path)
    head, body = _read_verified(p)
    payload = safe_torch_load(body, p)
    if not isinstance(payload, dict) or payload.get("format_version") != head.get("format_version"):
        raise CorruptCheckpoint("payload is not a mnistflow checkpoint", p)
    missing = [k for k in PAYLOAD_KEYS if k not in payload]
    if missing:
        raise CorruptCheckpoint(f"checkpoint lacks {', '.join(missing)}", p)
    payload["header"] = head
    return payload


def verify(path: str | Path) -> dict:
    """Check size and checksum (no unpickling); returns the header or raises CorruptCheckpoint."""
    return _read_verified(Path(path))[0]


def is_checkpoint_file(path: str | Path) -> bool:
    """A mnistflow checkpoint by its first bytes and its header entry; nothing is verified."""
    try:
        with open_regular(path) as f:
            if f.read(len(ZIP_MAGIC)) != ZIP_MAGIC:
                return False
            f.seek(0)
            with zipfile.ZipFile(f) as z:
                return any(n.endswith("/" + META_ENTRY) for n in z.namelist())
    except (OSError, MnistflowError, zipfile.BadZipFile, ValueError):
        return False


# --- capture and restore ------------------------------------------------------------------

def capture(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None,
            train_state: dict, config: dict, *, scheduler: dict | None = None, data: dict | None = None,
            model_info: dict | None = None) -> dict:
    """Everything needed to continue, as a payload dict (the unwrapped model's weights)."""

    return {
        "format_version": FORMAT_VERSION,
        "model": {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler or {},
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng_state(),
        "train_state": train_state,
        "config": config,
        "data": data or {},
        "model_info": model_info or {},
    }


def restore(payload: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
            scaler: torch.amp.GradScaler | None = None, *, path: str | Path | None = None,
            rng: bool = True) -> None:
    """Load ``payload`` into the live objects, strictly: leftover or missing keys are errors."""

    where = path or "checkpoint"
    load_weights(model, payload["model"], where)
    if optimizer is not None:
        try:
            optimizer.load_state_dict(payload["optimizer"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise MnistflowError(f"optimizer state does not fit ({str(e).splitlines()[0]})", where) from None
    if (payload["scaler"] is None) != (scaler is None):
        have = "has" if payload["scaler"] is not None else "has no"
        raise MnistflowError(f"checkpoint {have} grad-scaler state but this run "
                             f"{'uses' if scaler is not None else 'does not use'} one (precision changed?)",
                             where)
    if scaler is not None:
        scaler.load_state_dict(payload["scaler"])
    if rng:
        set_rng_state(payload["rng"])


# --- a run's checkpoint directory -----------------------------------------------------------

def step_files(folder: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every ``step-N.pt`` in ``folder``, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    out = []
    for p in folder.iterdir():
        m = _STEP_FILE.match(p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}.pt"


def find_latest(folder: str | Path, *, quiet: bool = False) -> Path | None:
    """The newest checkpoint in ``folder`` that verifies; corrupt newer ones are reported
    (one warning line each, naming the file) and skipped, never loaded."""
    files = step_files(folder)
    for i in range(len(files) - 1, -1, -1):
        step, p = files[i]
        try:
            verify(p)
            return p
        except CorruptCheckpoint as e:
            if not quiet:
                prev = next((q for _, q in reversed(files[:i])), None)
                warn(f"{display(p)}: {e.detail}; "
                     + (f"falling back to the previous checkpoint {prev.name}" if prev else
                        "no earlier checkpoint"))
    return None


def read_pointer(folder: str | Path, name: str) -> Path | None:
    p = Path(folder) / name
    try:
        target = read_regular(p, limits.MAX_POINTER_BYTES, "pointer file").decode().strip()
    except (MnistflowError, UnicodeDecodeError):
        return None
    q = Path(folder) / target
    return q if target and _STEP_FILE.match(target) and q.is_file() else None


@dataclass
class CheckpointDir:
    """``RUN/checkpoints``: saves, keep-last-K + best rotation, ``last``/``best`` pointers."""

    folder: Path
    keep: int = 3
    best_value: float | None = None
    best_file: Path | None = None

    def __post_init__(self):
        self.folder = Path(self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        sweep_stale(self.folder, locked=True)  # left by a process of this run killed mid-write
        best = read_pointer(self.folder, BEST)
        if best is not None:
            try:
                m = verify(best).get("metric") or {}
                if m.get("value") is not None:
                    self.best_value, self.best_file = float(m["value"]), best
            except CorruptCheckpoint:
                pass

    def save(self, step: int, payload: dict, metric: dict | None = None, reason: str = "") -> Path:
        """Write ``step-N.pt``; point ``last`` at it (and ``best`` when ``metric`` is a new best)."""
        path = self.folder / checkpoint_name(step)
        ts = payload.get("train_state", {})
        meta = {"step": step, "epoch": ts.get("epoch"), "step_in_epoch": ts.get("step_in_epoch"),
                "metric": metric, "reason": reason, "time": time.time()}
        write(path, payload, meta)
        atomic_write_text(self.folder / LAST, path.name + "\n")
        if metric is not None and metric.get("value") is not None and \
                (self.best_value is None or metric["value"] > self.best_value):
            self.best_value, self.best_file = float(metric["value"]), path
            atomic_write_text(self.folder / BEST, path.name + "\n")
        self._rotate()
        return path

    def supersede_after(self, step: int) -> list[Path]:
        """Move checkpoints newer than ``step`` into ``superseded/`` (resuming from an older one
        starts a new timeline; its saves must not mix with the abandoned one's)."""
        moved = []
        for s, p in step_files(self.folder):
            if s > step:
                dest = self.folder / SUPERSEDED / p.name
                dest.parent.mkdir(exist_ok=True)
                os.replace(p, dest)
                moved.append(dest)
        if moved:
            fsync_dir(self.folder)
            if self.best_file is not None and not self.best_file.exists():
                self._recompute_best()
        return moved

    def _recompute_best(self) -> None:
        self.best_value = self.best_file = None
        for _, p in step_files(self.folder):
            try:
                m = read_header(p).get("metric") or {}
            except CorruptCheckpoint:
                continue
            if m.get("value") is not None and (self.best_value is None or m["value"] > self.best_value):
                self.best_value, self.best_file = float(m["value"]), p
        if self.best_file is None:
            (self.folder / BEST).unlink(missing_ok=True)
        else:
            atomic_write_text(self.folder / BEST, self.best_file.name + "\n")

    def _rotate(self) -> None:
        files = step_files(self.folder)
        keep = {p for _, p in files[-self.keep:]} if self.keep > 0 else set()
        if self.best_file is not None:
            keep.add(self.best_file)
        removed = False
        for _, p in files:
            if p not in keep:
                p.unlink(missing_ok=True)
                removed = True
        if removed:
            fsync_dir(self.folder)
