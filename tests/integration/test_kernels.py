"""The native CPU kernels (``mnistflow.kernels``): built on this machine, identical to PyTorch's
ops (max-pool and the layout swap exactly, batch norm + ReLU to float rounding), used where
they apply, and PyTorch's ops wherever they do not or cannot be built."""
from __future__ import annotations

import copy
import os
import struct
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mnistflow import kernels
from mnistflow.kernels import bnrelu as kernel_bnrelu
from mnistflow.kernels.layout import swap_batch_channels
from mnistflow.models import create_model
from mnistflow.models.layers import BatchNormReLU2d, MaxPool2x2

CL = torch.channels_last


@pytest.fixture
def rebuilt(monkeypatch):
    """Forget the loaded library before and after the test (it is cached per process)."""
    kernels.library.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    kernels.library.cache_clear()


def test_the_kernels_build_and_pass_their_self_check_here():
    kernels.library.cache_clear()  # whatever an earlier test (or tier) left cached
    assert kernels.library() is not None, kernels.reason()
    assert kernels.reason().startswith("loaded")
    built = list(Path(os.environ["MNISTFLOW_HOME"], "kernels").glob("mnistflow-kernels-*.so"))
    assert len(built) == 1


def _exported_functions(path: Path) -> set[str]:
    """The functions a 64-bit little-endian ELF shared library exports (its .dynsym: defined,
    global or weak, default visibility)."""
    data = path.read_bytes()
    assert data[:6] == b"\x7fELF\x02\x01", "not a 64-bit little-endian ELF file"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out = set()
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 11:  # SHT_DYNSYM
            continue
        strtab = sections[link][4]
        for k in range(offset, offset + size, entsize):
            name, info, other, shndx, _, _ = struct.unpack_from("<IBBHQQ", data, k)
            if shndx != 0 and info & 0xF == 2 and info >> 4 in (1, 2) and other & 3 == 0:
                out.add(data[strtab + name:data.index(b"\0", strtab + name)].decode())
    return out


@pytest.mark.skipif(not os.uname().sysname == "Linux", reason="reads an ELF library")
def test_the_library_exports_exactly_the_declared_functions():
    """csrc/mnistflow_kernels.h declares (and kernels.SIGNATURES binds, tests/unit/test_kernels_abi.py)
    every exported function; -fvisibility=hidden keeps everything else inside the library."""
    assert kernels.library() is not None, kernels.reason()
    assert _exported_functions(kernels.build()) == set(kernels.SIGNATURES)


def _inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-4, 5, shape, generator=g).to(dtype)  # few distinct values: many ties
    x.view(-1)[:: 97] = float("-inf")
    x.view(-1)[5:: 211] = float("nan")
    return x.contiguous(memory_format=CL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(2, 37, 5, 7), (3, 16, 8, 8), (4, 48, 7, 7), (2, 3, 1, 1), (1, 1, 9, 4)])
def test_max_pool_kernel_is_pytorchs_max_pool_bit_for_bit(shape, dtype):
    x = _inputs(shape, dtype)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = F.max_pool2d(a, 2, ceil_mode=True)
    got = MaxPool2x2(ceil_mode=True)(b)
    assert type(got.grad_fn).__name__ == "_MaxPool2x2Backward"  # the kernel ran
    assert got.is_contiguous(memory_format=CL)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    g = torch.randn(want.shape).to(dtype)  # NCHW: the backward takes any layout
    want.backward(g)
    got.backward(g)
    assert torch.equal(b.grad, a.grad)


def test_max_pool_falls_back_where_the_kernel_does_not_apply():
    pool = MaxPool2x2(ceil_mode=False)
    odd = torch.randn(2, 4, 7, 7).contiguous(memory_format=CL).requires_grad_()
    assert type(pool(odd).grad_fn).__name__ != "_MaxPool2x2Backward"  # floor mode, odd size
    nchw = torch.randn(2, 4, 8, 8, requires_grad=True)
    out = pool(nchw)
    assert type(out.grad_fn).__name__ != "_MaxPool2x2Backward"
    assert torch.equal(out, F.max_pool2d(nchw, 2))
    half = torch.randn(2, 4, 8, 8).half().contiguous(memory_format=CL)
    assert torch.equal(pool(half), F.max_pool2d(half, 2))


def _bn_pair(c, **kw):
    torch.manual_seed(1)
    ref = nn.BatchNorm2d(c, **kw)
    if ref.affine:
        nn.init.uniform_(ref.weight, 0.5, 1.5)
        nn.init.normal_(ref.bias, 0, 0.2)
    ours = BatchNormReLU2d(c, **kw)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("shape", [(8, 37, 5, 3), (256, 32, 7, 7), (64, 96, 2, 2)])
def test_batch_norm_relu_kernel_matches_pytorch(shape, dtype, tol, monkeypatch):
    ref, ours = _bn_pair(shape[1])
    x = (torch.randn(shape) * 3 + 1).to(dtype).contiguous(memory_format=CL)
    g = torch.randn(shape).to(dtype).contiguous(memory_format=CL)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    for _ in range(2):  # twice: the running statistics and the batch counter move alike
        want = F.relu(ref(a))
        got = ours(b)
    assert type(got.grad_fn).__name__ == "_BatchNormReLUBackward"
    want.backward(g)
    got.backward(g)

    def close(u, v):
        u, v = u.detach().float(), v.detach().float()
        return torch.allclose(u, v, rtol=tol, atol=tol * v.abs().max().item())

    assert close(got, want) and close(b.grad, a.grad)
    assert close(ours.weight.grad, ref.weight.grad) and close(ours.bias.grad, ref.bias.grad)
    assert torch.allclose(ours.running_mean, ref.running_mean, rtol=1e-4, atol=1e-5)
    assert torch.allclose(ours.running_var, ref.running_var, rtol=1e-4, atol=1e-5)
    assert ours.num_batches_tracked.item() == ref.num_batches_tracked.item() == 2
    ours.eval(), ref.eval()  # evaluation on the running statistics
    ours.load_state_dict(ref.state_dict())  # (they differed in rounding)
    calls = _count_eval_kernel_calls(monkeypatch)
    with torch.no_grad():  # without autograd: the one-pass kernel
        assert close(ours(x), F.relu(ref(x))) and calls == [1]
    assert close(ours(x), F.relu(ref(x))) and calls == [1]  # with it: PyTorch's (the kernel has no backward)


def _count_eval_kernel_calls(monkeypatch) -> list:
    calls = []
    real = kernel_bnrelu.batch_norm_relu_eval
    monkeypatch.setattr(kernel_bnrelu, "batch_norm_relu_eval", lambda *a: calls.append(1) or real(*a))
    return calls


def _count_train_kernel_calls(monkeypatch) -> list:
    calls = []
    real = kernel_bnrelu.batch_norm_relu
    monkeypatch.setattr(kernel_bnrelu, "batch_norm_relu", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("kw", [dict(affine=False), dict(track_running_stats=False), dict(momentum=None)])
def test_batch_norm_relu_variants(kw, monkeypatch):
    """Without affine parameters, running statistics or a momentum: the kernel runs (counted:
    with affine=False no parameter needs a gradient, so the output's grad_fn cannot tell) and
    gives PyTorch's outputs, input gradients, parameter gradients and running statistics."""
    ref, ours = _bn_pair(24, **kw)
    x = torch.randn(16, 24, 4, 4).contiguous(memory_format=CL)
    calls = _count_train_kernel_calls(monkeypatch)
    for step in range(3):
        g = torch.randn(x.shape).contiguous(memory_format=CL)
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        want, got = F.relu(ref(a)), ours(b)
        assert type(got.grad_fn).__name__ == "_BatchNormReLUBackward"
        assert got.abs().sum() > 0 and torch.allclose(got, want, atol=1e-5)
        want.backward(g)
        got.backward(g)
        assert b.grad.abs().sum() > 0 and torch.allclose(b.grad, a.grad, atol=1e-5)
        if ref.affine:
            assert torch.allclose(ours.weight.grad, ref.weight.grad, atol=1e-4)
            assert torch.allclose(ours.bias.grad, ref.bias.grad, atol=1e-4)
        else:
            assert ours.weight is None and ours.bias is None
    assert len(calls) == 3
    if ref.track_running_stats:
        assert torch.allclose(ours.running_mean, ref.running_mean, atol=1e-5)
        assert torch.allclose(ours.running_var, ref.running_var, atol=1e-5)
        assert ours.num_batches_tracked.item() == 3
    else:
        assert ours.running_mean is None
    ours.eval(), ref.eval()
    calls = _count_eval_kernel_calls(monkeypatch)
    with torch.inference_mode():  # no running statistics: batch statistics, PyTorch's path
        assert torch.allclose(ours(x), F.relu(ref(x)), atol=1e-5)
    assert len(calls) == int(ref.track_running_stats)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int16])
def test_swap_batch_channels(dtype):
    x = (torch.randn(37, 21, 4, 3) * 100).to(dtype).contiguous(memory_format=CL)
    out = swap_batch_channels(x)
    assert torch.equal(out, x.transpose(0, 1)) and out.is_contiguous(memory_format=CL)
    nchw = x.contiguous()
    assert torch.equal(swap_batch_channels(nchw), nchw.transpose(0, 1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,h,w,c,k", [(384, 4, 4, 48, 3), (5, 7, 5, 37, 3), (3, 3, 3, 5, 1)])
def test_col2im_kernel_matches_the_reference_on_any_thread_count(n, h, w, c, k, dtype, monkeypatch):
    """col2im sums each pixel's shares in fp32 (the reference rounds after every add in bf16):
    the fp32 reference's values, rounded once; each thread sums in its own scratch, so one
    thread or several give the same bits."""
    from mnistflow.kernels import layout

    gc = torch.randn(n, h - k + 1, w - k + 1, k, k, c).to(dtype)
    want = layout.col2im_reference(gc.float(), h, w, k).to(dtype)
    outs = []
    for t in (1, 2, 3):
        monkeypatch.setattr(layout, "threads", lambda t=t: t)
        kernels.reset_used()
        outs.append(layout.col2im(gc, h, w, k))
        assert kernels.used()["ops"] == ["col2im"]
    assert all(torch.equal(o, outs[0]) for o in outs)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # float-sum order; one bf16 rounding
    torch.testing.assert_close(outs[0].float(), want.float(), rtol=tol, atol=tol)


def _fast_step(model, x, y, bf16: bool):
    with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        loss = F.cross_entropy(model(x).float(), y)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_a_fast_net_step_on_the_kernels_matches_one_on_pytorchs_ops(rebuilt):
    torch.manual_seed(0)
    model = create_model("fast").to(memory_format=CL)
    x = torch.randn(64, 1, 28, 28).contiguous(memory_format=CL)
    y = torch.randint(0, 10, (64,))
    kernels.reset_used()
    kern = {bf16: _fast_step(copy.deepcopy(model), x, y, bf16) for bf16 in (False, True)}
    assert any(type(m).__name__ == "BatchNormReLU2d" for m in model.modules())
    used = kernels.used()  # what summary.json records: the ops that ran on a kernel
    assert used["native"].startswith("loaded") and {"maxpool2x2", "bnrelu"} <= set(used["ops"])
    assert ("conv3x3_wgrad" in used["ops"]) == (kernels.bf16_engine() is not None)
    with torch.no_grad():
        model.eval()(x)
    assert "bnrelu_eval" in kernels.used()["ops"]
    model.train()
    rebuilt.setenv("MNISTFLOW_KERNELS", "0")
    kernels.library.cache_clear()
    kernels.reset_used()
    assert kernels.library() is None and "off" in kernels.reason()
    ref = {bf16: _fast_step(copy.deepcopy(model), x, y, bf16) for bf16 in (False, True)}
    assert kernels.used()["ops"] == []  # PyTorch's ops only
    for name, exact in ref[False].items():
        scale = exact.abs().max().item()
        # fp32: the same gradients up to the order of float sums
        assert torch.allclose(kern[False][name], exact, rtol=1e-3, atol=1e-4 * scale), name
        # bf16: both paths are as far from the fp32 gradient as bf16 rounding puts them
        err_kernel = (kern[True][name] - exact).abs().max().item() / scale
        err_torch = (ref[True][name] - exact).abs().max().item() / scale
        assert err_kernel <= 1.5 * err_torch + 0.02, (name, err_kernel, err_torch)


def test_no_compiler_means_pytorchs_ops_with_one_warning_and_nothing_half_written(rebuilt, tmp_path, capfd):
    rebuilt.setenv("MNISTFLOW_HOME", str(tmp_path))
    rebuilt.setenv("CC", "/bin/false")  # a "compiler" that always fails
    assert kernels.library() is None
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("mnistflow: warning: native kernels unavailable: ")
    assert "could not compile the kernels" in err[0]
    assert kernels.reason().startswith("unavailable")
    assert not [p for p in (tmp_path / "kernels").iterdir()]  # no partial library left behind
    x = torch.randn(4, 8, 6, 6).contiguous(memory_format=CL).requires_grad_()
    out = BatchNormReLU2d(8)(MaxPool2x2()(x))  # still works, on PyTorch's ops
    out.sum().backward()
    assert out.shape == (4, 8, 3, 3) and x.grad is not None
    rebuilt.setenv("CC", "/nonexistent/cc")
    kernels.library.cache_clear()
    capfd.readouterr()
    assert kernels.library() is None
    assert "no C compiler" in capfd.readouterr().err


# --- the weight gradient (kernels/csrc/wgrad.c): AMX tiles, or AVX-512-BF16 ------------------

def _amx():
    from mnistflow.kernels import wgrad

    if not kernels.amx_available():
        pytest.skip(f"AMX weight-gradient kernel: {kernels.amx_reason()}")
    return wgrad


def _engine(tiles: bool):
    """wgrad, when this machine has the path (AMX tiles, or the AVX-512-BF16 one); else a skip."""
    from mnistflow.kernels import wgrad
    from mnistflow.runtime.cpu import cpu_flags

    if tiles:
        return _amx()
    if kernels.library() is None or "avx512_bf16" not in cpu_flags():
        pytest.skip("AVX-512-BF16 weight-gradient kernel: no AVX-512-BF16 here, or no kernels")
    return wgrad


ENGINES = pytest.mark.parametrize("tiles", [True, False], ids=["amx", "avx512-bf16"])


@ENGINES
@pytest.mark.parametrize("n,c,o,h,w", [
    (3, 16, 32, 5, 7), (2, 4, 16, 6, 3), (1, 1, 16, 2, 2), (5, 3, 128, 9, 9), (2, 64, 256, 1, 1),
    (97, 32, 48, 7, 7),  # 4,753 pixels: several chunks, the last one partial, on every thread
    (40, 48, 96, 4, 4), (30, 4, 32, 14, 14)])
def test_weight_gradient_matches_a_float64_reference(n, c, o, h, w, tiles):
    wgrad = _engine(tiles)
    g = torch.Generator().manual_seed(n * 1000 + c)
    x = torch.randn(n, c, h, w, generator=g).to(torch.bfloat16).contiguous(memory_format=CL)
    gy = torch.randn(n, o, h, w, generator=g).to(torch.bfloat16).contiguous(memory_format=CL)
    got = wgrad._weight_grad(kernels.library(), x, gy, tiles=tiles)
    want = torch.ops.aten.convolution_backward(gy.double(), x.double(), torch.zeros(o, c, 3, 3, dtype=torch.float64),
                                               None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                               [False, True, False])[1]
    assert got.shape == (o, c, 3, 3) and got.dtype == torch.float32
    # inputs are exact in both; only the fp32 accumulation differs
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_on_a_cpu_with_avx512_bf16_and_no_amx_the_bf16_kernels_run_on_the_vector_path(monkeypatch):
    """Zen 4 and 5: no AMX, but the weight gradient and Muon's iteration are the kernels', and
    say so; without AVX-512-BF16 as well (AVX2 only), PyTorch's."""
    from mnistflow.runtime import cpu

    lib = _engine(False).library()
    monkeypatch.setattr(lib, "amx_request", lambda: 1)
    monkeypatch.setattr(kernels._state, "amx", kernels._Verdict())
    monkeypatch.setattr(kernels._state, "vector", kernels._Verdict())
    assert not kernels.amx_available() and kernels.bf16_engine() == "avx512-bf16"
    assert kernels.bf16_reason() == "native kernels, AVX-512-BF16 (no AMX)"
    assert kernels.used()["avx512_bf16"] == "loaded"
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    monkeypatch.setattr(kernels._state, "vector", kernels._Verdict())
    assert kernels.bf16_engine() is None
    assert kernels.bf16_reason() == "PyTorch's (the AVX-512-BF16 kernels: unavailable: no AVX-512-BF16)"


def test_weight_gradient_takes_only_the_shapes_it_can():
    from mnistflow.kernels import wgrad

    if kernels.bf16_engine() is None:
        pytest.skip("no weight-gradient kernel on this machine")
    x = torch.randn(2, 16, 5, 5).to(torch.bfloat16).contiguous(memory_format=CL)
    assert wgrad.supports(x, 32)
    assert not wgrad.supports(x, 40)  # out channels off the 16-wide tiles
    assert not wgrad.supports(x[:, :8].contiguous(memory_format=CL), 32)  # 8 in channels: neither path
    assert not wgrad.supports(x.float(), 32) and not wgrad.supports(x.contiguous(), 32)


@pytest.mark.parametrize("amx", ["1", "0"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("c,o,size", [(4, 32, 14), (32, 48, 7), (48, 96, 4), (48, 96, 2)])
def test_fast_conv_has_nn_conv2ds_values_and_gradients(c, o, size, autocast, amx, monkeypatch):
    """The fast net's convolutions: the kernel's weight gradient under bf16 autocast (when the CPU
    has AMX or AVX-512-BF16: MNISTFLOW_AMX=0 leaves the second), else the batch-axis one at 4x4
    and below, else nn.Conv2d; always nn.Conv2d's numbers."""
    from mnistflow.kernels import wgrad
    from mnistflow.models import fast

    monkeypatch.setenv("MNISTFLOW_AMX", amx)
    on_amx = autocast and kernels.bf16_engine() is not None
    assert not (amx == "0" and kernels.amx_available())
    calls = {"amx": 0, "batch": 0}
    weight_grad, batch_apply = wgrad._weight_grad, fast._WeightGradOverBatch.apply
    monkeypatch.setattr(wgrad, "_weight_grad", lambda *a: calls.__setitem__("amx", calls["amx"] + 1) or weight_grad(*a))
    monkeypatch.setattr(fast._WeightGradOverBatch, "apply",
                        lambda *a: calls.__setitem__("batch", calls["batch"] + 1) or batch_apply(*a))
    torch.manual_seed(0)
    conv = fast.FastConv2d(c, o, 3)
    ref = nn.Conv2d(c, o, 3, padding=1, bias=False)
    ref.weight.data.copy_(conv.weight.data)
    x0 = torch.randn(64, c, size, size).contiguous(memory_format=CL)
    g = torch.randn(64, o, size, size)
    outs = []
    for m in (conv, ref):
        x = x0.clone().requires_grad_()
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            y = m(x)
        (y.float() * g).sum().backward()
        outs.append((y.float(), x.grad, m.weight.grad))
    tol = 2e-2 if autocast else 1e-4  # bf16: the reference rounds its weight gradient to bf16
    for a, b in zip(*outs):
        assert a.dtype == b.dtype and torch.allclose(a, b, rtol=tol, atol=tol * a.abs().max().item())
    assert outs[0][2].dtype == torch.float32  # the parameter's gradient, as autocast gives it
    assert calls == {"amx": int(on_amx), "batch": int(not on_amx and size <= 4)}


@ENGINES
@pytest.mark.parametrize("n,c,o,h,w", [(30, 4, 32, 14, 14), (7, 16, 16, 7, 5), (3, 1, 48, 3, 3)])
def test_conv_max_pool_node_matches_the_two_layers(n, c, o, h, w, tiles, monkeypatch):
    """The first layer's conv + 2x2 max-pool as one node (its weight gradient straight from the
    pool's gradient and winners, odd sizes in ceil mode; on AMX the forward fused too):
    nn.Conv2d + max_pool2d's numbers."""
    wgrad = _engine(tiles)
    if not tiles:  # as on a CPU without AMX
        monkeypatch.setattr(wgrad, "amx_available", lambda: False)
    torch.manual_seed(n)
    x = torch.randn(n, c, h, w).to(torch.bfloat16).contiguous(memory_format=CL)
    w1 = torch.randn(o, c, 3, 3, requires_grad=True)
    w2 = w1.detach().clone().requires_grad_()
    out = wgrad.conv3x3_maxpool(x, w1)
    ref = F.max_pool2d(F.conv2d(x, w2.to(torch.bfloat16), padding=1), 2, ceil_mode=True)
    assert torch.equal(out, ref)  # the same convolution, and the pool is exact
    with torch.inference_mode():  # evaluation: the fused forward alone, no codes
        assert torch.equal(wgrad.conv3x3_maxpool(x, w1), ref)
    g = torch.randn(ref.shape).to(torch.bfloat16)
    out.backward(g)
    ref.backward(g)
    # the reference's gradient went through bf16 (autocast-style); the node's is fp32
    assert torch.allclose(w1.grad, w2.grad, rtol=1e-2, atol=1e-2 * w2.grad.abs().max().item())
    with pytest.raises(ValueError, match="must not need a gradient"):
        wgrad.conv3x3_maxpool(x.float().requires_grad_().to(torch.bfloat16), w1)


def test_without_amx_the_fast_net_trains_on_the_vector_kernel_or_pytorchs_gradients(monkeypatch):
    """A CPU (or OS, or compiler) without AMX: the doctor's reason says so, and a bf16 step of the
    fast net takes the AVX-512-BF16 weight gradient where the CPU has it, else oneDNN's (and Muon
    the AVX-512-BF16 Newton-Schulz kernel, else PyTorch's): the same gradients as this machine's
    own step, either way."""
    from mnistflow.runtime import cpu
    from mnistflow.training import optim

    lib = kernels.library()
    assert lib is not None, kernels.reason()
    torch.manual_seed(0)
    model = create_model("fast").to(memory_format=CL)
    x = torch.randn(64, 1, 28, 28).contiguous(memory_format=CL)
    y = torch.randint(0, 10, (64,))
    here = _fast_step(copy.deepcopy(model), x, y, bf16=True)
    monkeypatch.setattr(lib, "amx_request", lambda: 1)
    monkeypatch.setattr(kernels._state, "amx", kernels._Verdict())
    assert not kernels.amx_available()
    assert optim._muon_kernel() == (kernels.bf16_engine() == "avx512-bf16")
    assert kernels.amx_reason() == "unavailable: no AMX (this CPU, the OS or the compiler)"
    kernels.reset_used()
    vector = _fast_step(copy.deepcopy(model), x, y, bf16=True)
    assert ("conv3x3_wgrad" in kernels.used()["ops"]) == (kernels.bf16_engine() == "avx512-bf16")
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2"}))  # nor AVX-512-BF16
    monkeypatch.setattr(kernels._state, "vector", kernels._Verdict())
    assert kernels.bf16_engine() is None and not optim._muon_kernel()
    kernels.reset_used()
    plain = _fast_step(copy.deepcopy(model), x, y, bf16=True)
    assert "conv3x3_wgrad" not in kernels.used()["ops"]
    for name, g in plain.items():
        scale = g.abs().max().item()
        for other in (here, vector):
            assert torch.isfinite(g).all() and torch.allclose(other[name], g, rtol=0.05, atol=0.05 * scale), name
