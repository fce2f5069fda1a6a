"""The net behind the time-to-accuracy recipe: few, cheap layers that bf16 + channels_last
run well on a CPU, batch norm for large learning rates, and a scaled linear head."""
from __future__ import annotations

import torch
import torch.nn as nn

from .layers import Conv2d
from .registry import register_model


class FastNet(nn.Module):
    def __init__(self, in_ch: int, num_classes: int, widths=(24, 48, 96), head_scale: float = 1 / 8):
        super().__init__()
        layers, ch = [], in_ch
        for w in widths:
            layers += [Conv2d(ch, w, 3, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
                       nn.MaxPool2d(2, ceil_mode=True)]
            ch = w
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(ch, num_classes, bias=False)
        self.head_scale = head_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = torch.amax(x, dim=(2, 3))  # global max pool
        return self.head(x) * self.head_scale


@register_model
def fast(in_shape=(1, 28, 28), num_classes: int = 10, widths=(24, 48, 96)) -> nn.Module:
    """Three conv-BN-ReLU-pool stages (24/48/96), global max pool, scaled linear head."""
    return FastNet(in_shape[0], num_classes, tuple(widths))
