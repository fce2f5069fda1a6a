"""The trained model on disk: ``model.safetensors`` (weights plus what is needed to use them),
how a model is rebuilt from that description, and the ONE strict weight loader.

    from mnistflow.artifacts.model_file import load_model, save_model
    model, info = load_model("runs/fast-1")            # eval mode, ready for inference

``model.safetensors`` carries, in its metadata, the model name (or spec), input shape, class
names, the original label value of each output (``label_values``: labels 1..26 are outputs
0..25) and the normalization of its training data, so eval / predict / serve need nothing else.
A file written before ``label_values`` existed reads as outputs 0..K-1 = labels 0..K-1.
A user's own model (not registered by name) also records ``factory`` ("pkg.module:qualname")
and ``factory_kwargs``: loading imports that module (``artifacts.factory``; never a file inside the
run directory or next to the model file) and calls the factory. Nothing stored in the file is
ever executed.

Every path that puts saved weights into a model (model files, checkpoints, npz, resume) goes
through :func:`load_weights`: missing or unexpected names and shape mismatches are one clear
``MnistflowError`` naming them, never a traceback from deep inside torch.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import torch
import torch.nn as nn

from mnistflow.artifacts.factory import import_factory
from mnistflow.artifacts.rundir import MODEL, RunDir
from mnistflow.core.errors import MnistflowError
from mnistflow.core.fsutil import atomic_write_bytes, open_regular
from mnistflow.core.log import warn
from mnistflow.data.formats.raw import MAX_CLASSES  # as the record readers' label cap

if TYPE_CHECKING:
    from mnistflow.data.records import Records

MODEL_FILE = MODEL  # the run directory's model file name (``artifacts.rundir``)
META_KEY = "mnistflow"  # the metadata entry (safetensors, ONNX) holding the ModelInfo JSON


@dataclass
class ModelInfo:
    """What a saved model needs to be used: how to rebuild it, its input, its classes."""

    model: str  # registered name or layer spec (or a label for a user's model)
    in_shape: list[int]  # (C, H, W)
    class_names: list[str]
    mean: list[float]  # per channel, 0..255 units
    std: list[float]
    dataset: str = ""
    records: str | None = None
    metrics: dict = field(default_factory=dict)
    factory: str = ""  # "pkg.module:qualname" of a user's model class / factory
    factory_kwargs: dict = field(default_factory=dict)  # its keyword arguments (plain JSON)
    label_values: list[int] | None = None  # output i is label label_values[i]; None: 0..K-1

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def values(self) -> list[int]:
        """The original label value of each output, in output order."""
        return list(self.label_values) if self.label_values is not None else list(range(self.num_classes))

    def label(self, index: int) -> int:
        """The original label value of output ``index`` (what users see as the class id)."""
        return int(self.label_values[index]) if self.label_values is not None else int(index)

    def outputs_for(self, values: Sequence[int], where: str | Path | None = None,
                    present: Sequence[bool] | None = None) -> list[int]:
        """For a record set's classes (their label ``values``, in its class-index order), the
        output of this model for each: what maps the record set's labels onto the model's
        outputs. A class the model has no output for is an error naming it, unless
        ``present`` says the data holds no image of it (it maps to -1 then)."""
        mine = {v: i for i, v in enumerate(self.values)}
        out = []
        for j, v in enumerate(values):
            i = mine.get(int(v), -1)
            if i < 0 and (present is None or present[j]):
                raise MnistflowError(f"the data has class {int(v)}, which the model "
                                     f"({info_label(self)}) was not trained on: it predicts labels "
                                     f"{_span(self.values)}", where)
            out.append(i)
        return out

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def _span(values: Sequence[int]) -> str:
    vals = list(values)
    if len(vals) > 2 and vals == list(range(vals[0], vals[0] + len(vals))):
        return f"{vals[0]}..{vals[-1]}"
    return ", ".join(map(str, vals[:8])) + (", ..." if len(vals) > 8 else "")


def info_label(info: ModelInfo) -> str:
    return f"{info.model}{' on ' + info.dataset if info.dataset else ''}"


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


# Limits a model file's description must respect; anything beyond is what only a hostile or
# corrupt file would declare, and is refused before any memory is sized from it.
MAX_META_CHARS = 16 * 1024 * 1024  # the metadata JSON
MAX_CLASS_NAME = 1_000  # characters
MAX_CHANNELS = 64
MAX_INPUT_VALUES = 1 << 24  # C * H * W of one input image
MAX_MODEL_NAME = 10_000  # characters of a name or layer spec
_REQUIRED = ("model", "in_shape", "class_names", "mean", "std")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate_info(d: object, where: str | Path | None = None) -> ModelInfo:
    """A ``ModelInfo`` from its dict form, every field checked for type, range and consistency
    (in_shape of 3 positive ints within ``MAX_INPUT_VALUES``, 1..``MAX_CLASSES`` class names,
    one finite mean and positive std per channel). Unknown keys (a newer mnistflow's) are
    ignored; anything else wrong is one ``MnistflowError``."""
    def bad(why: str) -> MnistflowError:
        return MnistflowError(f"invalid mnistflow metadata: {why}", where)

    if not isinstance(d, dict):
        raise bad(f"expected a JSON object, got {type(d).__name__}")
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise bad(f"missing {', '.join(missing)}")
    model = d["model"]
    if not isinstance(model, str) or not model.strip() or len(model) > MAX_MODEL_NAME:
        raise bad(f"model must be a non-empty name of at most {MAX_MODEL_NAME:,} characters")
    shape = d["in_shape"]
    if not (isinstance(shape, list) and len(shape) == 3 and all(_is_int(v) and v > 0 for v in shape)):
        raise bad(f"in_shape must be 3 positive integers (C, H, W), got {str(shape)[:80]}")
    c, h, w = shape
    if c > MAX_CHANNELS or c * h * w > MAX_INPUT_VALUES:
        raise bad(f"in_shape {c}x{h}x{w} is too large (at most {MAX_CHANNELS} channels and "
                  f"{MAX_INPUT_VALUES:,} values per image)")
    names = d["class_names"]
    if not isinstance(names, list) or not 1 <= len(names) <= MAX_CLASSES:
        raise bad(f"class_names must be a list of 1 to {MAX_CLASSES:,} names"
                  + (f", got {len(names):,}" if isinstance(names, list) else ""))
    if not all(isinstance(n, str) and len(n) <= MAX_CLASS_NAME for n in names):
        raise bad(f"class_names must be strings of at most {MAX_CLASS_NAME:,} characters")
    for key in ("mean", "std"):
        v = d[key]
        if not (isinstance(v, list) and len(v) == c and all(_is_number(x) for x in v)):
            raise bad(f"{key} must be {c} finite number(s), one per channel, got {str(v)[:80]}")
    if any(x <= 0 for x in d["std"]):
        raise bad("std must be positive")
    for key, kinds in (("dataset", (str,)), ("records", (str, type(None))), ("metrics", (dict,)),
                       ("factory", (str,)), ("factory_kwargs", (dict,))):
        if key in d and not isinstance(d[key], kinds):
            raise bad(f"{key} has the wrong type ({type(d[key]).__name__})")
    values = d.get("label_values")
    if values is not None and not (isinstance(values, list) and len(values) == len(names)
                                   and all(_is_int(v) and v >= 0 for v in values)
                                   and len(set(values)) == len(values)):
        raise bad(f"label_values must be {len(names)} distinct non-negative integers, one per "
                  "class name")
    fields = {k: v for k, v in d.items() if k in ModelInfo.__dataclass_fields__}
    fields.update(in_shape=list(shape), mean=[float(x) for x in d["mean"]],
                  std=[float(x) for x in d["std"]])
    return ModelInfo(**fields)


def info_from_dict(d: dict, where: str | Path) -> ModelInfo:
    """A ModelInfo from its dict form, validated (``validate_info``); unknown keys (a newer
    mnistflow's) are ignored and files from before ``factory`` existed get its defaults."""
    return validate_info(d, where)


def info_from_json(text: str, where: str | Path) -> ModelInfo:
    """A ModelInfo from its JSON (see ``validate_info``), refused past ``MAX_META_CHARS``."""
    if not isinstance(text, str) or len(text) > MAX_META_CHARS:
        raise MnistflowError(f"unreadable mnistflow metadata (not text of at most "
                             f"{MAX_META_CHARS:,} characters)", where)
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise MnistflowError(f"unreadable mnistflow metadata ({e.__class__.__name__}: "
                             f"{str(e)[:120]})", where) from None
    return validate_info(d, where)


def info_from_records(model: str, rec: Records, metrics: dict | None = None) -> ModelInfo:
    """What a model trained on the record set ``rec`` needs to be used."""
    return ModelInfo(model=model, in_shape=list(rec.in_shape), class_names=rec.class_names, mean=rec.mean,
                     std=rec.std, dataset=rec.name, records=str(Path(rec.path).resolve()),
                     metrics=dict(metrics or {}), label_values=list(rec.label_values))


def outputs_of_records(info: ModelInfo, rec: Records, split: str) -> list[int] | None:
    """For each class of the record set ``rec`` (by its class index), the model's output for
    it, or None when they are the same (a model evaluated on its own kind of records). A
    class that ``split`` holds images of and the model has no output for is an error."""
    values = list(rec.label_values)
    named = dict(zip(info.values, info.class_names))  # the model's name of each label value
    other = [(v, n, named[v]) for v, n in zip(values, rec.class_names) if v in named and named[v] != n]
    if other:  # (cat/dog records against a digits model: label 0 is 'cat' there, '0' here)
        v, theirs, mine = other[0]
        warn(f"{rec.path}: its classes are named otherwise than the model's ({len(other)} of them, e.g. "
             f"label {v}: '{theirs}' there, '{mine}' in the model); they are matched by label value")
    if values == info.values:
        return None
    present = (rec.class_counts(split) > 0).tolist()
    return info.outputs_for(values, rec.path, present)


MAX_HEADER_BYTES = 64 * 1024 * 1024  # a safetensors JSON header (names, shapes, metadata)
# The largest model file read (model.safetensors, .onnx, the weights in a checkpoint): its
# tensors are read whole, so this bounds the memory one takes. mnistflow's largest registered
# model (seed-cnn, 3.3M parameters) is 13 MB in fp32: the cap leaves room for models 40 times
# its size, and refuses a sparse file or a link to /dev/zero before a byte is read.
MAX_MODEL_BYTES = 512 * 1024 ** 2


def _check_safetensors_header(p: Path) -> None:
    """A regular file of at most ``MAX_MODEL_BYTES`` (``fsutil.open_regular``: a FIFO or a
    device is refused, never opened by the library), then the 8-byte header length against the
    file size and ``MAX_HEADER_BYTES``, before the safetensors library reads (and allocates
    for) the header."""
    try:
        with open_regular(p, MAX_MODEL_BYTES, "model file") as f:
            head = f.read(8)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise MnistflowError(f"cannot read ({e.strerror})", p) from None
    if len(head) < 8:
        raise MnistflowError("not a safetensors model (shorter than its 8-byte header length)", p)
    n = int.from_bytes(head, "little")
    if n > min(MAX_HEADER_BYTES, size - 8):
        raise MnistflowError(f"not a safetensors model (header of {n:,} bytes in a file of "
                             f"{size:,}; at most {MAX_HEADER_BYTES:,})", p)


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

    Validated before anything is allocated: the header size, the metadata (``validate_info``)
    and the declared tensor shapes against the model it describes (``check_planned``)."""
    p = resolve_model_path(path)
    shapes, info = _open_model_file(p)
    model = build_model(info, p, expect=shapes)
    load_weights(model, _read_tensors(p), p, what=info.model)
    return model.to(device).eval(), info
