"""Muon's Newton-Schulz reference (``kernels.muon.orthogonalize``, the path wherever the AMX
kernel is not) and the optimizer around it: which parameters it takes, one step by hand. No
native library: the AMX kernel's own tests are in tests/integration/test_muon.py."""
from __future__ import annotations

import pytest
import torch

from mnistflow import kernels
from mnistflow.kernels import muon
from mnistflow.kernels.muon import orthogonalize
from mnistflow.models import create_model, list_models
from mnistflow.training import optim
from mnistflow.training.optim import Muon, build_optimizer


@pytest.fixture(autouse=True)
def _no_native_library(monkeypatch):
    """PyTorch's path, and no build attempt (a compiler is a subprocess) cached for later tiers."""
    monkeypatch.setenv("MNISTFLOW_KERNELS", "0")
    kernels.library.cache_clear()
    yield
    kernels.library.cache_clear()


def test_the_optimizer_uses_the_reference_beside_the_kernel():
    assert optim.orthogonalize is orthogonalize
    assert not optim._muon_kernel()  # no library: PyTorch's iteration


@pytest.mark.parametrize("fast_bf16", [False, True])
def test_big_matrices_take_bf16_products_only_where_the_cpu_has_bf16_units(fast_bf16, monkeypatch):
    """A CPU without bf16 units (AVX2 only) emulates bf16 matmuls several times slower than
    fp32: there the iteration stays in fp32, bit for bit the fp32 computation."""
    monkeypatch.setattr(muon, "cpu_has_fast_bf16", lambda: fast_bf16)
    m = torch.randn(192, 432, generator=torch.Generator().manual_seed(0))  # 82,944 entries
    seen = []
    real = torch.addmm
    monkeypatch.setattr(torch, "addmm", lambda *a, **k: seen.append(a[0].dtype) or real(*a, **k))
    o = orthogonalize(m)
    assert o.dtype == torch.float32 and set(seen) == {torch.bfloat16 if fast_bf16 else torch.float32}
    small = torch.randn(32, 36)
    seen.clear()
    orthogonalize(small)
    assert set(seen) == {torch.float32}  # below 65,536 entries: fp32 everywhere


@pytest.mark.parametrize("shape", [(96, 432), (432, 96), (32, 36), (300, 1152), (20, 70)])
def test_orthogonalize_keeps_the_directions_and_evens_the_singular_values(shape):
    g = torch.Generator().manual_seed(0)
    # a badly conditioned matrix: singular values spread over three decades
    u, _ = torch.linalg.qr(torch.randn(shape[0], min(shape), generator=g))
    v, _ = torch.linalg.qr(torch.randn(shape[1], min(shape), generator=g))
    s = torch.logspace(0, -3, min(shape))
    m = u @ torch.diag(s) @ v.T
    o = orthogonalize(m)
    assert o.shape == m.shape and o.dtype == m.dtype
    o = o.double()
    # in the input's singular basis the output is diagonal, with every value in [0.5, 1.3]
    d = u.double().T @ o @ v.double()
    diag = torch.diagonal(d)
    off = d - torch.diag(diag)
    bf16 = m.numel() >= 1 << 16 and muon.cpu_has_fast_bf16()  # bf16 products above 65,536
    assert off.abs().max() < 0.03 * (3 if bf16 else 1)
    # three steps multiply a small singular value by up to 3.4^3 = 41: anything above ~2% of the
    # Frobenius norm (the scale the iteration starts from) ends in [0.68, 1.2]; the rest grows
    big = diag[s / s.norm() > 0.02]
    assert big.min() > 0.6 and big.max() < 1.25, (big.min(), big.max())
    assert (diag > 0).all() and (diag[s / s.norm() <= 0.02] > 5 * s[s / s.norm() <= 0.02] / s.norm()).all()


@pytest.mark.parametrize("name", list_models())
def test_muon_takes_the_hidden_matrices_and_leaves_the_classifier_to_sgd(name):
    model = create_model(name, (1, 28, 28), num_classes=7)
    opt = build_optimizer("muon", model.parameters(), 0.1)
    sgd, *rest = opt.param_groups
    muon = rest[0]["params"] if rest else []
    assert not sgd["muon"] and all(g["muon"] for g in rest)
    matrices = [p for p in sgd["params"] if p.ndim >= 2]
    assert len(matrices) == 1 and matrices[0].shape[0] == 7  # the classifier, and only it
    assert all(p.ndim >= 2 for p in muon)
    n_matrices = sum(p.ndim >= 2 for p in model.parameters())
    assert len(muon) == n_matrices - 1


def test_one_step_by_hand():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8 * 16, 5))
    opt = Muon(model.parameters(), 0.5, muon_lr=0.2, muon_momentum=0.8, momentum=0.9, nesterov=True,
               weight_decay=0.01)
    for _ in range(2):  # the second step uses the momentum buffers
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        model(torch.randn(4, 3, 6, 6)).square().sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        bufs = [opt.state[p].get("momentum_buffer", torch.zeros_like(p)).clone() for p in model.parameters()]
        opt.step()
        conv_w, conv_b, fc_w, fc_b = before
        # the conv filters: Nesterov momentum 0.8, orthogonalized, lr 0.2, no weight decay
        b = 0.8 * bufs[0] + grads[0]
        u = grads[0] + 0.8 * b
        want = conv_w - 0.2 * orthogonalize(u.reshape(8, -1)).view_as(u)
        assert torch.allclose(model[0].weight, want, atol=1e-6)
        # everything else: Nesterov SGD, lr 0.5, momentum 0.9, weight decay 0.01
        for k, (p0, p) in zip((1, 2, 3), [(conv_b, model[0].bias), (fc_w, model[2].weight), (fc_b, model[2].bias)]):
            g = grads[k] + 0.01 * p0
            b = 0.9 * bufs[k] + g
            assert torch.allclose(p, p0 - 0.5 * (g + 0.9 * b), atol=1e-6)


def test_a_learning_rate_given_as_a_device_tensor_steps_as_the_float_does():
    # A CUDA graph replays the step with the rate in a 0-d tensor (engine.GraphedStep); the
    # tensor itself must not change (``lr *= scale`` on it would compound every step).
    def run(lr_of):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8 * 16, 5))
        opt = Muon(model.parameters(), 0.5, muon_lr=0.2, nesterov=True, weight_decay=0.01)
        for step in range(3):
            opt.zero_grad()
            model(torch.randn(4, 3, 6, 6)).square().mean().backward()
            for g in opt.param_groups:
                g["lr"] = lr_of(step)
            opt.step()
        return [p.detach() for p in model.parameters()]

    rate = torch.tensor(0.0)

    def tensor_lr(step):
        rate.fill_(0.05 / (step + 1))
        return rate

    floats, tensors = run(lambda step: 0.05 / (step + 1)), run(tensor_lr)
    assert rate.item() == pytest.approx(0.05 / 3)  # untouched by the step
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(floats, tensors))
    assert not torch.equal(floats[0], run(lambda step: 0.05)[0])  # the rate does matter
