"""--optimizer muon: the orthogonalization, which parameters it takes, one step by hand, resume."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from mnistflow.models import create_model, list_models
from mnistflow.training.optim import Muon, build_optimizer, orthogonalize
from mnistflow.training.loop import train


def _orthogonalizer(impl: str):
    if impl == "torch":
        return orthogonalize, False
    from mnistflow.kernels import muon

    if not muon.available():
        pytest.skip("the AMX Newton-Schulz kernel needs a CPU with AMX")
    return (lambda m: muon.newton_schulz([m], 3)[0]), True


@pytest.mark.parametrize("impl", ["torch", "amx"])
@pytest.mark.parametrize("shape", [(96, 432), (432, 96), (32, 36), (300, 1152), (20, 70)])
def test_orthogonalize_keeps_the_directions_and_evens_the_singular_values(shape, impl):
    """PyTorch's iteration (optim.orthogonalize) and the AMX kernel (bf16 products) alike."""
    ortho, bf16 = _orthogonalizer(impl)
    g = torch.Generator().manual_seed(0)
    # a badly conditioned matrix: singular values spread over three decades
    u, _ = torch.linalg.qr(torch.randn(shape[0], min(shape), generator=g))
    v, _ = torch.linalg.qr(torch.randn(shape[1], min(shape), generator=g))
    s = torch.logspace(0, -3, min(shape))
    m = u @ torch.diag(s) @ v.T
    o = ortho(m)
    assert o.shape == m.shape and o.dtype == m.dtype
    o = o.double()
    # in the input's singular basis the output is diagonal, with every value in [0.5, 1.3]
    d = u.double().T @ o @ v.double()
    diag = torch.diagonal(d)
    off = d - torch.diag(diag)
    assert off.abs().max() < 0.03 * (3 if bf16 or m.numel() >= 1 << 16 else 1)  # bf16 products
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
    before = [p.detach().clone() for p in model.parameters()]
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
        for i, (p0, p) in enumerate([(conv_b, model[0].bias), (fc_w, model[2].weight), (fc_b, model[2].bias)]):
            k = [1, 2, 3][i]
            g = grads[k] + 0.01 * p0
            b = 0.9 * bufs[k] + g
            assert torch.allclose(p, p0 - 0.5 * (g + 0.9 * b), atol=1e-6)


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


def test_a_muon_step_on_the_amx_kernel_matches_pytorchs_iteration(monkeypatch):
    """One Muon step of the fast net with bf16 products (the Newton-Schulz kernel) and without
    (PyTorch's fp32 iteration): the same update up to bf16 products, and identical for the
    SGD-side parameters."""
    _orthogonalizer("amx")
    import mnistflow.training.optim as optim

    torch.manual_seed(0)
    models = [create_model("fast") for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    before = {n: p.detach().clone() for n, p in models[0].named_parameters()}
    grads = {n: torch.randn_like(p) for n, p in models[0].named_parameters()}
    calls = []
    monkeypatch.setattr(optim, "_amx_muon", lambda: calls.append(1) or True)
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
