"""Every registered model: forward, backward, shapes. The layer toolbox and the spec language."""
from __future__ import annotations

import pytest
import torch

from mnistflow.core.errors import MnistflowError
from mnistflow.models import create_model, list_models
from mnistflow.models.layers import Conv2d, pool


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)], ids=["28x28x1", "32x32x3"])
@pytest.mark.parametrize("name", list_models())
def test_every_registered_model(name, shape):
    torch.manual_seed(0)
    model = create_model(name, shape, num_classes=7)
    x = torch.randn(4, *shape)
    y = model(x)
    assert y.shape == (4, 7) and torch.isfinite(y).all()
    torch.nn.functional.cross_entropy(y, torch.arange(4) % 7).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    model.eval()
    with torch.no_grad():  # channels_last gives the same answer
        a = model(x)
        b = model.to(memory_format=torch.channels_last)(x.contiguous(memory_format=torch.channels_last))
    assert torch.allclose(a, b, atol=1e-4)


def test_seed_cnn_is_the_tutorials_network():
    m = create_model("seed-cnn")
    assert sum(p.numel() for p in m.parameters()) == 3_274_634  # the tutorial's 3.27M
    assert [tuple(p.shape) for p in m.parameters()] == [
        (32, 1, 5, 5), (32,), (64, 32, 5, 5), (64,), (1024, 3136), (1024,), (10, 1024), (10,)]
    assert create_model("softmax")[-1].weight.shape == (10, 784)


@pytest.mark.parametrize("k,s,padding,size,out", [
    (5, 1, "same", 28, 28), (5, 1, "valid", 28, 24), (5, 2, "same", 28, 14), (5, 2, "valid", 28, 12),
    (3, 2, "same", 7, 4), (4, 1, "same", 7, 7), (3, 3, "same", 28, 10),
])
def test_conv_same_valid_strides_follow_tensorflow(k, s, padding, size, out):
    conv = Conv2d(1, 2, k, s, padding)
    assert conv(torch.zeros(1, 1, size, size)).shape[-1] == out  # TF: ceil(n/s) or ceil((n-k+1)/s)


def test_pools():
    x = torch.arange(49.0).view(1, 1, 7, 7)
    assert pool("max", 2, padding="same")(x).shape[-1] == 4
    assert pool("max", 2, padding="valid")(x).shape[-1] == 3
    assert pool("avg", 2, padding="valid")(x)[0, 0, 0, 0] == (0 + 1 + 7 + 8) / 4


def test_spec_builds_the_tutorial_cnn():
    spec = "conv5x5x32-relu,maxpool2,conv5x5x64-relu,maxpool2,fc1024-relu,dropout0.5,fc10"
    m = create_model(spec)
    assert sum(p.numel() for p in m.parameters()) == 3_274_634
    # ReLU runs after the max-pool it fed (same function, 4x less work); names stay.
    assert [n for n, _ in m.named_children()][:3] == ["conv1", "maxpool1", "relu1"]
    m2 = create_model("conv3x3x8-s2-valid-bn-tanh,avgpool2,sigmoid,fc10")
    assert m2(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_pooling_before_relu_keeps_the_function_and_its_gradients():
    torch.manual_seed(0)
    m = create_model("seed-cnn")
    naive = torch.nn.Sequential(*[m.conv1, m.relu1, m.maxpool1, m.conv2, m.relu2, m.maxpool2,
                                  *list(m.children())[6:]]).eval()  # the tutorial's order
    m.eval()
    x = torch.randn(8, 1, 28, 28, dtype=torch.float64)
    m.double()
    out = m(x)
    grads = torch.autograd.grad(out.square().sum(), list(m.parameters()))
    ref = naive(x)
    ref_grads = torch.autograd.grad(ref.square().sum(), list(naive.parameters()))
    assert torch.equal(out, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)
    m3 = create_model("conv3x3x8-relu,avgpool2,fc10")  # average pooling does not commute
    assert [n for n, _ in m3.named_children()][:3] == ["conv1", "relu1", "avgpool1"]


@pytest.mark.parametrize("spec,fragment", [
    ("conv5x5x32-wobble,fc10", "unknown option"),
    ("conv5x5x32,blah,fc10", "cannot read"),
    ("conv5x5x32,fc7", "7 outputs"),
    ("conv29x29x8-valid,fc10", "does not fit"),
])
def test_bad_specs(spec, fragment):
    with pytest.raises(MnistflowError, match=fragment):
        create_model(spec, (1, 28, 28), 10)


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(MnistflowError, match="seed-cnn"):
        create_model("no-such-net")


@pytest.mark.parametrize("p", [0.5, 0.1, 0.3, 0.9])
def test_dropout_mask_rate_independence_and_seeding(p):
    from mnistflow.models.layers import keep_mask

    x = torch.empty(1000, 1000)
    torch.manual_seed(1)
    m = keep_mask(x, p)
    assert m.shape == x.shape and m.dtype == torch.bool
    assert abs(m.float().mean().item() - (1 - p)) < 0.003  # 1M draws: 5 sigma is < 0.0025
    f = m.flatten().float() - (1 - p)
    for lag in (1, 2, 3, 4):  # neighbours share a 32-bit draw: they must still be independent
        assert abs((f[:-lag] * f[lag:]).mean().item()) < 0.002
    torch.manual_seed(1)
    assert torch.equal(keep_mask(x, p), m)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8, torch.float64])
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("c", [1, 3])
def test_space_to_depth_is_tensorflows_and_pixel_unshuffle_for_one_channel(c, layout, dtype):
    from mnistflow.models.fast import space_to_depth

    x = (torch.randn(5, c, 8, 6) * 50).to(dtype).contiguous(memory_format=layout)
    out = space_to_depth(x)
    want = x.view(5, c, 4, 2, 3, 2).permute(0, 3, 5, 1, 2, 4).reshape(5, 4 * c, 4, 3)  # (row, col, ch)
    assert torch.equal(out, want) and out.is_contiguous(memory_format=torch.channels_last)
    if c == 1:
        assert torch.equal(out, torch.nn.functional.pixel_unshuffle(x, 2))
    if dtype.is_floating_point:  # the plain path keeps the gradient
        xg = x.clone().requires_grad_()
        space_to_depth(xg).float().pow(2).sum().backward()
        assert torch.equal(xg.grad, 2 * x)
