"""Muon's Newton-Schulz orthogonalization on the AMX matrix engine (``muon.c``).

PyTorch ran each Newton-Schulz step of each weight matrix as three small fp32 calls: for the
fast net's three matrices, 27 calls and ~0.7 ms of a ~10 ms training step. The kernel does a
whole step's matrices in one call (bf16 products accumulated in fp32, the iterate kept in
fp32, the matrices spread over the threads): ~0.2 ms. Where it does not apply (no AMX, CUDA
tensors, ``MNISTFLOW_AMX=0``) ``optim.orthogonalize`` runs instead.
"""
from __future__ import annotations

import ctypes

import torch

from mnistflow.kernels import library, threads, wgrad


def available() -> bool:
    """AMX is usable and this kernel passed its check (both in ``wgrad.available``)."""
    return wgrad.available()


def newton_schulz(mats: list[torch.Tensor], steps: int) -> list[torch.Tensor]:
    """Each 2-D fp32 CPU tensor normalized to Frobenius norm 1, then ``steps`` quintic
    Newton-Schulz steps, as ``optim.orthogonalize`` does, in one kernel call; new tensors.
    The caller checks ``available``."""
    # rows <= cols; a contiguous copy of each (the kernel works in place)
    work = [(m.T if m.shape[0] > m.shape[1] else m).clone(memory_format=torch.contiguous_format) for m in mats]
    n = len(work)
    ptrs = (ctypes.c_void_p * n)(*[w.data_ptr() for w in work])
    rows = (ctypes.c_int64 * n)(*[w.shape[0] for w in work])
    cols = (ctypes.c_int64 * n)(*[w.shape[1] for w in work])
    if library().newton_schulz_bf16(n, ptrs, rows, cols, steps, threads()):
        raise MemoryError("Newton-Schulz kernel: out of memory")
    return [w.T if m.shape[0] > m.shape[1] else w for m, w in zip(mats, work)]


def self_check() -> None:
    """Compare with ``optim.orthogonalize`` (fp32) on wide, tall and padded shapes; bf16
    products leave the result within a few percent."""
    from mnistflow.training.optim import orthogonalize

    gen = torch.Generator().manual_seed(0)
    mats = [torch.randn(r, c, generator=gen) for r, c in ((32, 36), (20, 70), (50, 17))]
    for m, got in zip(mats, newton_schulz(mats, 3)):
        want = orthogonalize(m, 3)
        if got.shape != m.shape or (got - want).norm() > 0.05 * want.norm():
            raise RuntimeError(f"the Newton-Schulz kernel disagrees with PyTorch for {tuple(m.shape)}: miscompiled?")
