"""What a saved model says about itself: ``ModelInfo``, and the check of it when read back.

Every file that holds a model (``model.safetensors``, an ONNX export, an npz, a checkpoint)
carries its ``ModelInfo`` as JSON: the model name (or layer spec), input shape, class names,
the original label value of each output (``label_values``: labels 1..26 are outputs 0..25) and
the normalization of its training data, so eval / predict / serve need nothing else. A file
written before ``label_values`` existed reads as outputs 0..K-1 = labels 0..K-1. A user's own
model (not registered by name) also records ``factory`` ("pkg.module:qualname") and
``factory_kwargs`` (see ``model_file.build_model``).

The info is read from files that may be hostile, so :func:`check_model_info` checks every field
for type, range and consistency before anything is sized from it.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError
from mnistflow.core.log import warn

if TYPE_CHECKING:
    from mnistflow.data.records import Records

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


# --- the check of a model file's info (untrusted input) ----------------------------------------
# (the bounds are in ``core.limits``: a file that declares more is refused before memory is sized)

_REQUIRED = ("model", "in_shape", "class_names", "mean", "std")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_model_info(d: object, where: str | Path | None = None) -> ModelInfo:
    """A ``ModelInfo`` from its dict form as a file holds it (an untrusted input), every field
    checked for type, range and consistency: in_shape of 3 positive ints within
    ``limits.MAX_INPUT_VALUES``, 1 to ``limits.MAX_CLASSES`` class names, one finite mean and
    positive std per channel. Unknown keys (a newer mnistflow's) are ignored; anything wrong is
    one ``MnistflowError``."""
    def bad(why: str) -> MnistflowError:
        return MnistflowError(f"invalid mnistflow metadata: {why}", where)

    if not isinstance(d, dict):
        raise bad(f"expected a JSON object, got {type(d).__name__}")
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise bad(f"missing {', '.join(missing)}")
    model = d["model"]
    if not isinstance(model, str) or not model.strip() or len(model) > limits.MAX_MODEL_NAME:
        raise bad(f"model must be a non-empty name of at most {limits.MAX_MODEL_NAME:,} characters")
    shape = d["in_shape"]
    if not (isinstance(shape, list) and len(shape) == 3 and all(_is_int(v) and v > 0 for v in shape)):
        raise bad(f"in_shape must be 3 positive integers (C, H, W), got {str(shape)[:80]}")
    c, h, w = shape
    if c > limits.MAX_CHANNELS or c * h * w > limits.MAX_INPUT_VALUES:
        raise bad(f"in_shape {c}x{h}x{w} is too large (at most {limits.MAX_CHANNELS} channels and "
                  f"{limits.MAX_INPUT_VALUES:,} values per image)")
    names = d["class_names"]
    if not isinstance(names, list) or not 1 <= len(names) <= limits.MAX_CLASSES:
        raise bad(f"class_names must be a list of 1 to {limits.MAX_CLASSES:,} names"
                  + (f", got {len(names):,}" if isinstance(names, list) else ""))
    if not all(isinstance(n, str) and len(n) <= limits.MAX_CLASS_NAME for n in names):
        raise bad(f"class_names must be strings of at most {limits.MAX_CLASS_NAME:,} characters")
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
        raise bad(f"label_values must be {len(names)} distinct non-negative integers, one per class name")
    fields = {k: v for k, v in d.items() if k in ModelInfo.__dataclass_fields__}
    fields.update(in_shape=list(shape), mean=[float(x) for x in d["mean"]], std=[float(x) for x in d["std"]])
    return ModelInfo(**fields)


def info_from_json(text: str, where: str | Path) -> ModelInfo:
    """A ModelInfo from its JSON (see ``check_model_info``), refused past ``limits.MAX_MODEL_META_CHARS``."""
    if not isinstance(text, str) or len(text) > limits.MAX_MODEL_META_CHARS:
        raise MnistflowError(f"unreadable mnistflow metadata (not text of at most "
                             f"{limits.MAX_MODEL_META_CHARS:,} characters)", where)
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise MnistflowError(f"unreadable mnistflow metadata ({e.__class__.__name__}: "
                             f"{str(e)[:120]})", where) from None
    return check_model_info(d, where)


# --- a model and the record sets it meets --------------------------------------------------------

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
