"""The weight gradient of 3x3 convolutions on the AMX matrix engine, or AVX-512-BF16 (``csrc/wgrad.c``).

oneDNN's bf16 backward-weights kernel ran the fast net's convolutions (4-96 channels, 14x14
to 4x4 maps, batch 384) at 2-4x the time of their forward convolutions: its reduction runs
over all N*H*W pixels with only O x 9C outputs. ``wgrad.c`` splits the pixels across the
threads, packs them in L2-sized chunks and accumulates on AMX tiles (BENCHMARKS.md).
``weight_grad_reference`` is the PyTorch op it matches.

Needs a CPU with AMX (``amx_bf16``) and a Linux kernel that grants its register state
(``kernels.amx_available``), or AVX-512-BF16 without AMX (Zen 4 and 5: the same packing, the
products on vdpbf16ps; ``kernels.bf16_engine``); anything else (another CPU, another shape)
takes PyTorch's gradient. The first layer's fused conv + max-pool forward is AMX's alone.
"""
from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from mnistflow.kernels import amx_available, bf16_engine, check_rc, library, mark_used, pool, threads
from mnistflow.kernels.pool import nhwc


def supports(x: torch.Tensor, out_channels: int) -> bool:
    """Whether a 3x3 stride-1 padding-1 convolution of ``x`` with ``out_channels`` filters can
    take the kernel's weight gradient: bf16 channels-last CPU input, out channels a multiple of
    16, in channels a multiple of 16 or at most 5, outside tracing and compiling."""
    c = x.shape[1] if x.dim() == 4 else 0
    return (x.device.type == "cpu" and x.dim() == 4 and x.dtype == torch.bfloat16 and x.numel() > 0
            and out_channels % 16 == 0 and (c % 16 == 0 or 3 * c <= 16) and nhwc(x)
            and not torch.jit.is_tracing() and not torch.compiler.is_compiling() and bf16_engine() is not None)


def weight_grad_reference(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The weight gradient (O, C, 3, 3) of ``conv2d(x, w, padding=1)`` for the output gradient
    ``g``, by PyTorch (oneDNN on CPUs), in the dtype of ``x``."""
    w = torch.zeros(g.shape[1], x.shape[1], 3, 3, dtype=x.dtype)
    return torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                               [False, True, False])[1]


def _weight_grad(lib, x: torch.Tensor, g: torch.Tensor, code: torch.Tensor | None = None,
                 tiles: bool | None = None) -> torch.Tensor:
    """dW (O, C, 3, 3) fp32 from x (N, C, H, W) and the output gradient g; with ``code``, g is
    the gradient of the 2x2 max-pool that follows (N, O, ceil(H/2), ceil(W/2)) and ``code``
    the pool kernel's winners (``pool._forward``). ``tiles``: AMX (True) or AVX-512-BF16
    (False); None: AMX where ``amx_available``."""
    if tiles is None:
        tiles = amx_available()
    n, c, h, w = x.shape
    o = g.shape[1]
    if g.dtype != x.dtype or not nhwc(g):
        g = g.to(x.dtype).contiguous(memory_format=torch.channels_last)
    dw = torch.empty((o, 3, 3, c), dtype=torch.float32)  # (O, kh, kw, C): channels-last weights
    if code is None:
        rc = lib.conv3x3_wgrad_bf16(x.data_ptr(), g.data_ptr(), dw.data_ptr(), n, h, w, c, o, threads(), int(tiles))
    else:
        rc = lib.conv3x3_maxpool_wgrad_bf16(x.data_ptr(), g.data_ptr(), code.data_ptr(), dw.data_ptr(),
                                            n, h, w, c, o, threads(), int(tiles))
    check_rc(rc, "weight-gradient", f"unsupported shape {tuple(x.shape)} -> {o}")
    return dw.permute(0, 3, 1, 2)


class _Conv3x3(torch.autograd.Function):
    """``conv2d(x, w.to(bf16), padding=1)``; the input gradient is oneDNN's, the weight
    gradient the kernel's, in fp32 straight into the fp32 parameter (no bf16 rounding)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        w = weight.to(torch.bfloat16)
        ctx.save_for_backward(x, w)
        return F.conv2d(x, w, padding=1)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor):
        x, w = ctx.saved_tensors
        g = g.to(x.dtype).contiguous(memory_format=torch.channels_last)
        gx = None
        if ctx.needs_input_grad[0]:
            gx = torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [1, 1], [1, 1], False,
                                                     [0, 0], 1, [True, False, False])[0]
        gw = _weight_grad(library(), x, g) if ctx.needs_input_grad[1] else None
        return gx, gw


def _conv_max_pool(lib, x: torch.Tensor, w: torch.Tensor, codes: bool = True):
    """max_pool2d(conv2d(x, w, padding=1), 2, ceil_mode=True) and the pool's winner codes (None
    without ``codes``), for bf16 x with 3C <= 16 (the fast net's space-to-depth input), on the
    fused AMX kernel."""
    n, c, h, wd = x.shape
    o = w.shape[0]
    oh, ow = (h + 1) // 2, (wd + 1) // 2
    y = torch.empty((n, o, oh, ow), dtype=torch.bfloat16, memory_format=torch.channels_last)
    code = torch.empty((n, oh, ow, o), dtype=torch.uint8) if codes else None
    w = w.contiguous()  # (O, C, 3, 3)
    rc = lib.conv3x3_maxpool_forward_bf16(x.data_ptr(), w.data_ptr(), y.data_ptr(),
                                          code.data_ptr() if codes else None, n, h, wd, c, o, threads())
    check_rc(rc, "conv + max-pool", f"unsupported shape {tuple(x.shape)} -> {o}")
    return y, code


class _Conv3x3MaxPool(torch.autograd.Function):
    """``max_pool2d(conv2d(x, w.to(bf16), padding=1), 2, ceil_mode=True)`` for an input that
    needs no gradient (a net's first layer). Neither the convolution's output nor its gradient
    (at the fast net's first stage 4.8 MB each per step) is written and read back: the forward
    pools on the fly (for 3C <= 16, on AMX), the backward takes the weight gradient straight
    from the pool's gradient and winner codes (AMX or AVX-512-BF16)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if 3 * x.shape[1] <= 16 and amx_available():  # few input channels: the fused kernel
            pooled, code = _conv_max_pool(library(), x, weight.to(torch.bfloat16))
        else:
            y = F.conv2d(x, weight.to(torch.bfloat16), padding=1)
            if not nhwc(y):  # one input channel: PyTorch may pick NCHW for the output
                y = y.contiguous(memory_format=torch.channels_last)
            pooled, code = pool._forward(library(), y)
        ctx.save_for_backward(x, code)
        return pooled

    @staticmethod
    @once_differentiable
    def backward(ctx, gp: torch.Tensor):
        x, code = ctx.saved_tensors
        return None, _weight_grad(library(), x, gp, code)


def conv3x3_maxpool(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``max_pool2d(conv3x3(x, weight), 2, ceil_mode=True)`` for an ``x`` that needs no
    gradient; the caller checks ``supports``. Without a gradient to compute (evaluation), for
    3C <= 16, the fused forward alone: at the fast net's first layer the evaluation of 10,000
    images no longer writes and reads back a 125 MB convolution output (AMX only)."""
    if x.requires_grad:
        raise ValueError("conv3x3_maxpool: the input must not need a gradient")
    mark_used("conv3x3_maxpool")
    if not (torch.is_grad_enabled() and weight.requires_grad) and 3 * x.shape[1] <= 16 and amx_available():
        return _conv_max_pool(library(), x, weight.to(torch.bfloat16), codes=False)[0]
    return _Conv3x3MaxPool.apply(x, weight)


def conv3x3(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.conv2d(x, weight, padding=1)`` in bf16 (``x`` bf16, ``weight`` any float dtype),
    with the kernel's weight gradient; the caller checks ``supports``."""
    mark_used("conv3x3_wgrad")
    return _Conv3x3.apply(x, weight)


def self_check(lib: ctypes.CDLL, tiles: bool = True) -> None:
    """Compare with PyTorch on small inputs (both packing paths, a partial last chunk, border
    pixels, odd sizes for the pool), on AMX (``tiles``) or AVX-512-BF16; raise on a difference
    beyond float-sum order and bf16 rounding."""
    gen = torch.Generator().manual_seed(0)
    for n, c, o, h, w in ((3, 16, 32, 5, 7), (2, 4, 16, 6, 3), (1, 1, 16, 2, 2)):
        x = torch.randn(n, c, h, w, generator=gen).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
        g = torch.randn(n, o, h, w, generator=gen).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
        got = _weight_grad(lib, x, g, tiles=tiles)
        want = weight_grad_reference(x.float(), g.float())
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item()):
            raise RuntimeError("the weight-gradient kernel disagrees with PyTorch: miscompiled?")
    # the first layer's node: the forward (fused on AMX), and the weight gradient from the pool's
    x = torch.randn(2, 4, 5, 7, generator=gen).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    w = torch.randn(16, 4, 3, 3, generator=gen).to(torch.bfloat16)
    xr, wr = x.float(), w.float().requires_grad_()
    want = F.max_pool2d(F.conv2d(xr, wr, padding=1).to(torch.bfloat16).float(), 2, ceil_mode=True)  # pools bf16
    if tiles:
        got, code = _conv_max_pool(lib, x, w)
    else:
        got, code = pool._forward(lib, F.conv2d(x, w, padding=1).contiguous(memory_format=torch.channels_last))
    gp = torch.randn(want.shape, generator=gen).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    want.backward(gp.float())
    dw = _weight_grad(lib, x, gp, code, tiles=tiles)
    scale = wr.grad.abs().max().item()
    if not (torch.allclose(got.float(), want.detach(), rtol=1e-2, atol=1e-2)
            and torch.allclose(dw, wr.grad, rtol=1e-4, atol=1e-4 * scale)):
        raise RuntimeError("the conv + max-pool kernel disagrees with PyTorch: miscompiled?")
