"""Parameters as an ``.npz``: one array per parameter/buffer name, no pickled objects.

    mnistflow export runs/fast-1 --format npz --only 'conv*'                      # write
    mnistflow train --model seed-cnn --init-from runs/a/model.npz --init-only 'conv*'  # restore by name

A reserved ``__mnistflow__`` entry holds the model's info (uint8 JSON), so the file opens with
``numpy.load(allow_pickle=False)`` and still says which model it is. ``load_npz_into`` restores
a selection by name and reports every name (for ``--init-from``); loading a whole model from an
npz goes through the strict loader (``artifacts.load.load_any``).
"""
from __future__ import annotations

import fnmatch
import io
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
import torch.nn as nn

from mnistflow.artifacts.model_file import WeightsFit, check_fit, check_values, unwrap
from mnistflow.artifacts.model_info import ModelInfo, check_model_info
from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError, display
from mnistflow.core.fsutil import atomic_write_bytes, regular_file

NPZ_META_KEY = "__mnistflow__"


def globs(only: str | Iterable[str] | None, flag: str = "--only") -> list[str]:
    """``--only`` as a list of globs: a string (comma-separated) or a list of them. None or an
    empty list: no selection (everything); a selection given that holds no pattern (``''``,
    ``',,'``) is an error, not everything."""
    if only is None:
        return []
    items = [only] if isinstance(only, str) else list(only)
    patterns = [g.strip() for item in items for g in str(item).split(",") if g.strip()]
    if items and not patterns:
        raise MnistflowError(f"{flag} {only!r} holds no name pattern: give comma-separated globs "
                             "(e.g. 'conv*,fc1.*'), or leave it out for every parameter")
    return patterns


def selected(name: str, patterns: list[str]) -> bool:
    return not patterns or any(fnmatch.fnmatchcase(name, g) for g in patterns)


def write_npz(path: str | Path, arrays: dict[str, np.ndarray], info: ModelInfo | None) -> None:
    """An npz of name -> array (no pickled objects), plus the info under ``__mnistflow__``."""
    if NPZ_META_KEY in arrays:
        raise MnistflowError(f"'{NPZ_META_KEY}' is a reserved name")
    entries = dict(arrays)
    if info is not None:
        meta = json.dumps({"format": "mnistflow-npz", "version": 1, "info": asdict(info)})
        entries[NPZ_META_KEY] = np.frombuffer(meta.encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **entries)
    atomic_write_bytes(path, buf.getvalue())


NUMBER_KINDS = "biuf"  # bool, signed and unsigned integers, floats


def check_npz(p: Path) -> None:
    """Every member's ``.npy`` header against the zip directory, before any array is read: a
    member must be a plain number array (no text, no pickled objects) whose declared shape and
    dtype account for exactly its stored size, and all of them together at most
    ``limits.MAX_NPZ_BYTES``. A file that is not a zip is refused here too."""
    import zipfile

    from numpy.lib import format as npf

    readers = {(1, 0): npf.read_array_header_1_0, (2, 0): npf.read_array_header_2_0}
    try:
        if not zipfile.is_zipfile(p):
            raise MnistflowError("not an npz (it is not a zip archive of .npy arrays)", p)
        total = 0
        with zipfile.ZipFile(p) as z:
            for zi in z.infolist():
                name = zi.filename[:-4] if zi.filename.endswith(".npy") else None
                if name is None or zi.is_dir():
                    raise MnistflowError(f"not an npz of arrays (member '{zi.filename[:80]}')", p)
                with z.open(zi) as f:
                    try:
                        version = npf.read_magic(f)
                        shape, _, dtype = readers[version](f)
                    except (ValueError, KeyError, EOFError) as e:
                        raise MnistflowError(f"'{name}' is not a readable .npy array "
                                             f"({e.__class__.__name__})", p) from None
                    header = f.tell()
                if dtype.hasobject:
                    raise MnistflowError("refused: the npz holds pickled objects (loading them could "
                                         f"execute code); only plain arrays are read ('{name}')", p)
                if dtype.kind not in NUMBER_KINDS:
                    raise MnistflowError(f"'{name}' holds {dtype} values; parameters must be numbers "
                                         "(bool, int, uint or float)", p)
                nbytes = math.prod(shape) * dtype.itemsize
                if header + nbytes != zi.file_size:
                    raise MnistflowError(f"'{name}' declares {'x'.join(map(str, shape)) or 'a scalar'} "
                                         f"{dtype} ({nbytes:,} bytes) but stores "
                                         f"{max(zi.file_size - header, 0):,}", p)
                total += nbytes
                if total > limits.MAX_NPZ_BYTES:
                    raise MnistflowError(f"the arrays declare over {limits.MAX_NPZ_BYTES:,} bytes", p)
    except FileNotFoundError:
        raise MnistflowError("no such file", p) from None
    except (OSError, zipfile.BadZipFile, EOFError, NotImplementedError) as e:
        raise MnistflowError(f"not a readable npz ({e.__class__.__name__}: {str(e)[:120]})", p) from None


def read_npz(path: str | Path) -> tuple[dict[str, np.ndarray], ModelInfo | None]:
    """(name -> array, info or None) from an npz, each member's header checked first
    (``check_npz``), then opened with ``allow_pickle=False``."""
    p = regular_file(path, limits.MAX_NPZ_FILE_BYTES, "npz")  # a FIFO would block, a device never end
    check_npz(p)
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise MnistflowError("no such file", p) from None
    except Exception as e:  # OSError, EOFError, zipfile.BadZipFile (a bad CRC) and friends
        raise MnistflowError(f"not a readable npz ({e.__class__.__name__}: {str(e)[:120]})", p) from None
    info = None
    raw = arrays.pop(NPZ_META_KEY, None)
    if raw is not None:
        if raw.dtype != np.uint8 or raw.ndim != 1 or raw.size > limits.MAX_MODEL_META_CHARS:
            raise MnistflowError(f"'{NPZ_META_KEY}' entry is not uint8 JSON", p)
        try:
            meta = json.loads(raw.tobytes().decode()) if raw.size else {}
        except (ValueError, RecursionError) as e:
            raise MnistflowError(f"unreadable '{NPZ_META_KEY}' entry ({e.__class__.__name__})", p) from None
        if not isinstance(meta, dict):
            raise MnistflowError(f"'{NPZ_META_KEY}' entry is not a JSON object", p)
        info = check_model_info(meta.get("info", {}), p)
    return arrays, info


def as_tensors(arrays: dict[str, np.ndarray], like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The arrays as tensors of the dtypes of ``like`` (a state dict) where it has the name."""
    return {k: torch.tensor(a, dtype=like[k].dtype if k in like else None) for k, a in arrays.items()}


@dataclass
class NpzReport:
    """What restoring by name did: every name is accounted for."""

    path: str
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # in the model (and selected), not in the file
    unexpected: list[str] = field(default_factory=list)  # in the file (and selected), not in the model
    mismatched: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # name, file, model shape
    skipped: list[str] = field(default_factory=list)  # not selected by --only

    @property
    def complete(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def problems(self) -> str:
        return WeightsFit(self.missing, self.unexpected, self.mismatched).describe("missing in file", 5)

    def format(self) -> str:
        head = (f"restored {len(self.loaded)} of {len(self.loaded) + len(self.missing) + len(self.mismatched)} "
                f"selected tensors from {display(self.path)}")
        if self.skipped:
            head += f" ({len(self.skipped)} not selected by --only)"
        return head + ("" if self.complete else f"; {self.problems()}")


def load_npz_into(model: nn.Module, path: str | Path, only: str | Iterable[str] | None = None, *,
                  arrays: dict[str, np.ndarray] | None = None, flag: str = "--only") -> NpzReport:
    """Copy arrays into ``model``'s parameters/buffers by name (selected by ``only`` globs).

    A partial restore (``--init-from``): names missing from the file, names the model lacks
    and shape mismatches are reported (and left untouched) instead of failing obscurely.
    """
    if arrays is None:
        arrays, _ = read_npz(path)
    patterns = globs(only, flag)
    own = unwrap(model).state_dict()
    rep = NpzReport(str(path))
    rep.skipped = sorted(k for k in set(own) | set(arrays) if not selected(k, patterns))
    fit = check_fit({k: v for k, v in own.items() if selected(k, patterns)},
                    {k: a for k, a in arrays.items() if selected(k, patterns)})
    rep.missing, rep.mismatched = fit.missing, fit.mismatched
    rep.unexpected = sorted(fit.unexpected)
    bad = set(fit.missing) | {n for n, _, _ in fit.mismatched}
    rep.loaded = [k for k in own if selected(k, patterns) and k not in bad]
    check_values({k: arrays[k] for k in rep.loaded}, path)  # as the strict loader: no NaN, no inf
    if rep.loaded:
        with torch.no_grad():
            for name in rep.loaded:  # state_dict tensors share storage with the module
                own[name].copy_(torch.tensor(arrays[name], dtype=own[name].dtype))  # keeps 0-d 0-d
    return rep
