"""A user's own models, in an importable module (``helpers.custom_models``), for the public API.

Later verbs (eval, predict, serve) rebuild a model from its recorded import path, so these
live at module level; the CLI finds them with ``PYTHONPATH=tests``.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyNet(nn.Module):
    """A small CNN: conv -> pool -> linear. ``width`` changes the parameter shapes."""

    def __init__(self, width: int = 8, num_classes: int = 10, in_shape=(1, 28, 28)):
        super().__init__()
        c, h, w = in_shape
        self.conv = nn.Conv2d(c, width, 3, padding=1)
        self.pool = nn.MaxPool2d(4)
        self.fc = nn.Linear(width * (h // 4) * (w // 4), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(torch.relu(self.conv(x))).flatten(1))


class ConfiguredNet(TinyNet):
    """Records its own constructor arguments, Keras style (``get_config``)."""

    def __init__(self, width: int = 8):
        super().__init__(width)
        self.width = width

    def get_config(self) -> dict:
        return {"width": self.width}


class KwargsNet(TinyNet):
    """Records its own constructor arguments as ``init_kwargs``."""

    def __init__(self, width: int = 8):
        super().__init__(width)
        self.init_kwargs = {"width": width}


class NeedsWidth(TinyNet):
    """A required constructor argument that the instance does not record."""

    def __init__(self, width: int):
        super().__init__(width)


def tiny_net(width: int = 8, in_shape=(1, 28, 28), num_classes: int = 10) -> nn.Module:
    """A factory function, mnistflow's convention (``in_shape``, ``num_classes``)."""
    return TinyNet(width, num_classes, in_shape)


def flat_only(hidden: int = 16) -> nn.Module:
    """A model that expects flat (N, 784) vectors: it cannot take (N, 1, 28, 28) images."""
    return nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, 10))


class ValueBranchNet(TinyNet):
    """Control flow on the values of a tensor (which branch depends on the image): eager
    PyTorch runs it, torch.export cannot trace it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        if logits.sum() > 0:
            return logits
        return 2 * logits


class SortNet(TinyNet):
    """Sorts its logits: an operation the exported web page cannot run (``artifacts.web``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sort(super().forward(x), dim=1).values


class Everything(nn.Module):
    """A user's forward calling the functional operations the exported web page runs
    (``artifacts.web``), between leaf modules; a 28x28 grey input."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding="same", dilation=2, groups=2)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.GELU()
        self.drop = nn.Dropout(0.3)
        self.conv2 = nn.Conv2d(16, 8, 2, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm1d(32)
        self.w = nn.Parameter(torch.randn(32, 10) / 5)
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        x = F.pixel_unshuffle(x, 2)                                                # (4, 14, 14)
        y = self.drop(self.act(self.bn(self.conv(x))))
        y = torch.cat([y, F.leaky_relu(y, 0.2) + 1 - torch.maximum(y * 0.5, -y)], 1)  # (16, 14, 14)
        y = F.silu(self.conv2(F.pad(y, (1, 0, 0, 1), value=0.25)))                # (8, 8, 8)
        a = F.avg_pool2d(y, 3, 2, 1, ceil_mode=True, count_include_pad=False)     # (8, 5, 5)
        b = F.adaptive_max_pool2d(F.elu(y), 2) - F.adaptive_avg_pool2d(F.relu6(y), 2)
        z = torch.stack([F.adaptive_avg_pool2d(a, 2), b], 2)                      # (8, 2, 2, 2)
        z = z.transpose(1, 2).flatten(2).mean(1)                                  # (32,)
        z = self.bn1(z.unsqueeze(-1)).squeeze(-1)
        logits = z @ self.w * self.scale
        return (torch.log_softmax(torch.sigmoid(logits) / 2 + torch.tanh(logits), 1)
                + logits.abs().sqrt() * 0.1 + F.hardtanh(logits, -0.5, 0.5) - 2 / (3 + logits.exp()))
