"""The one input normalization: torch and numpy give the same numbers the loaders give."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.synthetic import digits
from mnistflow.core.errors import MnistflowError
from mnistflow.data.normalize import normalize, normalize_np


def test_normalize_is_per_channel_mean_and_std():
    x = np.random.default_rng(0).integers(0, 256, (4, 5, 6, 3), dtype=np.uint8)
    mean, std = [10.0, 100.0, 200.0], [2.0, 50.0, 64.0]
    out = normalize(x, mean, std)
    assert out.shape == (4, 3, 5, 6) and out.dtype == torch.float32 and out.is_contiguous()
    want = (x.astype(np.float64) - mean) / std
    assert np.allclose(out.numpy(), want.transpose(0, 3, 1, 2), atol=1e-5)
    cl = normalize(x, mean, std, channels_last=True, dtype=torch.bfloat16)
    assert cl.dtype == torch.bfloat16 and cl.is_contiguous(memory_format=torch.channels_last)
    nchw = normalize(torch.from_numpy(x).permute(0, 3, 1, 2), mean, std, layout="NCHW")
    assert torch.equal(nchw, out)


def test_numpy_twin_is_bit_for_bit_the_torch_path():
    x, _ = digits(64, seed=3)
    mean, std = [33.3], [78.6]
    a = normalize_np(x, mean, std)
    assert a.dtype == np.float32 and a.flags.c_contiguous and a.shape == (64, 1, 28, 28)
    assert np.array_equal(a, normalize(x, mean, std).numpy())


def test_the_loader_batch_is_normalize(synthetic_records):
    from mnistflow.data.loader import make_loader
    from mnistflow.data.records import open_records

    rec = open_records(synthetic_records)
    L = make_loader(rec, "val", batch_size=100, train=False)
    (xb, _), = list(L)
    assert torch.equal(xb, normalize(rec.split("val")[0], rec.mean, rec.std))


def test_a_float_tensor_given_is_not_changed_in_place():
    t = torch.full((1, 1, 2, 2), 5.0)
    normalize(t, [1.0], [2.0], layout="NCHW")
    assert torch.equal(t, torch.full((1, 1, 2, 2), 5.0))


def test_shape_mistakes_are_clear_errors():
    with pytest.raises(MnistflowError, match=r"\(N, H, W, C\)"):
        normalize(np.zeros((28, 28), np.uint8), [0.0], [1.0])
    with pytest.raises(MnistflowError, match="3 channel"):
        normalize(np.zeros((1, 4, 4, 3), np.uint8), [0.0], [1.0])
