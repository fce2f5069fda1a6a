"""PatchConv2d (a VALID convolution as one matrix product over its patches) against
PyTorch's convolution, and the fast net's last stage built from it."""
import pytest
import torch
import torch.nn.functional as F

from mnistflow.models import create_model
from mnistflow.models.fast import FastNet
from mnistflow.models.patch_conv import PatchConv2d, _PatchConv

CL = torch.channels_last


def _pair(c, o, k, seed=0):
    torch.manual_seed(seed)
    ours = PatchConv2d(c, o, k)
    ref = torch.nn.Conv2d(c, o, k, bias=False)
    ref.weight.data.copy_(ours.weight.data)
    return ours, ref


@pytest.mark.parametrize("shape,o,k", [((5, 48, 4, 4), 64, 3),   # the fast net's: 4 windows
                                       ((3, 8, 6, 7), 16, 3),    # 20 windows > 9 taps: the other sum
                                       ((2, 5, 5, 5), 7, 5),     # one window, an odd channel count
                                       ((2, 4, 3, 3), 6, 1)])    # 1x1
@pytest.mark.parametrize("layout", [CL, torch.contiguous_format])
def test_matches_conv2d_in_fp32(shape, o, k, layout):
    ours, ref = _pair(shape[1], o, k)
    x = torch.randn(shape).contiguous(memory_format=layout)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ours(xa), ref(xb)
    assert ya.shape == yb.shape
    torch.testing.assert_close(ya, yb, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(yb)
    (ya * g).sum().backward()
    (yb * g).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-5, atol=1e-4)


def test_bf16_autocast_is_as_close_as_pytorchs_own_bf16_and_keeps_an_fp32_gradient(monkeypatch):
    calls = []
    apply = _PatchConv.apply
    monkeypatch.setattr(_PatchConv, "apply", lambda *a: calls.append(1) or apply(*a))
    ours, ref = _pair(48, 192, 3)
    x = torch.randn(64, 48, 4, 4).contiguous(memory_format=CL)
    g = torch.randn(64, 192, 2, 2)
    exact_y = F.conv2d(x.double(), ref.weight.double())
    exact_gw = torch.ops.aten.convolution_backward(g.double(), x.double(), ref.weight.double(), None, [1, 1],
                                                   [0, 0], [1, 1], False, [0, 0], 1, [False, True, False])[1]
    errs = {}
    for name, m in (("ours", ours), ("torch", ref)):
        m.weight.grad = None
        with torch.autocast("cpu", torch.bfloat16):
            y = m(x)
        assert y.dtype == torch.bfloat16
        (y.float() * g).sum().backward()
        assert m.weight.grad.dtype == torch.float32
        errs[name] = ((y.double() - exact_y).abs().max().item(),
                      (m.weight.grad.double() - exact_gw).abs().max().item())
    assert calls, "the patch path did not run"
    # within 2x of PyTorch's bf16 convolution's error (the products round the same inputs)
    assert errs["ours"][0] <= 2 * errs["torch"][0] + 1e-3, errs
    assert errs["ours"][1] <= 2 * errs["torch"][1] + 1e-3, errs


def test_inference_and_tracing_take_plain_paths_with_equal_results():
    ours, ref = _pair(48, 32, 3)
    x = torch.randn(4, 48, 4, 4).contiguous(memory_format=CL)
    with torch.inference_mode():
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)
    traced = torch.jit.trace(ours, x)
    assert "aten::_convolution" in str(traced.inlined_graph)  # exporters see a convolution
    torch.testing.assert_close(traced(x), ref(x), rtol=1e-5, atol=1e-5)


def test_fast_net_last_stage_is_valid_where_the_map_allows():
    net = create_model("fast")
    assert isinstance(net.features[6], PatchConv2d) and len(net.features) == 8
    shapes = []
    net.features[6].register_forward_hook(lambda m, i, o: shapes.append((i[0].shape, o.shape)))
    assert net(torch.randn(3, 1, 28, 28)).shape == (3, 10)
    assert shapes == [((3, 48, 4, 4), (3, 192, 2, 2))]
    assert create_model("fast", (3, 32, 32))(torch.randn(2, 3, 32, 32)).shape == (2, 10)  # CIFAR: 4x4 -> 2x2
    small = FastNet((1, 8, 8), 10, (32, 48, 192), valid_last=True)  # 4 -> 2 -> 1: no room for VALID
    assert not any(isinstance(m, PatchConv2d) for m in small.modules())
    assert small(torch.randn(2, 1, 8, 8)).shape == (2, 10)
