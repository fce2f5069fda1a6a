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
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from mnistflow.artifacts.model_file import ModelInfo, WeightsFit, check_fit, info_from_json, unwrap
from mnistflow.core.errors import MnistflowError, display
from mnistflow.core.fsutil import atomic_write_bytes

NPZ_META_KEY = "__mnistflow__"


def globs(only) -> list[str]:
    """``--only`` as a list of globs: a string (comma-separated) or a list of them."""
    if not only:
        return []
    items = [only] if isinstance(only, str) else list(only)
    return [g.strip() for item in items for g in str(item).split(",") if g.strip()]


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


def read_npz(path: str | Path) -> tuple[dict[str, np.ndarray], ModelInfo | None]:
    """(name -> array, info or None) from an npz, opened with ``allow_pickle=False``."""
    p = Path(path)
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise MnistflowError("no such file", p) from None
    except ValueError as e:
        if "pickle" in str(e).lower():
            raise MnistflowError("refused: the npz holds pickled objects (loading them could "
                                 "execute code); only plain arrays are read", p) from None
        raise MnistflowError(f"not a readable npz ({e})", p) from None
    except Exception as e:  # OSError, EOFError, zipfile.BadZipFile and friends
        raise MnistflowError(f"not a readable npz ({e.__class__.__name__}: {e})", p) from None
    info = None
    raw = arrays.pop(NPZ_META_KEY, None)
    if raw is not None:
        if raw.dtype != np.uint8 or raw.ndim != 1:
            raise MnistflowError(f"'{NPZ_META_KEY}' entry is not uint8 JSON", p)
        try:
            meta = json.loads(raw.tobytes().decode()) if raw.size else {}
        except ValueError as e:
            raise MnistflowError(f"unreadable '{NPZ_META_KEY}' entry ({e})", p) from None
        info = info_from_json(json.dumps(meta.get("info", {})), p)
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


def load_npz_into(model: nn.Module, path: str | Path, only=None, *,
                  arrays: dict[str, np.ndarray] | None = None) -> NpzReport:
    """Copy arrays into ``model``'s parameters/buffers by name (selected by ``only`` globs).

    A partial restore (``--init-from``): names missing from the file, names the model lacks
    and shape mismatches are reported (and left untouched) instead of failing obscurely.
    """
    if arrays is None:
        arrays, _ = read_npz(path)
    patterns = globs(only)
    own = unwrap(model).state_dict()
    rep = NpzReport(str(path))
    rep.skipped = sorted(k for k in set(own) | set(arrays) if not selected(k, patterns))
    fit = check_fit({k: v for k, v in own.items() if selected(k, patterns)},
                    {k: a for k, a in arrays.items() if selected(k, patterns)})
    rep.missing, rep.mismatched = fit.missing, fit.mismatched
    rep.unexpected = sorted(fit.unexpected)
    bad = set(fit.missing) | {n for n, _, _ in fit.mismatched}
    rep.loaded = [k for k in own if selected(k, patterns) and k not in bad]
    if rep.loaded:
        with torch.no_grad():
            for name in rep.loaded:  # state_dict tensors share storage with the module
                own[name].copy_(torch.tensor(arrays[name], dtype=own[name].dtype))  # keeps 0-d 0-d
    return rep
