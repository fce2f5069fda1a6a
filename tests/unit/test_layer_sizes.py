"""``layers.out_shape`` gives the layer-spec builder each layer's output size by PyTorch's rules,
without running the layer. Checked here against running it: every layer kind the spec language
makes, over input sizes and strides that exercise SAME/VALID, ceil-mode pooling and the sizes a
layer refuses."""
from __future__ import annotations

import itertools

import pytest
import torch

from mnistflow.models.layers import out_shape
from mnistflow.models.spec import _layer, build_from_spec

TOKENS = ["conv3x3x4", "conv4x4x4", "conv5x5x2-valid", "conv3x3x4-s2", "conv4x4x3-s2",
          "conv5x5x2-s3-valid", "conv2x2x2-s2-same", "maxpool2", "maxpool3", "maxpool2-valid",
          "maxpool3s2", "avgpool2", "avgpool3s2-valid", "avgpool5", "gap", "bn", "relu", "dropout0.5",
          "flatten", "fc7", "tanh"]


def ran(layer: torch.nn.Module, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The output shape from running ``layer`` on zeros (None: the input is too small for it)."""
    layer.eval()
    try:
        with torch.no_grad():
            return tuple(layer(torch.zeros(1, *shape)).shape[1:])
    except RuntimeError:
        return None


def computed(layer: torch.nn.Module, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return out_shape(layer, shape)
    except RuntimeError:
        return None


@pytest.mark.parametrize("token", TOKENS)
def test_every_layer_kind_has_the_size_running_it_gives(token):
    checked = 0
    for c, h, w in itertools.product((1, 3), range(1, 12), (1, 2, 7, 28)):
        shape = (c, h, w)
        for _, layer in _layer(token, shape, token):
            assert computed(layer, shape) == ran(layer, shape), (token, shape)
            checked += 1
            if (got := ran(layer, shape)) is None:
                break
            shape = got
    assert checked >= 88


def test_a_spec_too_deep_for_its_input_is_refused_as_before():
    from mnistflow.core.errors import MnistflowError

    with pytest.raises(MnistflowError, match="does not fit input"):
        build_from_spec("conv5x5x4-valid,fc10", (1, 3, 3), 10)
    model = build_from_spec("conv5x5x8,maxpool2,conv3x3x4-s2,maxpool3s2,fc10", (1, 28, 28), 10)
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_an_unknown_layer_has_no_size_rule():
    with pytest.raises(TypeError, match="no size rule"):
        out_shape(torch.nn.Upsample(scale_factor=2), (1, 4, 4))
