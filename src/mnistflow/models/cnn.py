"""Classic convolutional nets: the tutorial's deep CNN and LeNet-5."""
from __future__ import annotations

import torch.nn as nn

from mnistflow.models.registry import register_model
from mnistflow.models.spec import build_from_spec


@register_model
def seed_cnn(in_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10) -> nn.Module:
    """The tutorial's deep CNN: conv5x5-32, pool, conv5x5-64, pool, fc1024, dropout, fc (~99.2%)."""
    return build_from_spec("conv5x5x32-relu,maxpool2,conv5x5x64-relu,maxpool2,"
                           f"fc1024-relu,dropout0.5,fc{num_classes}", in_shape, num_classes)


@register_model
def lenet5(in_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10) -> nn.Module:
    """LeNet-5 (tanh, average pooling); the first conv pads 28x28 inputs to LeNet's 32x32 geometry."""
    pad = "same" if in_shape[1] < 32 else "valid"
    return build_from_spec(f"conv5x5x6-{pad}-tanh,avgpool2,conv5x5x16-valid-tanh,avgpool2,"
                           f"fc120-tanh,fc84-tanh,fc{num_classes}", in_shape, num_classes)
