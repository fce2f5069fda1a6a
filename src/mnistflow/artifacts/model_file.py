"""The trained model on disk: ``model.safetensors`` (weights plus their ``ModelInfo``), how a
model is rebuilt from its info, and the ONE strict weight loader.

    from mnistflow.artifacts.model_file import load_model, save_model
    model, info = load_model("runs/fast-1")            # eval mode, ready for inference

What the info holds and how it is checked is ``artifacts.model_info``. A user's own model (not
registered by name) is rebuilt by importing its recorded ``factory`` ("pkg.module:qualname")
and calling it with ``factory_kwargs``: never from a file inside the run directory or next to
the model file (:func:`import_factory`). Nothing stored in the file is ever executed.

Every path that puts saved weights into a model (model files, checkpoints, npz, resume) goes
through :func:`load_weights`: missing or unexpected names and shape mismatches are one clear
``MnistflowError`` naming them, never a traceback from deep inside torch.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import torch
import torch.nn as nn

from mnistflow.artifacts.model_info import META_KEY, ModelInfo, info_from_json
from mnistflow.artifacts.rundir import MODEL, RunDir
from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError
from mnistflow.core.fsutil import atomic_write_bytes, open_regular

MODEL_FILE = MODEL  # the run directory's model file name (``artifacts.rundir``)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DDP / torch.compile wrappers (what gets saved)."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


# --- the one strict weight loader -------------------------------------------------------------

def _dims(shape: Iterable[int]) -> str:
    return "x".join(map(str, shape)) or "scalar"


@dataclass
class WeightsFit:
    """How a set of named tensors fits a model's state dict, name by name."""

    missing: list[str] = field(default_factory=list)  # the model has it, the weights do not
    unexpected: list[str] = field(default_factory=list)  # the weights have it, the model does not
    mismatched: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # name, given, model

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def describe(self, missing: str = "missing", limit: int = 4) -> str:
        """``missing: a, b; unexpected: c; shape mismatch: d (file 3x96, model 10x96)``."""
        def short(v: list[str]) -> str:
            return ", ".join(v[:limit]) + (f" and {len(v) - limit} more" if len(v) > limit else "")

        parts = []
        if self.missing:
            parts.append(f"{missing}: {short(self.missing)}")
        if self.unexpected:
            parts.append(f"unexpected: {short(self.unexpected)}")
        if self.mismatched:
            parts.append("shape mismatch: " + short([f"{n} (file {_dims(a)}, model {_dims(b)})"
                                                      for n, a, b in self.mismatched]))
        return "; ".join(parts) or "all names match"


def check_fit(own: Mapping[str, torch.Tensor], given: Mapping[str, object]) -> WeightsFit:
    """Compare ``given`` (tensors or arrays by name) with a model's state dict ``own``."""
    fit = WeightsFit()
    for name, t in own.items():
        if name not in given:
            fit.missing.append(name)
        elif tuple(given[name].shape) != tuple(t.shape):
            fit.mismatched.append((name, tuple(given[name].shape), tuple(t.shape)))
    fit.unexpected = [k for k in given if k not in own]
    return fit


def check_values(weights: Mapping[str, object], where: str | Path | None = None) -> None:
    """Every tensor (or array) of ``weights`` holds real numbers (bool, integer or floating
    point; a complex one would lose its imaginary part, anything else is not a weight) and,
    floating point, only finite ones: a NaN or an infinity would make every prediction NaN.
    The first offender is one ``MnistflowError`` naming it."""
    for name, t in weights.items():
        if not isinstance(t, torch.Tensor):
            try:
                t = torch.as_tensor(t)
            except (TypeError, ValueError, RuntimeError):
                raise MnistflowError(f"tensor '{str(name)[:80]}' is not an array of numbers", where) from None
        if t.is_complex() or not (t.is_floating_point() or t.dtype == torch.bool or _is_int_dtype(t.dtype)):
            raise MnistflowError(f"tensor '{str(name)[:80]}' holds {str(t.dtype).replace('torch.', '')} "
                                 "values; weights must be real numbers (bool, int or float)", where)
        if t.is_floating_point() and t.numel():
            try:
                finite = bool(torch.isfinite(t).all())
            except (RuntimeError, TypeError):  # a float type without isfinite (float8): as float32
                finite = bool(torch.isfinite(t.float()).all())
            if not finite:
                bad = int((~torch.isfinite(t.float())).sum())
                raise MnistflowError(f"tensor '{str(name)[:80]}' holds {bad:,} non-finite value(s) "
                                     "(NaN or infinity); refusing weights that would make every "
                                     "prediction NaN", where)


def _is_int_dtype(dtype: torch.dtype) -> bool:
    return dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8) or \
        str(dtype) in ("torch.uint16", "torch.uint32", "torch.uint64")


def load_weights(model: nn.Module, weights: Mapping[str, torch.Tensor],
                 where: str | Path | None = None, *, what: str = "") -> nn.Module:
    """Load ``weights`` into (the unwrapped) ``model``, strictly; returns the unwrapped model.

    Any missing or unexpected name or shape mismatch raises ``MnistflowError`` naming them
    (``what``: the model's name for the message), and so does a tensor of non-real numbers
    or with a NaN or infinity (``check_values``); nothing is loaded then."""
    target = unwrap(model)
    fit = check_fit(target.state_dict(), weights)
    if not fit.ok:
        raise MnistflowError(f"weights do not fit {'model ' + repr(what) if what else 'the model'} "
                             f"({fit.describe()})", where)
    check_values(weights, where)
    target.load_state_dict(dict(weights), strict=True)
    return target


# --- rebuilding a model from its description -----------------------------------------------

# A user's model class or factory is imported by its ``package.module:qualname``; never from the
# run directory or the saved model's folder, since saved files must not run code.

def _is_within(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except (ValueError, OSError):
        return False


def _forbidden_dirs(source: str | Path | None) -> list[Path]:
    """Where a factory's code must not come from: the saved file's folder and its run."""
    if source is None:
        return []
    p = Path(source)
    folder = p if p.is_dir() else p.parent
    run = RunDir.of_checkpoint(p)
    return [folder] + ([run.path] if run is not None else [])


def import_factory(spec: str, source: str | Path | None) -> Callable:
    """The callable named by ``pkg.module:qualname``, imported with importlib; refused when its
    code would come from the run directory or the saved model's folder."""
    mod_name, sep, qualname = spec.partition(":")
    if not sep or not mod_name or not qualname or any(not part.isidentifier()
                                                      for part in mod_name.split(".") + qualname.split(".")):
        raise MnistflowError(f"model factory '{spec}' is not of the form 'package.module:name'", source)
    forbidden = _forbidden_dirs(source)

    def check(origin: str | None, locations: Iterable[str] = ()) -> None:
        for where in [origin, *locations]:
            if where and any(_is_within(Path(where), d) for d in forbidden):
                raise MnistflowError(f"refused: the model factory '{spec}' would be imported from "
                                     f"{where}, inside the run directory or next to the model file "
                                     "(saved files never run code; install the module or put it "
                                     "on PYTHONPATH elsewhere)", source)

    top = mod_name.split(".")[0]
    try:
        found = importlib.util.find_spec(top)  # locating a top-level module executes nothing
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise MnistflowError(f"cannot rebuild the model: its module '{mod_name}' is not importable "
                             f"(factory '{spec}'; install it or add it to PYTHONPATH)", source)
    check(found.origin, found.submodule_search_locations or ())
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:
        raise MnistflowError(f"cannot import '{mod_name}' for the model factory '{spec}' ({e})",
                             source) from None
    check(getattr(module, "__file__", None))
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise MnistflowError(f"'{mod_name}' has no '{qualname}' (model factory '{spec}')", source)
    if not callable(obj):
        raise MnistflowError(f"model factory '{spec}' is not callable", source)
    return obj


def check_planned(info: ModelInfo, shapes: Mapping[str, Sequence[int]],
                  source: str | Path | None = None) -> None:
    """Refuse weights of ``shapes`` (name -> shape, as a file declares them) that do not fit the
    model ``info`` describes, judged on the ``meta`` device: nothing is allocated, so a
    description that would need gigabytes (a huge spec, millions of classes) is refused
    before it costs anything. A model that cannot be built on ``meta`` is not pre-checked."""
    try:
        with torch.device("meta"):
            planned = build_model(info, source)
        own = planned.state_dict()
    except MnistflowError as e:  # e.g. a spec that does not fit: name the file
        raise e if e.path is not None or source is None else MnistflowError(e.detail, source) from None
    except Exception:  # e.g. a user's factory that computes real values at construction
        return
    fit = check_fit(own, {k: _Shape(v) for k, v in shapes.items()})
    if not fit.ok:
        raise MnistflowError(f"weights do not fit model {info.model!r} ({fit.describe()})", source)


class _Shape:
    """A declared shape standing in for a tensor in ``check_fit``."""

    __slots__ = ("shape",)

    def __init__(self, shape: Sequence[int]):
        self.shape = tuple(shape)


def build_model(info: ModelInfo, source: str | Path | None = None, *,
                expect: Mapping[str, Sequence[int]] | None = None) -> nn.Module:
    """A fresh (untrained) model as ``info`` describes it: a registered name or layer spec, else
    the recorded factory called with its recorded keyword arguments. ``expect`` (name -> shape
    of the weights to load): checked first without allocating (``check_planned``)."""
    from mnistflow.models import create_model, list_models

    if expect is not None:
        check_planned(info, expect, source)
    from mnistflow.models.spec import looks_like_spec

    if info.factory and info.model not in list_models() and not looks_like_spec(info.model):
        factory = import_factory(info.factory, source)
        try:
            model = factory(**dict(info.factory_kwargs or {}))
        except Exception as e:  # user code: any failure is reported in one line
            raise MnistflowError(f"the model factory '{info.factory}' failed "
                                 f"({e.__class__.__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})",
                                 source) from None
        if not isinstance(model, nn.Module):
            raise MnistflowError(f"the model factory '{info.factory}' returned a "
                                 f"{type(model).__name__}, not a torch.nn.Module", source)
        return model
    return create_model(info.model, tuple(info.in_shape), info.num_classes)


# --- model.safetensors ------------------------------------------------------------------------

def save_model(path: str | Path, model: nn.Module, info: ModelInfo) -> Path:
    """Write weights + info atomically as safetensors."""
    from safetensors.torch import save

    sd = {k: v.detach().cpu().contiguous() for k, v in unwrap(model).state_dict().items()}
    atomic_write_bytes(path, save(sd, metadata={META_KEY: info.to_json()}))
    return Path(path)


def resolve_model_path(path: str | Path) -> Path:
    """``RUN/model.safetensors`` for a run directory; the file itself otherwise."""
    p = Path(path)
    if p.is_dir():
        if RunDir(p).model.is_file():
            return RunDir(p).model
        raise MnistflowError(f"no {MODEL_FILE} in this run directory (did the run finish?)", p)
    if not p.exists():
        raise MnistflowError("no such file or directory", p)
    return p


def _check_safetensors_header(p: Path) -> None:
    """A regular file of at most ``limits.MAX_MODEL_BYTES`` (``fsutil.open_regular``: a FIFO or a
    device is refused, never opened by the library), then the 8-byte header length against the
    file size and ``limits.MAX_SAFETENSORS_HEADER_BYTES``, before the safetensors library reads (and allocates
    for) the header."""
    try:
        with open_regular(p, limits.MAX_MODEL_BYTES, "model file") as f:
            head = f.read(8)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise MnistflowError(f"cannot read ({e.strerror})", p) from None
    if len(head) < 8:
        raise MnistflowError("not a safetensors model (shorter than its 8-byte header length)", p)
    n = int.from_bytes(head, "little")
    if n > min(limits.MAX_SAFETENSORS_HEADER_BYTES, size - 8):
        raise MnistflowError(f"not a safetensors model (header of {n:,} bytes in a file of "
                             f"{size:,}; at most {limits.MAX_SAFETENSORS_HEADER_BYTES:,})", p)


def _open_model_file(p: Path) -> tuple[dict[str, tuple[int, ...]], ModelInfo]:
    """(name -> declared shape, validated info) of a safetensors model, reading only its header."""
    from safetensors import SafetensorError, safe_open

    _check_safetensors_header(p)
    try:
        with safe_open(str(p), "pt") as f:
            meta = f.metadata() or {}
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise MnistflowError(f"not a readable safetensors model ({str(e)[:160]})", p) from None
    if META_KEY not in meta:
        raise MnistflowError("has no mnistflow metadata (which model is it?)", p)
    return shapes, info_from_json(meta[META_KEY], p)


def _read_tensors(p: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(p))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise MnistflowError(f"not a readable safetensors model ({str(e)[:160]})", p) from None


def read_model_file(path: str | Path) -> tuple[dict[str, torch.Tensor], ModelInfo]:
    """(weights, info) of a ``.safetensors`` model file (or a run directory's); the header and
    the metadata are validated before any tensor is read."""
    p = resolve_model_path(path)
    _, info = _open_model_file(p)
    return _read_tensors(p), info


def load_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[nn.Module, ModelInfo]:
    """A model ready for inference (eval mode) from a run directory or a .safetensors file.

    Validated before anything is allocated: the header size, the metadata (``check_model_info``)
    and the declared tensor shapes against the model it describes (``check_planned``)."""
    p = resolve_model_path(path)
    shapes, info = _open_model_file(p)
    model = build_model(info, p, expect=shapes)
    load_weights(model, _read_tensors(p), p, what=info.model)
    return model.to(device).eval(), info
