"""A user's own models, in an importable module (``helpers.custom_models``), for the public API.

Later verbs (eval, predict, serve) rebuild a model from its recorded import path, so these
live at module level; the CLI finds them with ``PYTHONPATH=tests``.
"""
from __future__ import annotations

import torch
import torch.nn as nn


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
