"""Models described by a short spec, so users can try an architecture without code.

    conv5x5x32-relu,maxpool2,conv5x5x64-relu,maxpool2,fc1024-relu,dropout0.5,fc10

Tokens (comma separated; options after '-'):
  conv<K>x<K>x<C>[-s<S>][-same|-valid][-bn][-relu|-sigmoid|-tanh]
  maxpool<K>[s<S>] / avgpool<K>[s<S>] [-same|-valid]
  fc<N>[-relu|-sigmoid|-tanh]   (flattens first when needed)
  dropout<P>, bn, relu, sigmoid, tanh, flatten, gap (global average pool)
A classifier ``fc<num_classes>`` is appended when the spec does not end in an fc layer.
Kernels, pool sizes and strides are integers in [1, 4096], channels and units in [1, 2**31 - 1]
(``check_spec``, bounds from ``core.limits``; the memory check refuses far smaller models than
they allow): anything else is one error naming the token.

A spec is planned on the ``meta`` device before it is built (``check_memory``): one whose
parameters and one picture's activations need more memory than the machine has available
(``fc100000000``: 78 billion parameters, 292 GiB) is refused in one line before anything is
allocated, whichever verb builds it (train, summary, eval of a file naming it).
"""
from __future__ import annotations

import math
import re

import torch
import torch.nn as nn

from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError
from mnistflow.models.layers import ACTIVATIONS, Conv2d, Dropout, activation, out_shape, pool

_CONV = re.compile(r"^conv(\d+)x(\d+)x(\d+)$")
_POOL = re.compile(r"^(max|avg)pool(\d+)(?:s(\d+))?$")
_FC = re.compile(r"^fc(\d+)$")
_DROP = re.compile(r"^dropout(0?\.\d+|0|1)$")

_STRIDE = re.compile(r"s(\d+)")


def _short(text: str, limit: int = 60) -> str:
    """``text`` as an error shows it: at most ``limit`` characters."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _number(text: str, what: str, most: int, token: str, spec: str) -> int:
    """``text`` (digits) as an integer in [1, most], else one error naming the token."""
    n = int(text) if len(text) <= 12 else most + 1  # int() of thousands of digits is an error itself
    if not 1 <= n <= most:
        raise MnistflowError(f"model spec '{_short(spec)}': the {what} in '{_short(token)}' must be an "
                             f"integer in [1, {most}], got {_short(text, 20)}")
    return n


def _stride(opts: list[str], token: str, spec: str) -> int | None:
    """The ``-s<S>`` option of a token (None: not given)."""
    return next((_number(m.group(1), "stride", limits.MAX_SIDE, token, spec)
                 for o in opts if (m := _STRIDE.fullmatch(o))), None)


def check_spec(spec: str) -> None:
    """The numbers of every token within their bounds (no torch work): a spec with a zero or
    absurd kernel, stride, width or pool size fails here in one line naming the token."""
    for token in (t.strip() for t in spec.split(",") if t.strip()):
        head, *opts = token.split("-")
        if m := _CONV.match(head):
            _number(m.group(1), "kernel size", limits.MAX_SIDE, token, spec)
            _number(m.group(2), "kernel size", limits.MAX_SIDE, token, spec)
            _number(m.group(3), "number of channels", limits.MAX_UNITS, token, spec)
            _stride(opts, token, spec)
        elif m := _POOL.match(head):
            _number(m.group(2), "pool size", limits.MAX_SIDE, token, spec)
            if m.group(3) is not None:
                _number(m.group(3), "pool stride", limits.MAX_SIDE, token, spec)
        elif m := _FC.match(head):
            _number(m.group(1), "number of units", limits.MAX_UNITS, token, spec)


def looks_like_spec(text: str) -> bool:
    head = text.split(",")[0].split("-")[0]
    return "," in text or bool(_CONV.match(head) or _POOL.match(head) or _FC.match(head))


def _layer(token: str, shape: tuple[int, ...], spec: str) -> list[tuple[str, nn.Module]]:
    head, *opts = token.split("-")
    acts = [o for o in opts if o in ACTIVATIONS]
    bad = [o for o in opts if o not in ACTIVATIONS and o not in ("same", "valid", "bn")
           and not re.fullmatch(r"s\d+", o)]
    if bad:
        raise MnistflowError(f"model spec '{spec}': unknown option '{bad[0]}' in '{token}'")
    padding = "valid" if "valid" in opts else "same"
    out: list[tuple[str, nn.Module]] = []
    if m := _CONV.match(head):
        kh, kw, c = map(int, m.groups())
        if kh != kw:
            raise MnistflowError(f"model spec '{spec}': only square kernels ('{token}')")
        if len(shape) != 3:
            raise MnistflowError(f"model spec '{spec}': '{token}' after a flatten")
        stride = _stride(opts, token, spec) or 1
        out.append(("conv", Conv2d(shape[0], c, kh, stride, padding, bias="bn" not in opts)))
        if "bn" in opts:
            out.append(("bn", nn.BatchNorm2d(c)))
    elif m := _POOL.match(head):
        k = int(m.group(2))
        out.append((f"{m.group(1)}pool", pool(m.group(1), k, int(m.group(3) or k), padding)))
    elif m := _FC.match(head):
        if len(shape) != 1:
            out.append(("flatten", nn.Flatten()))
            shape = (int(math.prod(shape)),)
        out.append(("fc", nn.Linear(shape[0], int(m.group(1)))))
    elif m := _DROP.match(head):
        out.append(("dropout", Dropout(float(m.group(1)))))
    elif head == "bn":
        out.append(("bn", nn.BatchNorm2d(shape[0]) if len(shape) == 3 else nn.BatchNorm1d(shape[0])))
    elif head in ACTIVATIONS:
        out.append((head, activation(head)))
    elif head == "flatten":
        out.append(("flatten", nn.Flatten()))
    elif head == "gap":
        out += [("gap", nn.AdaptiveAvgPool2d(1)), ("flatten", nn.Flatten())]
    else:
        raise MnistflowError(f"model spec '{spec}': cannot read '{token}'")
    out += [(a, activation(a)) for a in acts]
    return out


def _pool_before_relu(layers: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """Swap every ReLU that feeds a max-pool: max(relu(a), relu(b)) == relu(max(a, b)), so the
    model computes the same function and gradients, with ReLU's forward and backward on 4x fewer
    values (the tutorial CNN's bf16 step on 2 cores: 17.9 -> 17.3 ms)."""
    out = list(layers)
    for i in range(len(out) - 1):
        if isinstance(out[i][1], nn.ReLU) and isinstance(out[i + 1][1], nn.MaxPool2d):
            out[i], out[i + 1] = out[i + 1], out[i]
    return out


def available_bytes() -> int:
    """Memory the machine can give this process now without swapping."""
    import psutil

    return int(psutil.virtual_memory().available)


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def model_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s parameters and buffers (works on the ``meta`` device)."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def check_memory(planned: nn.Module, what: str, activation_bytes: int = 0) -> None:
    """Refuse to build ``planned`` (a model made on the ``meta`` device) for real when its
    parameters, buffers and ``activation_bytes`` need more memory than is available."""
    weights = model_bytes(planned)
    need = weights + activation_bytes
    have = available_bytes()
    if need > have:
        params = sum(p.numel() for p in planned.parameters())
        raise MnistflowError(f"{what} needs {params:,} parameters ({_gib(weights)}"
                             + (f", plus {_gib(activation_bytes)} of activations" if activation_bytes else "")
                             + f"), more than the {_gib(have)} of memory available: refusing to build it")


def on_meta() -> bool:
    """Whether new tensors go to the ``meta`` device (inside ``with torch.device("meta")``)."""
    return torch.empty(0).device.type == "meta"


def build_from_spec(spec: str, in_shape: tuple[int, int, int], num_classes: int) -> nn.Sequential:
    """An ``nn.Sequential`` with layers named like ``conv1``, ``maxpool1``, ``fc2``; planned
    on the ``meta`` device first and refused there if it cannot fit in memory."""
    check_spec(spec)
    if not on_meta() and upper_bound_bytes(spec, in_shape, num_classes) > PLAN_ABOVE:
        with torch.device("meta"):
            planned, peak = _build(spec, in_shape, num_classes)
        # any use runs at least one picture through each layer: its input and output
        check_memory(planned, f"model spec '{spec}'", 2 * 4 * peak)
    return _build(spec, in_shape, num_classes)[0]


# Specs whose upper bound is at most this are built directly: they fit, and a plan would be a
# second build for nothing.
PLAN_ABOVE = 1 << 30


def upper_bound_bytes(spec: str, in_shape: tuple[int, int, int], num_classes: int) -> int:
    """An upper bound, from the tokens alone (no torch), on the float32 bytes of the spec's
    parameters plus one picture's largest activation: no layer of the spec language makes a
    picture larger than the input's H x W, so each layer is costed at that size. Tokens it
    cannot read cost nothing here (building reports them)."""
    c, h, w = (int(v) for v in in_shape)
    hw = h * w
    flat: int | None = None  # features after a flatten, None while still a picture
    params, peak = 0, c * hw
    for token in (t.strip() for t in spec.split(",") if t.strip()):
        head, *opts = token.split("-")
        if m := _CONV.match(head):
            k, out = int(m.group(1)), int(m.group(3))
            params += c * out * k * k + out + (4 * out if "bn" in opts else 0)
            c, flat = out, None
        elif m := _FC.match(head):
            n = int(m.group(1))
            params += (flat if flat is not None else c * hw) * n + n
            flat = n
        elif head == "bn":
            params += 4 * (flat if flat is not None else c)
        elif head in ("flatten", "gap"):
            flat = c * hw if head == "flatten" else c
        peak = max(peak, flat if flat is not None else c * hw)
    if flat is None or not _FC.match(spec.split(",")[-1].strip().split("-")[0]):
        params += (flat if flat is not None else c * hw) * num_classes + num_classes
    return 4 * (params + 2 * peak)


def _build(spec: str, in_shape: tuple[int, int, int], num_classes: int) -> tuple[nn.Sequential, int]:
    """(the model, the most values one layer's output holds for one picture)."""
    shape: tuple[int, ...] = tuple(in_shape)
    peak = math.prod(shape)
    model = nn.Sequential()
    counts: dict[str, int] = {}
    tokens = [t.strip() for t in spec.split(",") if t.strip()]
    if not tokens:
        raise MnistflowError("empty model spec")
    layers: list[tuple[str, nn.Module]] = []
    for token in tokens:
        try:
            made = _layer(token, shape, spec)
        except (RuntimeError, TypeError, ValueError, OverflowError) as e:  # sizes torch cannot hold
            raise MnistflowError(f"model spec '{_short(spec)}': cannot build '{_short(token)}' for input {shape} "
                                 f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
        for kind, layer in made:
            counts[kind] = counts.get(kind, 0) + 1
            layers.append((f"{kind}{counts[kind]}", layer))
            try:
                shape = out_shape(layer, shape)
            except RuntimeError as e:
                raise MnistflowError(f"model spec '{spec}': '{token}' does not fit input "
                                     f"{shape} ({str(e).splitlines()[0]})") from None
            peak = max(peak, math.prod(shape))
    for name, layer in _pool_before_relu(layers):
        model.add_module(name, layer)
    if not isinstance(model[-1], nn.Linear):
        if len(shape) != 1:
            model.add_module("flatten_out", nn.Flatten())
            shape = (int(math.prod(shape)),)
        model.add_module("classifier", nn.Linear(shape[0], num_classes))
        shape = (num_classes,)
    if shape != (num_classes,):
        raise MnistflowError(f"model spec '{spec}' ends with {shape[0]} outputs but the data has "
                             f"{num_classes} classes")
    return model, peak
