"""--optimizer muon on the real data and the native kernel: the Newton-Schulz kernel on each engine
this machine has (AMX tiles, AVX-512-BF16), resume, one kernel step against PyTorch's. The PyTorch
iteration, the parameter split and one step by hand are in tests/unit/test_kernels_muon.py."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from mnistflow.kernels.muon import _newton_schulz
from mnistflow.models import create_model
from mnistflow.training.optim import build_optimizer
from mnistflow.training.api import train


def _engine(tiles: bool) -> None:
    """Skip unless this machine runs the kernel on that engine (AMX tiles, or AVX-512-BF16)."""
    from mnistflow import kernels
    from mnistflow.runtime.cpu import cpu_flags

    if tiles and not kernels.amx_available():
        pytest.skip(f"the AMX Newton-Schulz kernel needs a CPU with AMX ({kernels.amx_reason()})")
    if not tiles and (kernels.library() is None or "avx512_bf16" not in cpu_flags()):
        pytest.skip("the AVX-512-BF16 Newton-Schulz kernel needs a CPU with AVX-512-BF16")


def _kernel():
    from mnistflow import kernels

    if kernels.bf16_engine() is None:
        pytest.skip(f"no Newton-Schulz kernel on this machine ({kernels.bf16_reason()})")


@pytest.mark.parametrize("tiles", [True, False], ids=["amx", "avx512-bf16"])
@pytest.mark.parametrize("shape", [(96, 432), (432, 96), (32, 36), (300, 1152), (20, 70), (192, 432)])
def test_the_kernel_keeps_the_directions_and_evens_the_singular_values(shape, tiles):
    """The kernel (bf16 products) as its PyTorch reference does (tests/unit/test_kernels_muon.py),
    on each engine: 300 rows pad to 304, 19 blocks of 16 (the vector path takes them in pairs),
    and 432 columns to 448."""
    from mnistflow import kernels

    _engine(tiles)
    g = torch.Generator().manual_seed(0)
    # a badly conditioned matrix: singular values spread over three decades
    u, _ = torch.linalg.qr(torch.randn(shape[0], min(shape), generator=g))
    v, _ = torch.linalg.qr(torch.randn(shape[1], min(shape), generator=g))
    s = torch.logspace(0, -3, min(shape))
    m = u @ torch.diag(s) @ v.T
    o = _newton_schulz(kernels.library(), [m], 3, tiles)[0]
    assert o.shape == m.shape and o.dtype == m.dtype
    o = o.double()
    # in the input's singular basis the output is diagonal, with every value in [0.5, 1.3]
    d = u.double().T @ o @ v.double()
    diag = torch.diagonal(d)
    off = d - torch.diag(diag)
    assert off.abs().max() < 0.03 * 3  # bf16 products
    big = diag[s / s.norm() > 0.02]
    assert big.min() > 0.6 and big.max() < 1.25, (big.min(), big.max())
    assert (diag > 0).all() and (diag[s / s.norm() <= 0.02] > 5 * s[s / s.norm() <= 0.02] / s.norm()).all()


def test_muon_resumes_bitwise(mnist_records, tmp_path):
    common = dict(model="fast", optimizer="muon", lr=0.5, nesterov=True, data=str(mnist_records),
                  batch_size=64, quiet=True, threads=1, tensorboard=False, checkpoint_every=10,
                  channels_last=True)
    train(run_dir=str(tmp_path / "a"), epochs=0.02, **common)  # 18 steps (860 per epoch)
    s = train(run_dir=str(tmp_path / "a"), resume=True, epochs=0.05, quiet=True)
    assert s["resumed_from"].endswith("step-000018.pt") and s["steps"] == 43
    train(run_dir=str(tmp_path / "b"), epochs=0.05, **common)
    a, b = (load_file(str(tmp_path / r / "model.safetensors")) for r in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_muon_step_on_the_kernel_matches_pytorchs_iteration(monkeypatch):
    """One Muon step of the fast net with bf16 products (the Newton-Schulz kernel, on this
    machine's engine) and without (PyTorch's fp32 iteration): the same update up to bf16
    products, and identical for the SGD-side parameters."""
    _kernel()
    import mnistflow.training.optim as optim

    torch.manual_seed(0)
    models = [create_model("fast") for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    before = {n: p.detach().clone() for n, p in models[0].named_parameters()}
    grads = {n: torch.randn_like(p) for n, p in models[0].named_parameters()}
    calls = []
    monkeypatch.setattr(optim, "_muon_kernel", lambda: calls.append(1) or True)
    for model, bf16 in zip(models, (True, False)):
        opt = build_optimizer("muon", model.parameters(), 0.5, nesterov=True, weight_decay=5e-4, muon_lr=0.1,
                              bf16_products=bf16)
        for n, p in model.named_parameters():
            p.grad = grads[n].clone()
        opt.step()
    for (n, a), (_, b) in zip(models[0].named_parameters(), models[1].named_parameters()):
        da, db = a.detach() - before[n], b.detach() - before[n]
        if a.ndim >= 2 and n != "head.weight":  # orthogonalized: bf16 products
            assert (da - db).norm() < 0.03 * db.norm(), n
        else:
            assert torch.equal(da, db), n
    assert len(calls) == 1  # the fp32 optimizer never asked for the kernel
