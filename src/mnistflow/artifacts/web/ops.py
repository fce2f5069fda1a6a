"""The torch functions a traced forward may call, each recorded as nodes of the graph.

``HANDLERS`` maps a torch function's name (``F.relu``, ``torch.relu`` and ``Tensor.relu`` are
all ``relu``) to a function ``(tracer, args, kwargs, out)`` that appends the nodes computing
``out`` from the arguments, or raises ``Refused`` for a form it cannot hold (a dropout in
training mode, a reflect padding, a division with rounding). The node attributes are what
``server/static/web/forward.js`` and ``run.run_graph`` read.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from mnistflow.artifacts.web.graph import Tracer, Refused

Handler = Callable[[Tracer, tuple, dict, torch.Tensor], Any]


def _a(args: tuple, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    """Argument ``i`` (positional) or ``name`` (keyword) of a call."""
    return args[i] if len(args) > i else kwargs.get(name, default)


def _pair(v: Any) -> list[int]:
    if isinstance(v, int):
        return [v, v]
    v = [int(x) for x in v]
    return v * 2 if len(v) == 1 else v


def _axes(dims: Any, ndim: int) -> list[int]:
    """Dimensions as non-negative axes, sorted; None (or ()) is every axis."""
    if dims is None or (isinstance(dims, (tuple, list)) and not dims):
        return list(range(ndim))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted(d % ndim for d in dims)


def _const_param(tr: Tracer, t: torch.Tensor | None, what: str) -> int | None:
    if t is None:
        return None
    if tr.traced(t):
        raise Refused(f"a {what} computed from the input")
    return tr.tensor(t)


# --- node builders (also for the opaque leaves of graph.py) ----------------------------------

def conv_node(tr: Tracer, x, weight, bias, stride, padding, dilation, groups, out) -> int:
    """A 2-d convolution; ``padding``: ints, or ``same`` / ``valid`` as ``F.conv2d`` takes them."""
    if weight.dim() != 4 or out.dim() != 4:
        raise Refused(f"a {weight.dim() - 2}-d or unbatched convolution (the page runs 2-d ones)")
    d = _pair(dilation)
    if padding == "valid":
        pad = [0, 0, 0, 0]
    elif padding == "same":  # as PyTorch: the odd pixel of padding goes after
        th, tw = d[0] * (weight.shape[2] - 1), d[1] * (weight.shape[3] - 1)
        pad = [th // 2, tw // 2, th - th // 2, tw - tw // 2]
    else:
        p = _pair(padding)
        pad = [p[0], p[1], p[0], p[1]]
    return tr.emit("conv2d", [tr.node(x)], out, weight=_const_param(tr, weight, "convolution weight"),
                   bias=_const_param(tr, bias, "convolution bias"), stride=_pair(stride), pad=pad,
                   dilation=d, groups=int(groups))


def pool_node(tr: Tracer, op: str, x, kernel, stride, padding, out, *, dilation: Any = 1,
              ceil_mode: bool = False, count_include_pad: bool = True, divisor: int | None = None) -> int:
    """A 2-d max or average pooling over the last two axes."""
    if out.dim() not in (3, 4):
        raise Refused(f"a pooling of a {out.dim()}-d tensor (the page pools 2-d maps)")
    k = _pair(kernel)
    attrs = {"kernel": k, "stride": _pair(stride) if stride not in (None, (), []) else k,
             "pad": _pair(padding), "ceil": bool(ceil_mode)}
    if op == "maxpool2d":
        attrs["dilation"] = _pair(dilation)
    else:
        attrs.update(count_include_pad=bool(count_include_pad), divisor=divisor)
    return tr.emit(op, [tr.node(x)], out, **attrs)


def affine_node(tr: Tracer, x, mean, var, weight, bias, eps: float, out) -> int:
    """Batch norm in eval mode, per channel (axis 1): x * alpha + beta, alpha and beta computed
    in float32 as PyTorch's CPU kernel computes them."""
    if mean is None or var is None:
        raise Refused("batch norm without running statistics (it normalizes by the batch)")
    with torch._C.DisableTorchFunction():
        m, v = mean.detach().float().numpy(), var.detach().float().numpy()
        w = np.ones_like(m) if weight is None else weight.detach().float().numpy()
        b = np.zeros_like(m) if bias is None else bias.detach().float().numpy()
    alpha = (np.float32(1) / np.sqrt(v + np.float32(eps))) * w
    beta = b - m * alpha
    return tr.emit("affine", [tr.node(x)], out, scale=tr.tensor(alpha), shift=tr.tensor(beta))


# --- handlers --------------------------------------------------------------------------------

def _conv2d(tr, args, kwargs, out):
    conv_node(tr, args[0], _a(args, kwargs, 1, "weight"), _a(args, kwargs, 2, "bias"),
              _a(args, kwargs, 3, "stride", 1), _a(args, kwargs, 4, "padding", 0),
              _a(args, kwargs, 5, "dilation", 1), _a(args, kwargs, 6, "groups", 1), out)


def _linear(tr, args, kwargs, out):
    w = _a(args, kwargs, 1, "weight")
    tr.emit("linear", [tr.node(args[0])], out, weight=_const_param(tr, w, "linear weight"),
            bias=_const_param(tr, _a(args, kwargs, 2, "bias"), "linear bias"))


def _matmul(tr, args, kwargs, out):
    x, w = args[0], _a(args, kwargs, 1, "other")
    if not tr.traced(x) or tr.traced(w) or w.dim() != 2:
        raise Refused("a matrix product other than input @ a constant matrix")
    with torch._C.DisableTorchFunction():
        wt = w.detach().float().t().contiguous().numpy()
    tr.emit("linear", [tr.node(x)], out, weight=tr.tensor(wt), bias=None)


def _batch_norm(tr, args, kwargs, out):
    if _a(args, kwargs, 5, "training", False):
        raise Refused("batch norm in training mode")
    affine_node(tr, args[0], _a(args, kwargs, 1, "running_mean"), _a(args, kwargs, 2, "running_var"),
                _a(args, kwargs, 3, "weight"), _a(args, kwargs, 4, "bias"), _a(args, kwargs, 7, "eps", 1e-5), out)


def _unary(fn: str, **fixed) -> Handler:
    def handler(tr, args, kwargs, out):
        attrs = dict(fixed)
        if fn == "gelu" and _a(args, kwargs, 1, "approximate", "none") == "tanh":
            return tr.emit("unary", [tr.node(args[0])], out, fn="gelu_tanh")
        if fn == "leaky_relu":
            attrs["alpha"] = float(_a(args, kwargs, 1, "negative_slope", 0.01))
        if fn == "elu":
            attrs["alpha"] = float(_a(args, kwargs, 1, "alpha", 1.0))
        if fn == "hardtanh" and not fixed:
            attrs.update(min=float(_a(args, kwargs, 1, "min_val", -1.0)), max=float(_a(args, kwargs, 2, "max_val", 1.0)))
        tr.emit("unary", [tr.node(args[0])], out, fn=fn, **attrs)
    return handler


def _binary(fn: str, swap: bool = False) -> Handler:
    def handler(tr, args, kwargs, out):
        a, b = args[0], _a(args, kwargs, 1, "other")
        if _a(args, kwargs, 2, "alpha", 1) != 1:
            raise Refused(f"{fn} with alpha")
        if kwargs.get("rounding_mode") is not None:
            raise Refused("a division with rounding")
        a, b = (b, a) if swap else (a, b)
        tr.emit("binary", [tr.node(a), tr.node(b)], out, fn=fn)
    return handler


def _max_or_min(fn: str) -> Handler:
    """``torch.max(a, b)`` elementwise, or ``x.max()`` over everything (``max(dim)`` gives
    indices too: refused before any handler, its result is no tensor)."""
    def handler(tr, args, kwargs, out):
        other = _a(args, kwargs, 1, "other")
        if isinstance(other, torch.Tensor):
            return tr.emit("binary", [tr.node(args[0]), tr.node(other)], out, fn=fn)
        tr.emit("reduce", [tr.node(args[0])], out, fn=fn, axes=_axes(None, args[0].dim()), keepdim=False)
    return handler


def _reduce(fn: str) -> Handler:
    def handler(tr, args, kwargs, out):
        x = args[0]
        dims = _a(args, kwargs, 1, "dim", () if fn in ("max", "min") else None)
        keep = bool(_a(args, kwargs, 2, "keepdim", False))
        tr.emit("reduce", [tr.node(x)], out, fn=fn, axes=_axes(dims, x.dim()), keepdim=keep)
    return handler


def _softmax(log: bool) -> Handler:
    def handler(tr, args, kwargs, out):
        dim = _a(args, kwargs, 1, "dim")
        if dim is None:
            raise Refused("a softmax without dim")
        tr.emit("softmax", [tr.node(args[0])], out, axis=dim % args[0].dim(), log=log)
    return handler


def _max_pool(tr, args, kwargs, out):
    pool_node(tr, "maxpool2d", args[0], _a(args, kwargs, 1, "kernel_size"), _a(args, kwargs, 2, "stride"),
              _a(args, kwargs, 3, "padding", 0), out, dilation=_a(args, kwargs, 4, "dilation", 1),
              ceil_mode=_a(args, kwargs, 5, "ceil_mode", False))


def _avg_pool(tr, args, kwargs, out):
    pool_node(tr, "avgpool2d", args[0], _a(args, kwargs, 1, "kernel_size"), _a(args, kwargs, 2, "stride"),
              _a(args, kwargs, 3, "padding", 0), out, ceil_mode=_a(args, kwargs, 4, "ceil_mode", False),
              count_include_pad=_a(args, kwargs, 5, "count_include_pad", True),
              divisor=_a(args, kwargs, 6, "divisor_override"))


def _adaptive(fn: str) -> Handler:
    def handler(tr, args, kwargs, out):
        if out.dim() not in (3, 4):
            raise Refused(f"an adaptive pooling of a {out.dim()}-d tensor")
        tr.emit("adaptivepool2d", [tr.node(args[0])], out, fn=fn)
    return handler


def _pad(tr, args, kwargs, out):
    x, pad = args[0], list(_a(args, kwargs, 1, "pad"))
    if _a(args, kwargs, 2, "mode", "constant") != "constant":
        raise Refused(f"{_a(args, kwargs, 2, 'mode')} padding (the page pads with a constant)")
    value = _a(args, kwargs, 3, "value")
    pads = [[0, 0] for _ in range(x.dim())]
    for i in range(len(pad) // 2):
        pads[x.dim() - 1 - i] = [int(pad[2 * i]), int(pad[2 * i + 1])]
    tr.emit("pad", [tr.node(x)], out, pads=pads, value=float(value or 0.0))


def _reshape(tr, args, kwargs, out):
    if out.numel() != args[0].numel():
        raise Refused("a reshape that changes the number of values")
    tr.emit("reshape", [tr.node(args[0])], out)


def _permute(tr, args, kwargs, out):
    x = args[0]
    dims = args[1:] if len(args) > 1 and isinstance(args[1], int) else _a(args, kwargs, 1, "dims")
    tr.emit("permute", [tr.node(x)], out, perm=[d % x.dim() for d in dims])


def _transpose(tr, args, kwargs, out):
    x = args[0]
    if x.dim() < 2:
        return tr.alias(out, tr.node(x))
    d0, d1 = (_a(args, kwargs, 1, "dim0", 0), _a(args, kwargs, 2, "dim1", 1))
    perm = list(range(x.dim()))
    perm[d0 % x.dim()], perm[d1 % x.dim()] = perm[d1 % x.dim()], perm[d0 % x.dim()]
    tr.emit("permute", [tr.node(x)], out, perm=perm)


def _identity(tr, args, kwargs, out):
    if out.shape != args[0].shape:
        raise Refused("a copy that changes the shape")
    tr.alias(out, tr.node(args[0]))


def _dropout(tr, args, kwargs, out):
    if _a(args, kwargs, 2, "training", True):
        raise Refused("dropout in training mode")
    tr.alias(out, tr.node(args[0]))


def _constant(tr, args, kwargs, out):
    """``zeros_like(x)`` and the like: the same values whatever the input, a constant."""
    tr.alias(out, tr.node(out.detach()))


def _cat(tr, args, kwargs, out):
    tensors = list(_a(args, kwargs, 0, "tensors"))
    axis = _a(args, kwargs, 1, "dim", 0) % out.dim()
    tr.emit("concat", [tr.node(t) for t in tensors], out, axis=axis)


def _stack(tr, args, kwargs, out):
    tensors = list(_a(args, kwargs, 0, "tensors"))
    axis = _a(args, kwargs, 1, "dim", 0) % out.dim()
    parts = []
    for t in tensors:  # each gets its new axis of 1, then they are concatenated along it
        shape = list(t.shape)
        parts.append(tr.add("reshape", [tr.node(t)], shape[:axis] + [1] + shape[axis:]))
    tr.emit("concat", parts, out, axis=axis)


def _pixel_unshuffle(tr, args, kwargs, out):
    """(N, C, H, W) -> (N, C*r*r, H/r, W/r): a reshape, a permutation and a reshape."""
    x, r = args[0], int(_a(args, kwargs, 1, "downscale_factor"))
    *lead, c, h, w = x.shape
    a = tr.add("reshape", [tr.node(x)], [*lead, c, h // r, r, w // r, r])
    n = len(lead)
    b = tr.add("permute", [a], [*lead, c, r, r, h // r, w // r],
               perm=[*range(n), n, n + 2, n + 4, n + 1, n + 3])
    tr.emit("reshape", [b], out)


def _pixel_shuffle(tr, args, kwargs, out):
    """(N, C*r*r, H, W) -> (N, C, H*r, W*r)."""
    x, r = args[0], int(_a(args, kwargs, 1, "upscale_factor"))
    *lead, c, h, w = x.shape
    a = tr.add("reshape", [tr.node(x)], [*lead, c // (r * r), r, r, h, w])
    n = len(lead)
    b = tr.add("permute", [a], [*lead, c // (r * r), h, r, w, r],
               perm=[*range(n), n, n + 3, n + 1, n + 4, n + 2])
    tr.emit("reshape", [b], out)


def _names(names: Sequence[str], handler: Handler) -> dict[str, Handler]:
    return {n: handler for n in names}


HANDLERS: dict[str, Handler] = {
    "conv2d": _conv2d, "linear": _linear, "matmul": _matmul, "__matmul__": _matmul,
    "batch_norm": _batch_norm,
    **{n: _unary(n.rstrip("_")) for n in ("relu", "relu_", "tanh", "tanh_", "sigmoid", "sigmoid_",
                                          "gelu", "silu", "leaky_relu", "leaky_relu_", "elu", "elu_",
                                          "hardtanh", "hardtanh_", "exp", "exp_", "log", "log_",
                                          "neg", "neg_", "abs", "abs_", "sqrt", "sqrt_")},
    "__neg__": _unary("neg"), "relu6": _unary("hardtanh", min=0.0, max=6.0),
    **_names(("add", "__add__", "__radd__", "__iadd__", "add_"), _binary("add")),
    **_names(("sub", "__sub__", "__isub__", "sub_", "subtract"), _binary("sub")),
    **_names(("rsub", "__rsub__"), _binary("sub", swap=True)),
    **_names(("mul", "__mul__", "__rmul__", "__imul__", "mul_", "multiply"), _binary("mul")),
    **_names(("div", "__truediv__", "__itruediv__", "div_", "true_divide", "divide", "__div__"), _binary("div")),
    **_names(("__rtruediv__", "__rdiv__"), _binary("div", swap=True)),
    "maximum": _binary("max"), "minimum": _binary("min"), "max": _max_or_min("max"), "min": _max_or_min("min"),
    "amax": _reduce("max"), "amin": _reduce("min"), "mean": _reduce("mean"), "sum": _reduce("sum"),
    "softmax": _softmax(False), "log_softmax": _softmax(True),
    "max_pool2d": _max_pool, "avg_pool2d": _avg_pool,
    "adaptive_avg_pool2d": _adaptive("avg"), "adaptive_max_pool2d": _adaptive("max"),
    "pad": _pad,
    **_names(("view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "view_as", "reshape_as",
              "squeeze_", "unsqueeze_", "ravel"), _reshape),
    "permute": _permute, **_names(("transpose", "swapaxes", "swapdims", "t"), _transpose),
    **_names(("contiguous", "clone", "detach", "detach_", "float", "to", "type_as", "cpu", "requires_grad_",
              "alias", "double", "half", "bfloat16", "type"), _identity),  # (another dtype: refused by name)
    **_names(("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"), _dropout),
    **_names(("cat", "concat", "concatenate"), _cat), "stack": _stack,
    **_names(("zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full", "new_tensor"), _constant),
    "pixel_unshuffle": _pixel_unshuffle, "pixel_shuffle": _pixel_shuffle,
}
