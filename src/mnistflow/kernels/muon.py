"""Muon's Newton-Schulz orthogonalization: the PyTorch iteration (``orthogonalize``, the
reference and the path everywhere the kernel is not), and the kernel (``csrc/muon.c``) on AMX
tiles or, without AMX, on AVX-512-BF16 (``kernels.bf16_engine``).

PyTorch ran each Newton-Schulz step of each weight matrix as three small fp32 calls: for the
fast net's three matrices, 27 calls and ~0.7 ms of a ~10 ms training step on the AMX Xeon. The
kernel does a whole step's matrices in one call (bf16 products accumulated in fp32, the iterate
kept in fp32): ~0.2 ms there. Where it does not apply (neither engine, CUDA tensors, fp32
runs) ``orthogonalize`` runs instead.
"""
from __future__ import annotations

import ctypes

import torch

from mnistflow.kernels import bf16_engine, check_rc, library, mark_used, threads
from mnistflow.runtime.cpu import cpu_has_fast_bf16

_A, _B, _C = 3.4445, -4.7750, 2.0315  # the quintic's coefficients (Jordan et al., 2024)


def orthogonalize(g: torch.Tensor, steps: int = 3) -> torch.Tensor:
    """``g`` (rows, cols) with its singular values pushed towards 1: roughly ``U V^T`` of its SVD.

    Muon's quintic Newton-Schulz iteration (coefficients from Jordan et al., 2024): three steps
    leave the singular values in about [0.7, 1.2], which trains as well as the exact ``U V^T``.
    In fp32 below 65,536 entries (the matrices are tiny and the passes cost more than the
    math); in bf16 above, where the matrix engine is several times faster: on a GPU or a CPU
    with bf16 units (AMX, AVX-512-BF16). A CPU without them (AVX2 only) emulates bf16 products
    and stays in fp32: there bf16 made the 64/128/256 net's Muon step 15x slower (0.32 s).
    """
    big = g.numel() >= 1 << 16 and (g.device.type != "cpu" or cpu_has_fast_bf16())
    x = g.to(torch.bfloat16 if big else torch.float32)
    wide = x.size(0) <= x.size(1)
    if not wide:
        x = x.T
    x = x / (x.norm() + 1e-7)  # spectral norm <= Frobenius norm <= 1: inside the iteration's range
    for _ in range(steps):
        xx = x @ x.T  # (rows, rows): the small side
        x = torch.addmm(x, torch.addmm(xx, xx, xx, beta=_B, alpha=_C), x, beta=_A)
    return (x if wide else x.T).to(g.dtype)


def newton_schulz(mats: list[torch.Tensor], steps: int) -> list[torch.Tensor]:
    """Each 2-D fp32 CPU tensor normalized to Frobenius norm 1, then ``steps`` quintic
    Newton-Schulz steps, as ``orthogonalize`` does, in one kernel call with bf16 products; new
    tensors. The caller checks ``kernels.bf16_engine`` (not None)."""
    mark_used("newton_schulz")
    return _newton_schulz(library(), mats, steps, tiles=bf16_engine() == "amx")


def _newton_schulz(lib, mats: list[torch.Tensor], steps: int, tiles: bool) -> list[torch.Tensor]:
    # rows <= cols; a contiguous copy of each (the kernel works in place)
    work = [(m.T if m.shape[0] > m.shape[1] else m).clone(memory_format=torch.contiguous_format) for m in mats]
    n = len(work)
    ptrs = (ctypes.c_void_p * n)(*[w.data_ptr() for w in work])
    rows = (ctypes.c_int64 * n)(*[w.shape[0] for w in work])
    cols = (ctypes.c_int64 * n)(*[w.shape[1] for w in work])
    check_rc(lib.newton_schulz_bf16(n, ptrs, rows, cols, steps, threads(), int(tiles)),
             ("AMX" if tiles else "AVX-512-BF16") + " Newton-Schulz")
    return [w.T if m.shape[0] > m.shape[1] else w for m, w in zip(mats, work)]


def self_check(lib: ctypes.CDLL, tiles: bool = True) -> None:
    """Compare with ``orthogonalize`` (fp32) on wide, tall and padded shapes, on AMX tiles or
    the AVX-512-BF16 path; bf16 products leave the result within a few percent."""
    gen = torch.Generator().manual_seed(0)
    # (130, 140): big enough for the vector path to split its products over the threads
    mats = [torch.randn(r, c, generator=gen) for r, c in ((32, 36), (20, 70), (50, 17), (130, 140))]
    for m, got in zip(mats, _newton_schulz(lib, mats, 3, tiles)):
        want = orthogonalize(m, 3)
        if got.shape != m.shape or (got - want).norm() > 0.05 * want.norm():
            raise RuntimeError(f"the Newton-Schulz kernel disagrees with PyTorch for {tuple(m.shape)}: miscompiled?")
