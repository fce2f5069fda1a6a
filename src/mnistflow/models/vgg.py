"""A small VGG-style net: stacks of 3x3 conv + batch norm, pooling between stages."""
from __future__ import annotations

import torch.nn as nn

from mnistflow.models.registry import register_model
from mnistflow.models.spec import build_from_spec


@register_model
def vgg_small(in_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10,
              width: int = 32) -> nn.Module:
    """VGG-style: [w, w, pool, 2w, 2w, pool, 4w, pool], global average pool, fc."""
    w = width
    return build_from_spec(
        f"conv3x3x{w}-bn-relu,conv3x3x{w}-bn-relu,maxpool2,"
        f"conv3x3x{2 * w}-bn-relu,conv3x3x{2 * w}-bn-relu,maxpool2,"
        f"conv3x3x{4 * w}-bn-relu,maxpool2,gap,fc{num_classes}", in_shape, num_classes)
