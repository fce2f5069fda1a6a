"""The kernels' torch references (each beside its kernel) and the path without a native library
(``MNISTFLOW_KERNELS=0``, no compiler, or no AMX): PyTorch's numbers, nothing recorded as run on
a kernel, and ``kernels.used()`` cheap. The kernels themselves against these references:
tests/integration/test_kernels.py (building them needs the compiler, a subprocess)."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mnistflow import kernels
from mnistflow.kernels import bnrelu, layout, muon, pool, wgrad
from mnistflow.models.layers import BatchNormReLU2d, MaxPool2x2
from mnistflow.models.patch_conv import windows

CL = torch.channels_last


@pytest.fixture(autouse=True)
def _no_native_library(monkeypatch):
    monkeypatch.setenv("MNISTFLOW_KERNELS", "0")
    monkeypatch.setattr(kernels._state, "amx", kernels._Verdict())
    kernels.library.cache_clear()
    kernels.reset_used()
    yield
    kernels.library.cache_clear()


def test_col2im_reference_is_the_gradient_of_the_windows():
    """col2im's reference sums each window's share of the gradient into the pixels it covers:
    the gradient autograd gives through the windows' view (PatchConv2d's forward)."""
    g = torch.Generator().manual_seed(0)
    for n, c, h, w, k in ((2, 5, 4, 4, 3), (3, 4, 5, 7, 3), (1, 3, 3, 3, 1), (2, 2, 6, 5, 2)):
        x = torch.randn(n, c, h, w, generator=g).requires_grad_()
        view = windows(x, (k, k)).permute(0, 4, 5, 2, 3, 1)  # (N, OH, OW, K, K, C)
        gc = torch.randn(view.shape, generator=g)
        (view * gc).sum().backward()
        got = layout.col2im_reference(gc, h, w, k)
        assert got.shape == x.shape
        torch.testing.assert_close(got, x.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layout.col2im(gc.contiguous(), h, w, k), x.grad, rtol=1e-5, atol=1e-5)


def test_weight_grad_reference_is_conv2ds_weight_gradient():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 5, 6, generator=g)
    w = torch.randn(8, 4, 3, 3, generator=g, requires_grad=True)
    gy = torch.randn(3, 8, 5, 6, generator=g)
    (F.conv2d(x, w, padding=1) * gy).sum().backward()
    torch.testing.assert_close(wgrad.weight_grad_reference(x, gy), w.grad, rtol=1e-5, atol=1e-5)


def test_without_the_library_the_modules_are_pytorchs_ops():
    assert kernels.library() is None and kernels.reason() == "off (MNISTFLOW_KERNELS=0)"
    assert not kernels.amx_available() and kernels.amx_reason() == "native kernels not loaded"
    torch.manual_seed(0)
    x = torch.randn(8, 16, 6, 6).contiguous(memory_format=CL)
    assert not pool.supports(x, True)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = MaxPool2x2()(a), pool.reference(b)
    assert torch.equal(got, want) and type(got.grad_fn).__name__ != "_MaxPool2x2Backward"
    ours, ref = BatchNormReLU2d(16), nn.BatchNorm2d(16)
    assert not bnrelu.supports(got, ours.weight, ours.bias, ours.running_mean, ours.running_var)
    y, z = ours(got), F.relu(ref(want))
    torch.testing.assert_close(y, z, rtol=0, atol=0)
    (y.sum() + z.sum()).backward()
    assert torch.equal(a.grad, b.grad)
    assert torch.equal(ours.running_var, ref.running_var)
    assert not wgrad.supports(x.bfloat16(), 16)
    assert torch.equal(layout.swap_batch_channels(x), layout.swap_reference(x))
    assert kernels.used() == {"native": "off (MNISTFLOW_KERNELS=0)", "amx": "native kernels not loaded",
                              "avx512_bf16": "native kernels not loaded", "ops": []}


def test_amx_off_says_so(monkeypatch):
    monkeypatch.setenv("MNISTFLOW_AMX", "0")
    assert not kernels.amx_available() and kernels.amx_reason() == "off (MNISTFLOW_AMX=0)"


def test_used_records_ops_once_sorted_and_builds_nothing(monkeypatch):
    monkeypatch.setattr(kernels, "build", lambda *a: pytest.fail("used() must not build the library"))
    monkeypatch.setattr(kernels, "_state", kernels._State())
    assert kernels.used() == {"native": "not loaded yet", "amx": "not checked", "avx512_bf16": "not checked",
                              "ops": []}
    for op in ("maxpool2x2", "bnrelu", "maxpool2x2"):
        kernels.mark_used(op)
    assert kernels.used()["ops"] == ["bnrelu", "maxpool2x2"]
    kernels.reset_used()
    assert kernels.used()["ops"] == []


def test_every_caller_maps_a_kernels_return_code_through_check_rc(monkeypatch):
    """A kernel that returns 1 (out of memory) is a MemoryError naming the kernel from every op
    module that calls one; -1 (a path this build lacks) a NotImplementedError."""
    x = torch.randn(2, 3, 4, 4).contiguous(memory_format=CL)
    stats = torch.zeros(3)
    xb, gb = x.bfloat16(), torch.randn(2, 16, 4, 4).bfloat16().contiguous(memory_format=CL)
    calls = [
        ("max-pool", lambda lib: pool._forward(lib, x)),
        ("batch-norm", lambda lib: bnrelu._forward(lib, x, None, None, None, None, 0.1, 1e-5)),
        ("batch-norm", lambda lib: bnrelu._backward(lib, x, x, x, None, stats, stats, False, False)),
        ("col2im", lambda lib: layout.col2im(torch.randn(2, 2, 2, 3, 3, 5), 4, 4, 3)),
        ("weight-gradient", lambda lib: wgrad._weight_grad(lib, xb, gb, tiles=False)),
        ("conv + max-pool", lambda lib: wgrad._conv_max_pool(lib, xb, torch.randn(16, 3, 3, 3))),
        ("AVX-512-BF16 Newton-Schulz", lambda lib: muon._newton_schulz(lib, [torch.randn(4, 6)], 3, tiles=False)),
    ]
    for rc, error, says in ((1, MemoryError, "out of memory"), (-1, NotImplementedError, "not in this build")):
        lib = SimpleNamespace(**{name: (lambda *a, rc=rc: rc) for name in kernels.SIGNATURES})
        monkeypatch.setattr(layout, "library", lambda lib=lib: lib)  # col2im finds its own
        for kernel, call in calls:
            with pytest.raises(error, match=f"^{re.escape(kernel)} kernel: {says}"):
                call(lib)
