"""``mnistflow summary``: the layer table (like Keras ``model.summary()``) and the variables
(like the tutorial's ``print_all_variables``).

    mnistflow summary seed-cnn                         # a registered model, 1x28x28 input
    mnistflow summary "conv3x3x16-relu,maxpool2,fc10" --input 32x32 --channels 3
    mnistflow summary runs/fast-1 --variables          # a trained model; its trainable variables
    mnistflow summary runs/fast-1/model.onnx --all     # every variable, buffers included

Output shapes come from forward hooks on one input of the given size (batch dimension left
out). Multiply-accumulates are counted for convolutions and fully connected layers from
their shapes: conv = output elements x (in_channels / groups) x kh x kw, linear = output
elements x in_features; other layers (activations, pooling, batch norm) count 0.

A model is never built larger than memory allows: a layer spec is planned on the ``meta``
device when it could be large (``models.spec``), and so is any model for an input above
3x64x64 (``mnistflow summary seed-cnn --input 4096x4096`` holds 69 billion weights): one that
needs more than the available memory is one line ``mnistflow: error: ...``, nothing allocated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from mnistflow.core.errors import MnistflowError


@dataclass
class LayerRow:
    name: str
    type: str
    shape: tuple | None
    params: int
    trainable: str  # yes / no / partly / -
    macs: int
    calls: int = 0


def _own_params(m: nn.Module) -> list[nn.Parameter]:
    return list(m.parameters(recurse=False))


def _macs(m: nn.Module, out: torch.Tensor) -> int:
    if isinstance(m, nn.Conv2d) or isinstance(m, nn.Conv1d) or isinstance(m, nn.Conv3d):
        k = 1
        for s in m.kernel_size:
            k *= s
        return out[0].numel() * (m.in_channels // m.groups) * k
    if isinstance(m, nn.Linear):
        return out[0].numel() * m.in_features
    return 0


def layer_table(model: nn.Module, in_shape: tuple[int, int, int]) -> list[LayerRow]:
    """One row per leaf module (and per module holding its own parameters), in call order."""
    rows: dict[str, LayerRow] = {}
    order: list[str] = []
    handles = []
    leaves = [(n, m) for n, m in model.named_modules()
              if n and (not list(m.children()) or _own_params(m))]

    for name, mod in leaves:
        ps = _own_params(mod) if list(mod.children()) else list(mod.parameters())
        flags = {p.requires_grad for p in ps}
        trainable = "-" if not ps else "yes" if flags == {True} else "no" if flags == {False} else "partly"
        rows[name] = LayerRow(name, type(mod).__name__, None, sum(p.numel() for p in ps), trainable, 0)

        def hook(m, inp, out, name=name):
            r = rows[name]
            if isinstance(out, (tuple, list)):
                out = out[0]
            if not torch.is_tensor(out):
                return
            if r.calls == 0:
                r.shape = tuple(out.shape[1:])
                order.append(name)
            r.calls += 1
            r.macs += _macs(m, out)

        handles.append(mod.register_forward_hook(hook))
    was = model.training
    model.eval()
    try:
        dev = next((p.device for p in model.parameters()), torch.device("cpu"))
        with torch.no_grad():
            model(torch.zeros(1, *in_shape, device=dev))
    except RuntimeError as e:
        raise MnistflowError(f"the model does not take a {in_shape[0]}x{in_shape[1]}x{in_shape[2]} "
                             f"input ({str(e).splitlines()[0][:160]})") from None
    finally:
        model.train(was)
        for h in handles:
            h.remove()
    return [rows[n] for n in order] + [r for n, r in rows.items() if n not in order]


def _fmt_shape(s: tuple | None) -> str:
    if s is None:
        return "(not called)"
    return str(s[0]) if len(s) == 1 else "(" + ", ".join(map(str, s)) + ")"


def _human(n: float, unit: str = "") -> str:
    for k, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {k}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def _bytes(n: int) -> str:
    for k, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.2f} {k}"
    return f"{n} B"


def totals(model: nn.Module) -> dict:
    params = list(model.parameters())
    bufs = list(model.buffers())
    return {
        "trainable": sum(p.numel() for p in params if p.requires_grad),
        "frozen": sum(p.numel() for p in params if not p.requires_grad),
        "buffers": sum(b.numel() for b in bufs),
        "bytes": sum(p.numel() * p.element_size() for p in params)
        + sum(b.numel() * b.element_size() for b in bufs),
    }


def _table(header: list[str], rows: list[list[str]], align: str) -> list[str]:
    w = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells):
        return "  ".join(c.ljust(w[i]) if align[i] == "<" else c.rjust(w[i]) for i, c in enumerate(cells)).rstrip()

    rule = "-" * len(line(header))
    return [rule, line(header), rule] + [line(r) for r in rows] + [rule]


def variables_table(model: nn.Module, all_variables: bool = False) -> list[str]:
    """Every trainable variable (or all parameters and buffers) with its shape."""
    rows = []
    for name, p in model.named_parameters():
        if p.requires_grad or all_variables:
            rows.append([name, _fmt_shape(tuple(p.shape)) if p.dim() else "()", str(p.dtype).replace("torch.", ""),
                         f"{p.numel():,}", "trainable" if p.requires_grad else "frozen"])
    if all_variables:
        for name, b in model.named_buffers():
            rows.append([name, _fmt_shape(tuple(b.shape)) if b.dim() else "()", str(b.dtype).replace("torch.", ""),
                         f"{b.numel():,}", "buffer"])
    header = ["variable", "shape", "dtype", "values"] + (["kind"] if all_variables else [])
    if not all_variables:
        rows = [r[:4] for r in rows]
    return _table(header, rows, "<<<>" + "<" * all_variables)


def _resolve(model_or_path, input_size, channels, num_classes) -> tuple[nn.Module, tuple, str]:
    from mnistflow.models import get_entry, list_models
    from mnistflow.models.ensemble import parse_name
    from mnistflow.models.spec import looks_like_spec

    h, w = _size(input_size) if input_size is not None else (None, None)
    if isinstance(model_or_path, nn.Module):
        shape = (channels or 1, h or 28, w or 28)
        return model_or_path, shape, type(model_or_path).__name__
    text = str(model_or_path)
    p = Path(text)
    if p.exists():
        from mnistflow.artifacts.load import load_any
        from mnistflow.artifacts.model_file import build_model, unwrap
        from mnistflow.artifacts.onnx import OnnxBackend
        from mnistflow.artifacts.pt2 import ExportedModel

        model, info = load_any(p)
        c0, h0, w0 = info.in_shape
        shape = (channels or c0, h or h0, w or w0)
        if shape[0] != c0:  # another channel count: the architecture, from its name
            model = _create(info.model, shape, info.num_classes)
        elif isinstance(model, (OnnxBackend, ExportedModel)):  # the layers of the model it was exported from
            model = build_model(info, p)
        return unwrap(model), shape, f"{info.model} ({p})"
    if not looks_like_spec(text):
        try:
            get_entry(text)
        except MnistflowError:
            ensemble = parse_name(text)
            if ensemble and ensemble[0] in list_models():  # NAME-xK of a known NAME: the count is wrong
                raise
            raise MnistflowError(f"'{text}' is neither a file, a run directory, a registered model "
                                 "nor a layer spec") from None
    shape = (channels or 1, h or 28, w or 28)
    return _create(text, shape, num_classes or 10), shape, text


def _create(name: str, shape: tuple[int, int, int], classes: int) -> nn.Module:
    """``create_model``, refused in one line (before anything is allocated) when the model's
    weights and one picture's activations would not fit in the available memory."""
    from mnistflow.models import create_model
    from mnistflow.models.registry import META_ABOVE  # larger inputs are planned on meta first
    from mnistflow.models.spec import check_memory

    if math.prod(shape) > META_ABOVE:
        try:
            with torch.device("meta"):
                planned = create_model(name, shape, classes)
        except MnistflowError:
            raise
        except Exception:  # noqa: BLE001 -- it computes values while it is built: not plannable
            planned = None
        if planned is not None:
            try:
                outs = [math.prod(r.shape) for r in layer_table(planned, shape) if r.shape]
            except (MnistflowError, NotImplementedError, RuntimeError):  # an op meta lacks
                outs = []
            check_memory(planned, f"model '{name}' for a {'x'.join(map(str, shape))} input",
                         2 * 4 * max(outs, default=0))
    return create_model(name, shape, classes)


def _size(v) -> tuple[int, int]:
    if isinstance(v, str):
        try:
            a, b = (int(t) for t in v.lower().split("x"))
            return a, b
        except ValueError:
            raise MnistflowError(f"input size must look like 28x28, got '{v}'") from None
    if isinstance(v, int):
        return v, v
    a, b = v
    return int(a), int(b)


def summarize(model_or_path: nn.Module | str | Path, input_size: str | int | tuple[int, int] | None = None,
              variables: bool = False, all_variables: bool = False,
              *, channels: int | None = None, num_classes: int | None = None) -> str:
    """The summary text of a module, a registered model name, a spec string, or a saved model
    (run directory, safetensors, checkpoint, npz, ONNX)."""
    model, shape, title = _resolve(model_or_path, input_size, channels, num_classes)
    rows = layer_table(model, shape)
    t = totals(model)
    total_macs = sum(r.macs for r in rows)
    lines = [f"model: {title}", f"input: {shape[0]}x{shape[1]}x{shape[2]} (channels x height x width), "
                                 "shapes without the batch dimension"]
    lines += _table(["layer", "type", "output shape", "params", "trainable", "MACs"],
                    [[r.name, r.type, _fmt_shape(r.shape), f"{r.params:,}", r.trainable,
                      f"{r.macs:,}" if r.macs else "0"] for r in rows], "<<<><>")
    n_params = t["trainable"] + t["frozen"]
    lines += [f"total params:         {n_params:,}",
              f"trainable params:     {t['trainable']:,}",
              f"non-trainable params: {t['frozen'] + t['buffers']:,}"
              + (f" (frozen {t['frozen']:,}, buffers {t['buffers']:,})" if t['frozen'] + t['buffers'] else ""),
              f"size:                 {t['bytes']:,} bytes ({_bytes(t['bytes'])}, parameters and buffers)",
              f"multiply-accumulates: {total_macs:,} per image ({_human(total_macs, 'MAC')})"]
    if variables or all_variables:
        lines += ["", "all variables (parameters and buffers)" if all_variables else "trainable variables"]
        lines += variables_table(model, all_variables)
    return "\n".join(lines)
