"""``NAME-xK`` ensembles (``models.ensemble``): what the forward returns in training and in
evaluation, the summed member losses (each member's gradient is its own loss's), Muon's split
per member, and the names it refuses. Training one on real MNIST: tests/integration/test_ensemble.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mnistflow.core.errors import MnistflowError
from mnistflow.models import create_model, get_entry
from mnistflow.models.ensemble import Ensemble, combined, member_loss, nets, parse_name
from mnistflow.training.optim import build_optimizer, net_parameters


def test_members_are_separate_nets_and_the_forward_depends_on_the_mode():
    torch.manual_seed(0)
    m = create_model("fast-x3", (1, 28, 28), 10)
    assert isinstance(m, Ensemble) and len(m.members) == 3 and nets(m) == list(m.members)
    a, b = (dict(x.named_parameters()) for x in m.members[:2])
    assert not torch.equal(a["head.weight"], b["head.weight"])  # initialised independently
    x = torch.randn(5, 1, 28, 28)
    out = m.train()(x)
    assert out.shape == (5, 3, 10)
    m.eval()
    with torch.no_grad():
        got = m(x)
        want = torch.stack([k(x).softmax(1) for k in m.members]).mean(0).log()
    assert got.shape == (5, 10) and torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(got.exp().sum(1), torch.ones(5), atol=1e-5)  # log-probabilities
    # a training forward's members (batch statistics) combined the same way
    assert torch.allclose(combined(out.detach()), out.detach().softmax(2).mean(1).log(), atol=1e-6)
    plain = create_model("fast")
    assert nets(plain) == [plain]


def test_the_loss_is_the_sum_of_the_members_own_losses():
    torch.manual_seed(0)
    m = create_model("fast-x2", (1, 28, 28), 10).train()  # no dropout: deterministic
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    loss = member_loss(m(x), y, lambda z, t: F.cross_entropy(z, t, label_smoothing=0.1))
    loss.backward()
    for k, member in enumerate(m.members):
        ref = create_model("fast", (1, 28, 28), 10)
        ref.load_state_dict(member.state_dict())
        own = F.cross_entropy(ref(x), y, label_smoothing=0.1)
        own.backward()
        for (name, p), q in zip(member.named_parameters(), ref.parameters()):
            assert torch.allclose(p.grad, q.grad, atol=1e-5), (k, name)  # no cross-talk
    single = torch.randn(8, 10)
    assert member_loss(single, y, F.cross_entropy) == F.cross_entropy(single, y)


def test_muon_leaves_every_members_classifier_to_sgd():
    m = create_model("fast-x3", (1, 28, 28), num_classes=7)
    opt = build_optimizer("muon", net_parameters(m), 0.1)
    sgd, muon = opt.param_groups
    heads = [p for p in sgd["params"] if p.ndim >= 2]
    assert len(heads) == 3 and all(p.shape[0] == 7 for p in heads)
    assert {id(p) for p in heads} == {id(k.head.weight) for k in m.members}
    assert len(muon["params"]) == sum(p.ndim >= 2 for p in m.parameters()) - 3
    # any other optimizer takes the members' parameters as one list
    sgd_opt = build_optimizer("momentum", net_parameters(m), 0.1)
    assert sum(len(g["params"]) for g in sgd_opt.param_groups) == len(list(m.parameters()))


def test_names():
    assert parse_name("fast-wide-x4") == ("fast-wide", 4) and parse_name("fast-wide") is None
    assert get_entry("seed-cnn-x2").description.startswith("2 seed-cnn nets")
    for bad, why in [("fast-x1", "2 to 16 members"), ("fast-x17", "2 to 16 members"),
                     ("nosuch-x2", "unknown model 'nosuch-x2'"),
                     ("fast-x" + "9" * 5000, r"unknown model 'fast-x9{71}\.\.\.' ")]:  # no int of 5,000 digits
        with pytest.raises(MnistflowError, match=why):
            create_model(bad)
