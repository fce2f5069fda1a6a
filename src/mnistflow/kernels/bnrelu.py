"""Batch norm + ReLU on the native kernel (``csrc/bnrelu.c``): training mode with autograd, and
inference from the running statistics.

Replaces four PyTorch kernels (batch norm, ReLU and their backwards, two passes each) by two
passes each way. Same results as ``F.relu(F.batch_norm(..., training=True))`` up to the
order of float sums (statistics accumulate in double); running statistics are updated the
same way (unbiased variance, ``momentum``). ``reference`` is that PyTorch op.
"""
from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from mnistflow.kernels import backward_from, check_rc, library, mark_used, threads
from mnistflow.kernels.pool import nhwc

_FORWARD = {torch.bfloat16: "bnrelu_forward_bf16", torch.float32: "bnrelu_forward_f32"}
_BACKWARD = {torch.bfloat16: "bnrelu_backward_bf16", torch.float32: "bnrelu_backward_f32"}
_EVAL = {torch.bfloat16: "bnrelu_eval_bf16", torch.float32: "bnrelu_eval_f32"}


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _fp32_vector(t: torch.Tensor | None, c: int) -> bool:
    return t is None or (t.dtype == torch.float32 and t.is_contiguous() and t.numel() == c
                         and t.device.type == "cpu")


def supports(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
             running_mean: torch.Tensor | None, running_var: torch.Tensor | None) -> bool:
    """A 4-D channels-last bf16/fp32 CPU input with fp32 parameters and statistics, outside
    tracing and compiling (exports and ``torch.compile`` see PyTorch's ops)."""
    if not (x.device.type == "cpu" and x.dim() == 4 and x.dtype in _FORWARD and x.numel() > 0
            and x.shape[0] * x.shape[2] * x.shape[3] > 1 and nhwc(x)):
        return False
    c = x.shape[1]
    if not all(_fp32_vector(t, c) for t in (weight, bias, running_mean, running_var)):
        return False
    if (running_mean is None) != (running_var is None):
        return False
    return (not torch.jit.is_tracing() and not torch.jit.is_scripting()
            and not torch.compiler.is_compiling() and library() is not None)


def _forward(lib, x, weight, bias, running_mean, running_var, momentum: float, eps: float):
    n, c, h, w = x.shape
    y = torch.empty_like(x, memory_format=torch.channels_last)
    mean = torch.empty(c, dtype=torch.float32)
    invstd = torch.empty(c, dtype=torch.float32)
    rc = getattr(lib, _FORWARD[x.dtype])(x.data_ptr(), y.data_ptr(), _ptr(weight), _ptr(bias),
                                         _ptr(running_mean), _ptr(running_var), mean.data_ptr(),
                                         invstd.data_ptr(), n * h * w, c, momentum, eps, threads())
    check_rc(rc, "batch-norm")
    return y, mean, invstd


def _backward(lib, g, y, x, weight, mean, invstd, needs_weight: bool, needs_bias: bool):
    n, c, h, w = x.shape
    if not nhwc(g) or g.dtype != x.dtype:
        g = g.to(x.dtype).contiguous(memory_format=torch.channels_last)
    gx = torch.empty_like(x, memory_format=torch.channels_last)
    gw = torch.empty(c, dtype=torch.float32) if needs_weight else None
    gb = torch.empty(c, dtype=torch.float32) if needs_bias else None
    rc = getattr(lib, _BACKWARD[x.dtype])(g.data_ptr(), y.data_ptr(), x.data_ptr(), _ptr(weight),
                                          mean.data_ptr(), invstd.data_ptr(), gx.data_ptr(),
                                          _ptr(gw), _ptr(gb), n * h * w, c, threads())
    check_rc(rc, "batch-norm")
    return gx, gw, gb


class _BatchNormReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
        y, mean, invstd = _forward(library(), x, weight, bias, running_mean, running_var, momentum, eps)
        ctx.save_for_backward(x, y, weight, mean, invstd)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        x, y, weight, mean, invstd = ctx.saved_tensors
        gx, gw, gb = _backward(library(), g, y, x, weight, mean, invstd,
                               ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        return gx, gw, gb, None, None, None, None


def reference(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
              running_mean: torch.Tensor | None, running_var: torch.Tensor | None, training: bool,
              momentum: float, eps: float) -> torch.Tensor:
    """The PyTorch ops the kernels replace: ``relu(batch_norm(...))``."""
    return F.relu(F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps))


def batch_norm_relu(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                    running_mean: torch.Tensor | None, running_var: torch.Tensor | None, momentum: float,
                    eps: float) -> torch.Tensor:
    """``reference(..., training=True)`` on the kernel; the caller checks ``supports``.
    ``running_mean`` / ``running_var`` (or None) are updated in place."""
    mark_used("bnrelu")
    return _BatchNormReLU.apply(x, weight, bias, running_mean, running_var, momentum, eps)


def batch_norm_relu_eval(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                         running_mean: torch.Tensor, running_var: torch.Tensor, eps: float) -> torch.Tensor:
    """``relu(batch_norm(x, running_mean, running_var, weight, bias, training=False))`` in one
    pass on the kernel (PyTorch's two took 15 of the fast net's 61 ms test pass); no autograd.
    The caller checks ``supports`` (with running statistics)."""
    mark_used("bnrelu_eval")
    scale = torch.rsqrt(running_var + eps)
    if weight is not None:
        scale = scale * weight
    shift = -running_mean * scale
    if bias is not None:
        shift = shift + bias
    n, c, h, w = x.shape
    y = torch.empty_like(x, memory_format=torch.channels_last)
    getattr(library(), _EVAL[x.dtype])(x.data_ptr(), y.data_ptr(), scale.data_ptr(), shift.data_ptr(),
                                       n * h * w, c, threads())
    return y


def self_check(lib: ctypes.CDLL) -> None:
    """Compare with PyTorch (values, gradients, running statistics) on a small input."""
    gen = torch.Generator().manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
        x = (torch.randn(4, 37, 3, 5, generator=gen) * 2 + 0.5).to(dtype)
        x = x.contiguous(memory_format=torch.channels_last)
        w = torch.rand(37, generator=gen) + 0.5
        b = torch.randn(37, generator=gen) * 0.1
        rm, rv = torch.zeros(37), torch.ones(37)
        rm2, rv2 = rm.clone(), rv.clone()
        g = torch.randn(x.shape, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
        xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
        want = reference(xr, wr, br, rm2, rv2, True, 0.1, 1e-5)
        backward_from(want, g)
        y, mean, invstd = _forward(lib, x, w, b, rm, rv, 0.1, 1e-5)
        gx, gw, gb = _backward(lib, g, y, x, w, mean, invstd, True, True)
        pairs = [(y, want), (gx, xr.grad), (gw, wr.grad), (gb, br.grad), (rm, rm2), (rv, rv2)]
        for got, ref in pairs:
            ref = ref.detach().float()
            if not torch.allclose(got.float(), ref, rtol=tol, atol=tol * max(1.0, ref.abs().max().item())):
                raise RuntimeError(f"the batch-norm kernel disagrees with PyTorch ({dtype}): miscompiled?")
        rv.add_(0.5)  # inference: from the running statistics
        scale, shift = torch.rsqrt(rv + 1e-5) * w, b - rm * torch.rsqrt(rv + 1e-5) * w
        y = torch.empty_like(x)
        getattr(lib, _EVAL[dtype])(x.data_ptr(), y.data_ptr(), scale.data_ptr(), shift.data_ptr(),
                                   x.numel() // 37, 37, 1)
        want = reference(x.float(), w, b, rm, rv, False, 0.1, 1e-5)
        if not torch.allclose(y.float(), want, rtol=tol, atol=tol * max(1.0, want.abs().max().item())):
            raise RuntimeError(f"the batch-norm inference kernel disagrees with PyTorch ({dtype}): miscompiled?")
