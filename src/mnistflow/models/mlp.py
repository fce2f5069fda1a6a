"""Fully connected models: the tutorial's softmax regression, and a small MLP."""
from __future__ import annotations

import torch.nn as nn

from mnistflow.models.registry import register_model
from mnistflow.models.spec import build_from_spec


@register_model
def softmax(in_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10) -> nn.Module:
    """Softmax regression y = softmax(Wx + b), 784 -> 10 on MNIST (~92%)."""
    return build_from_spec(f"fc{num_classes}", in_shape, num_classes)


@register_model
def mlp(in_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10, hidden: int = 512) -> nn.Module:
    """Two hidden ReLU layers of 512 with dropout (~98.3%)."""
    return build_from_spec(f"fc{hidden}-relu,dropout0.2,fc{hidden}-relu,dropout0.2,fc{num_classes}",
                           in_shape, num_classes)
