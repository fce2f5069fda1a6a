"""A module of your own models, imported by examples/custom_callback.py (not run on its own).

A run of one of these records its import path, ``my_models:TinyCNN``, and its arguments; later
commands (``mnistflow eval/predict/export/serve/report RUN``) rebuild the model from them, so
they must be able to import this module too: ``PYTHONPATH=examples mnistflow eval RUN``.
"""
import torch
import torch.nn as nn


class TinyCNN(nn.Module):
    """Two conv-BN-ReLU-pool blocks and a linear classifier (about 10k parameters at width 16).

    ``in_shape`` and ``num_classes`` are filled in from the data by ``mnistflow.train``."""

    def __init__(self, width: int = 16, in_shape=(1, 28, 28), num_classes: int = 10):
        super().__init__()
        c, h, w = in_shape
        self.features = nn.Sequential(
            nn.Conv2d(c, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(2 * width * (h // 4) * (w // 4), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))
