"""A VALID convolution on a small map as one matrix product over its patches.

On the fast net's last map (4x4 -> 2x2 outputs, 48 -> 192 channels, batch 384) oneDNN's
direct convolution ran at a fraction of its matrix-product speed (the 4x4 SAME convolution
it replaced: 190 GMAC/s forward, against ~400 for a bf16 matrix product of the same size).
Here the patches are gathered by one strided copy into a (N*OH*OW, K*K*C) matrix, and the
forward, the weight gradient and the input gradient are each one matrix product.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from mnistflow.kernels.layout import col2im


def windows(x: torch.Tensor, kernel: tuple[int, int], dilation: tuple[int, int] = (1, 1),
            stride: tuple[int, int] = (1, 1)) -> torch.Tensor:
    """The VALID windows of ``x`` (N, C, H, W, any memory format) as a strided view, no copy:
    (N, C, KH, KW, OH, OW), element [n, c, i, j, y, x] = x[n, c, y*sh + i*dh, x*sw + j*dw]."""
    n, c, h, w = x.shape
    (kh, kw), (dh, dw), (sh, sw) = kernel, dilation, stride
    oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
    s0, s1, s2, s3 = x.stride()
    return x.as_strided((n, c, kh, kw, oh, ow), (s0, s1, dh * s2, dw * s3, sh * s2, sw * s3),
                        x.storage_offset())


def patches(x: torch.Tensor, k: int) -> torch.Tensor:
    """(N, C, H, W) -> (N*OH*OW, K*K*C): each VALID window's pixels in (row, column, channel)
    order, by one copy of the windows' view (a channels-last input reads contiguous channels)."""
    v = windows(x, (k, k)).permute(0, 4, 5, 2, 3, 1)  # (N, OH, OW, K, K, C)
    return v.reshape(-1, k * k * x.shape[1])


def _matrix(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(O, C, K, K) -> (K*K*C, O), rows in the patches' order."""
    o, c, k, _ = weight.shape
    return weight.to(dtype).permute(2, 3, 1, 0).reshape(k * k * c, o)


class _PatchConv(torch.autograd.Function):
    """``conv2d(x, w)`` (VALID, stride 1) in the dtype of ``x``; the weight gradient in fp32."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        o, _, k, _ = weight.shape
        cols = patches(x, k)
        wm = _matrix(weight, x.dtype)
        ctx.save_for_backward(cols, wm)
        ctx.shape = (n, c, h, w, k)
        y = cols @ wm  # (N*OH*OW, O): channels-last rows
        return y.view(n, h - k + 1, w - k + 1, o).permute(0, 3, 1, 2)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        cols, wm = ctx.saved_tensors
        n, c, h, w, k = ctx.shape
        oh, ow = h - k + 1, w - k + 1
        g = g.to(cols.dtype).permute(0, 2, 3, 1).reshape(n * oh * ow, -1)
        gw = None
        if ctx.needs_input_grad[1]:
            gw = (g.t() @ cols).float().view(-1, k, k, c).permute(0, 3, 1, 2)  # (O, K, K, C) memory
        gx = None
        if ctx.needs_input_grad[0]:
            gc = (g @ wm.t()).view(n, oh, ow, k, k, c)  # each window's share of the input gradient
            gx = col2im(gc, h, w, k)
        return gx, gw


class PatchConv2d(nn.Conv2d):
    """A VALID, stride-1, bias-free ``nn.Conv2d`` that runs as one matrix product over its
    patches on CPUs (``_PatchConv``); elsewhere, and in exports, ``nn.Conv2d``'s own. Under
    autocast the product is in the autocast dtype and the weight gradient stays fp32."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int):
        super().__init__(in_ch, out_ch, kernel, padding=0, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.device.type != "cpu" or torch.jit.is_tracing() or torch.compiler.is_compiling()
                or x.shape[-1] < self.kernel_size[1] or x.shape[-2] < self.kernel_size[0]):
            return super().forward(x)
        if torch.is_autocast_enabled("cpu"):
            x = x.to(torch.get_autocast_dtype("cpu"))  # as autocast would for the convolution
        elif x.dtype != self.weight.dtype:
            return super().forward(x)  # let conv2d report the mismatch
        with torch.autocast("cpu", enabled=False):
            return _PatchConv.apply(x, self.weight)
