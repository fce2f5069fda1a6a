"""A small ResNet for 28x28 / 32x32 images (three stages of basic blocks)."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from mnistflow.models.layers import Conv2d
from mnistflow.models.registry import register_model


class BasicBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int = 1):
        super().__init__()
        self.conv1 = Conv2d(in_ch, out_ch, 3, stride, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = Conv2d(out_ch, out_ch, 3, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut = (nn.Sequential(Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch))
                         if stride != 1 or in_ch != out_ch else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, in_ch: int, num_classes: int, widths=(32, 64, 128), blocks=(2, 2, 2)):
        super().__init__()
        self.stem = nn.Sequential(Conv2d(in_ch, widths[0], 3, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        stages, ch = [], widths[0]
        for i, (w, n) in enumerate(zip(widths, blocks)):
            for j in range(n):
                stages.append(BasicBlock(ch, w, stride=2 if (i > 0 and j == 0) else 1))
                ch = w
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@register_model
def resnet_small(in_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10,
                 widths: Sequence[int] = (32, 64, 128), blocks: Sequence[int] = (2, 2, 2)) -> nn.Module:
    """ResNet with three stages of basic blocks (32/64/128 channels), global pool, fc."""
    return ResNet(in_shape[0], num_classes, tuple(widths), tuple(blocks))
