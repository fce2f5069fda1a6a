"""Layout ops on the native kernel (``csrc/layout.c``): swapping the batch and channel axes of
channels-last tensors, and col2im (the input gradient of a convolution computed as a matrix
product); ``swap_reference`` and ``col2im_reference`` are their PyTorch twins."""
from __future__ import annotations

import ctypes

import torch

from mnistflow.kernels import check_rc, library, mark_used, threads
from mnistflow.kernels.pool import nhwc

_SWAP = {2: "swap_nc_u16", 4: "swap_nc_u32"}  # by element size
_COL2IM = {torch.bfloat16: "col2im_bf16", torch.float32: "col2im_f32"}


def swap_batch_channels(x: torch.Tensor) -> torch.Tensor:
    """``x.transpose(0, 1).contiguous(memory_format=torch.channels_last)`` for a 4-D CPU
    tensor: (N, C, H, W) -> (C, N, H, W), channels-last. On the kernel for channels-last
    2- and 4-byte tensors (about half the time of PyTorch's copy at the fast net's sizes)."""
    lib = None
    if (x.device.type == "cpu" and x.dim() == 4 and x.element_size() in _SWAP and x.numel() > 0
            and nhwc(x) and not torch.compiler.is_compiling()):
        lib = library()
    if lib is None:
        return swap_reference(x)
    mark_used("swap_nc")
    n, c, h, w = x.shape
    out = torch.empty((c, n, h, w), dtype=x.dtype, memory_format=torch.channels_last)
    getattr(lib, _SWAP[x.element_size()])(x.data_ptr(), out.data_ptr(), n, h * w, c, threads())
    return out


def col2im(gc: torch.Tensor, h: int, w: int, k: int) -> torch.Tensor:
    """The input gradient of a VALID k x k convolution from each window's share of it:
    ``gc`` (N, OH, OW, k, k, C) contiguous -> (N, C, H, W) channels-last, each pixel the sum of
    its windows' shares. On the kernel for bf16 and fp32 CPU tensors."""
    n, oh, ow, _, _, c = gc.shape
    lib = library() if (gc.device.type == "cpu" and gc.dtype in _COL2IM and gc.is_contiguous()
                        and not torch.compiler.is_compiling()) else None
    if lib is not None:
        mark_used("col2im")
        gx = torch.empty((n, h, w, c), dtype=gc.dtype)
        check_rc(getattr(lib, _COL2IM[gc.dtype])(gc.data_ptr(), gx.data_ptr(), n, h, w, c, k, threads()), "col2im")
        return gx.permute(0, 3, 1, 2)
    return col2im_reference(gc, h, w, k)


def swap_reference(x: torch.Tensor) -> torch.Tensor:
    """``swap_batch_channels`` in PyTorch (any device, layout and dtype)."""
    return x.transpose(0, 1).contiguous(memory_format=torch.channels_last)


def col2im_reference(gc: torch.Tensor, h: int, w: int, k: int) -> torch.Tensor:
    """``col2im`` in PyTorch (any device and dtype): strided adds into a zeroed gradient."""
    n, oh, ow, _, _, c = gc.shape
    gx = torch.zeros((n, h, w, c), dtype=gc.dtype, device=gc.device)
    if oh * ow <= k * k:  # one strided add per window, or per tap: the fewer
        for i in range(oh):
            for j in range(ow):
                gx[:, i:i + k, j:j + k] += gc[:, i, j]
    else:
        for i in range(k):
            for j in range(k):
                gx[:, i:i + oh, j:j + ow] += gc[:, :, :, i, j]
    return gx.permute(0, 3, 1, 2)


def self_check(lib: ctypes.CDLL) -> None:
    """Compare with the references on small inputs (odd sizes, a 1x1 window); raise on a
    difference (a miscompiled library)."""
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(19, 21, 3, 2).to(dtype).contiguous(memory_format=torch.channels_last)
        n, c, h, w = x.shape
        out = torch.empty((c, n, h, w), dtype=dtype, memory_format=torch.channels_last)
        getattr(lib, _SWAP[x.element_size()])(x.data_ptr(), out.data_ptr(), n, h * w, c, 1)
        if not torch.equal(out, swap_reference(x)):
            raise RuntimeError(f"the layout kernel disagrees with PyTorch ({dtype}): miscompiled?")
        for (h, w, k) in ((4, 4, 3), (5, 7, 3), (3, 3, 1)):
            gc = torch.randn(3, h - k + 1, w - k + 1, k, k, 5).to(dtype)
            gx = torch.empty((3, h, w, 5), dtype=dtype)
            check_rc(getattr(lib, _COL2IM[dtype])(gc.data_ptr(), gx.data_ptr(), 3, h, w, 5, k, 1), "col2im")
            ref = col2im_reference(gc.float(), h, w, k).permute(0, 2, 3, 1).to(dtype)
            if not torch.allclose(gx.float(), ref.float(), rtol=1e-2, atol=1e-2):
                raise RuntimeError(f"the col2im kernel disagrees with PyTorch ({dtype}): miscompiled?")
