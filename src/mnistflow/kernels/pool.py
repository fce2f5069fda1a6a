"""2x2 stride-2 max-pooling on the native kernel (``csrc/maxpool.c``), with autograd;
``reference`` is the PyTorch op it matches bit for bit.

Measured on the 2-core development CPU (bf16, batch 256, channels-last, 2 threads), the fast
net's 14x14x32 pool took 0.36 + 0.26 ms forward + backward against PyTorch's ~0.4 + 0.7-1.1 ms
(its backward zero-fills the input gradient, then scatters int64 indices into it).
"""
from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from mnistflow.kernels import backward_from, check_rc, library, mark_used, threads

_FORWARD = {torch.bfloat16: "maxpool2x2_forward_bf16", torch.float32: "maxpool2x2_forward_f32"}
_BACKWARD = {2: "maxpool2x2_backward_u16", 4: "maxpool2x2_backward_u32"}  # by element size


def nhwc(x: torch.Tensor) -> bool:
    """Dense channels-last memory: (N, H, W, C) with C fastest (strides of size-1 axes do not
    matter)."""
    n, c, h, w = x.shape
    want = (h * w * c, 1, w * c, c)
    return all(size == 1 or st == wst for size, st, wst in zip(x.shape, x.stride(), want))


def supports(x: torch.Tensor, ceil_mode: bool) -> bool:
    """Whether ``x`` can take the kernel: a 4-D channels-last bf16/fp32 CPU tensor, outside
    tracing and compiling (exports and ``torch.compile`` see PyTorch's op), and ceil semantics
    or even sizes."""
    return (x.device.type == "cpu" and x.dim() == 4 and x.dtype in _FORWARD
            and (ceil_mode or (x.shape[2] % 2 == 0 and x.shape[3] % 2 == 0))
            and not torch.jit.is_tracing() and not torch.jit.is_scripting()
            and not torch.compiler.is_compiling() and x.numel() > 0 and nhwc(x)
            and library() is not None)


def _forward(lib, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n, c, h, w = x.shape
    oh, ow = (h + 1) // 2, (w + 1) // 2
    y = torch.empty((n, c, oh, ow), dtype=x.dtype, memory_format=torch.channels_last)
    code = torch.empty((n, oh, ow, c), dtype=torch.uint8)  # which of the 4 inputs won
    check_rc(getattr(lib, _FORWARD[x.dtype])(x.data_ptr(), y.data_ptr(), code.data_ptr(), n, h, w, c, threads()),
             "max-pool")
    return y, code


def _backward(lib, g: torch.Tensor, code: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    n, c, h, w = shape
    if not nhwc(g):
        g = g.contiguous(memory_format=torch.channels_last)
    gx = torch.empty((n, c, h, w), dtype=g.dtype, memory_format=torch.channels_last)
    getattr(lib, _BACKWARD[g.element_size()])(g.data_ptr(), code.data_ptr(), gx.data_ptr(), n, h, w, c,
                                              threads())
    return gx


class _MaxPool2x2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y, code = _forward(library(), x)
        ctx.save_for_backward(code)
        ctx.shape = x.shape
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:
        (code,) = ctx.saved_tensors
        return _backward(library(), g, code, ctx.shape)


def reference(x: torch.Tensor) -> torch.Tensor:
    """The PyTorch op the kernel replaces (values and gradient, bit for bit)."""
    return F.max_pool2d(x, 2, ceil_mode=True)


def max_pool2x2(x: torch.Tensor) -> torch.Tensor:
    """``reference(x)`` on the kernel; the caller checks ``supports``."""
    mark_used("maxpool2x2")
    return _MaxPool2x2.apply(x)


def self_check(lib: ctypes.CDLL) -> None:
    """Compare the kernel with PyTorch on a small input with ties, odd sizes and a channel
    count off the 16-wide blocks; raise on any difference (a miscompiled library)."""
    gen = torch.Generator().manual_seed(0)
    for dtype in _FORWARD:
        x = torch.randint(-3, 4, (3, 37, 5, 7), generator=gen).to(dtype)  # small ints: many ties
        x = x.contiguous(memory_format=torch.channels_last)
        ref = x.clone().requires_grad_()
        want = reference(ref)
        g = torch.randn(want.shape, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
        backward_from(want, g)
        y, code = _forward(lib, x)
        gx = _backward(lib, g, code, x.shape)
        if not (torch.equal(y, want.detach()) and torch.equal(gx, ref.grad)):
            raise RuntimeError(f"the max-pool kernel disagrees with PyTorch ({dtype}): miscompiled?")
