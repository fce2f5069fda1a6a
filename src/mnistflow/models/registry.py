"""Register models by name with a decorator; create them by name or from a spec string."""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Callable, TypeVar, overload

import torch.nn as nn

from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError
from mnistflow.models.ensemble import MAX_MEMBERS, Ensemble, parse_name


@dataclass(frozen=True)
class ModelEntry:
    name: str
    factory: Callable[..., nn.Module]  # factory(in_shape=(C, H, W), num_classes=K) -> module
    description: str  # the first paragraph of the factory's docstring, on one line


_REGISTRY: dict[str, ModelEntry] = {}
MAX_NAME = 64  # characters of a registered model's name
_Factory = TypeVar("_Factory", bound=Callable[..., nn.Module])


@overload
def register_model(fn: _Factory, *, name: str | None = None) -> _Factory: ...
@overload
def register_model(fn: None = None, *, name: str | None = None) -> Callable[[_Factory], _Factory]: ...
def register_model(fn: _Factory | None = None, *,
                   name: str | None = None) -> _Factory | Callable[[_Factory], _Factory]:
    """Decorator: register ``fn`` under ``name`` (default: the function name, '_' -> '-').
    A factory that is not callable, or a name that ``--model`` could not say (``_check_name``),
    is one ``MnistflowError``."""

    def wrap(f):
        if not callable(f):
            raise MnistflowError(f"register_model takes a model class or factory, not {type(f).__name__} "
                                 f"{_short(repr(f), 40)}")
        key = name if name is not None else getattr(f, "__name__", "").replace("_", "-")
        _check_name(key)
        if key in _REGISTRY:
            raise MnistflowError(f"model '{key}' registered twice")
        summary = inspect.cleandoc(f.__doc__ or "").split("\n\n")[0]  # the first paragraph
        _REGISTRY[key] = ModelEntry(key, f, " ".join(summary.split()))
        return f

    return wrap(fn) if fn is not None else wrap


_NAME_CHARS = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _check_name(key: object) -> None:
    """A model name ``--model`` can say and nothing else means: letters, digits and ``_.-``
    (no space, no ',' of a layer spec, no ':' of package.module:name), not ``NAME-xK`` (an
    ensemble) and not a layer spec (``conv5x5x32``)."""
    from mnistflow.models.spec import looks_like_spec

    if not isinstance(key, str) or not key:
        raise MnistflowError(f"a model name is a non-empty string, not {key!r}")
    why = (f"a model name takes letters, digits and _ . - only, at most {MAX_NAME} characters"
           if not _NAME_CHARS.fullmatch(key) or len(key) > MAX_NAME else
           "it names an ensemble (NAME-xK)" if parse_name(key) else
           "it reads as a layer spec" if looks_like_spec(key) else None)
    if why:
        raise MnistflowError(f"cannot register a model as {_short(key)!r}: {why}")


def list_models() -> list[str]:
    return sorted(_REGISTRY)


def _short(name: str, limit: int = 80) -> str:
    """``name`` as an error shows it: at most ``limit`` characters."""
    return name if len(name) <= limit else name[:limit - 3] + "..."


def get_entry(name: str) -> ModelEntry:
    """The registered model ``name``; ``NAME-xK``: an ensemble of K registered NAMEs
    (``models.ensemble``)."""
    parsed = parse_name(name) if name not in _REGISTRY else None
    if parsed and parsed[0] in _REGISTRY:
        member, k = parsed
        if not 2 <= k <= MAX_MEMBERS:
            raise MnistflowError(f"model '{_short(name)}': an ensemble has 2 to {MAX_MEMBERS} members, not {k}")
        base = _REGISTRY[member]

        def factory(in_shape=(1, 28, 28), num_classes: int = 10, **kwargs) -> nn.Module:
            return Ensemble(lambda: base.factory(in_shape=in_shape, num_classes=num_classes, **kwargs), k)

        return ModelEntry(name, factory, f"{k} {member} nets, their probabilities averaged")
    if name not in _REGISTRY:
        raise MnistflowError(f"unknown model '{_short(name)}' (known: {', '.join(list_models())}; "
                             "NAME-xK for an ensemble of K; or a spec like 'conv5x5x32-relu,maxpool2,fc10')")
    return _REGISTRY[name]


def create_model(name: str, in_shape: tuple[int, int, int] = (1, 28, 28),
                 num_classes: int = 10, **kwargs) -> nn.Module:
    """A new model: a registered name, or a layer spec string (see ``models.spec``)."""
    from mnistflow.models.spec import build_from_spec, looks_like_spec

    if (isinstance(num_classes, bool) or not isinstance(num_classes, int)
            or not 1 <= num_classes <= limits.MAX_CLASSES):
        raise MnistflowError(f"num_classes must be an integer from 1 to {limits.MAX_CLASSES}, got {num_classes!r}")
    if (not isinstance(in_shape, (tuple, list)) or len(in_shape) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in in_shape)):
        raise MnistflowError(f"in_shape must be (channels, height, width), positive integers, got {in_shape!r}")
    if name not in _REGISTRY and looks_like_spec(name):
        return build_from_spec(name, in_shape, num_classes)
    return get_entry(name).factory(in_shape=tuple(in_shape), num_classes=num_classes, **kwargs)


# Inputs up to this many values (channels x pixels, above any known dataset's 3x32x32) are built
# on the CPU; larger ones on the meta device, where a layer's weights take no memory whatever
# their size (its first use costs ~1 s of imports, so the usual listing does not pay it).
META_ABOVE = 3 * 64 * 64


def parameter_count(name: str, shape: tuple[int, int, int], classes: int) -> int:
    """Parameters of model ``name`` for input ``shape`` (C, H, W), in bounded memory."""
    import math

    import torch

    if math.prod(shape) <= META_ABOVE:
        model = create_model(name, shape, classes)
    else:
        try:
            with torch.device("meta"):
                model = create_model(name, shape, classes)
        except (NotImplementedError, RuntimeError) as e:  # it computes values while it is built
            raise MnistflowError(f"cannot count its parameters for input {'x'.join(map(str, shape))} "
                                 f"without building it ({type(e).__name__}); try a smaller --input",
                                 name) from None
    return sum(p.numel() for p in model.parameters())


def check_trainable(model: nn.Module, name: str) -> None:
    """A model with no parameters, or with every one frozen (``requires_grad=False``), has
    nothing to train (and no device to read them from)."""
    params = list(model.parameters())
    if not params:
        raise MnistflowError(f"model {name} has no parameters: there is nothing to train")
    if not any(p.requires_grad for p in params):
        raise MnistflowError(f"model {name} has every parameter frozen (requires_grad=False, all "
                             f"{len(params)}): there is nothing to train")
