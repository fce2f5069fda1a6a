"""Input normalization, in one place: uint8 images -> the float batch a model takes.

Records keep images as uint8 (N, H, W, C); a model takes float (N, C, H, W) with each channel
shifted by the training split's mean and scaled by its std (both in 0..255 units, from the
records' ``meta.json``). The loaders, ``predict``, ``export`` (its check on real images) and
``serve`` all normalize through this module, so a model sees the same numbers everywhere:

    x = normalize(images_u8, rec.mean, rec.std, device)      # torch, (N, C, H, W)
    x = normalize_np(images_u8, info.mean, info.std)         # numpy float32, for ONNX Runtime

The arithmetic is ``(x - mean) * (1 / std)`` in float32 (a multiply, not a divide: the
training loaders' hot loop), and the numpy twin does the very same float32 operations.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from mnistflow.core.errors import MnistflowError


def _channels(images_shape: tuple[int, ...], layout: str) -> int:
    if layout not in ("NHWC", "NCHW"):
        raise ValueError(f"layout must be 'NHWC' or 'NCHW', not {layout!r}")
    if len(images_shape) != 4:
        raise MnistflowError(f"expected a batch of images (N, H, W, C), got shape {tuple(images_shape)}")
    return images_shape[3] if layout == "NHWC" else images_shape[1]


class Normalizer:
    """Per-channel ``mean``/``std`` held on ``device``; ``normalizer(x)`` normalizes a float
    (N, C, H, W) batch in place and returns it."""

    def __init__(self, mean: Sequence[float], std: Sequence[float],
                 device: torch.device | str = "cpu") -> None:
        c = len(mean)
        if len(std) != c:
            raise MnistflowError(f"{c} channel means but {len(std)} stds")
        self.channels = c
        self.mean = torch.tensor(mean, dtype=torch.float32, device=device).view(1, c, 1, 1)
        self.inv_std = 1.0 / torch.tensor(std, dtype=torch.float32, device=device).view(1, c, 1, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != self.channels:
            raise MnistflowError(f"images have {x.shape[1]} channel(s), the normalization "
                                 f"{self.channels}")
        return x.sub_(self.mean).mul_(self.inv_std)


def normalize(images: np.ndarray | torch.Tensor, mean: Sequence[float], std: Sequence[float],
              device: torch.device | str = "cpu", *, channels_last: bool = False,
              dtype: torch.dtype = torch.float32, layout: str = "NHWC") -> torch.Tensor:
    """uint8 images (N, H, W, C), or (N, C, H, W) with ``layout="NCHW"``, as the normalized
    batch (N, C, H, W) on ``device``, in ``dtype`` and the requested memory format."""
    _channels(tuple(images.shape), layout)
    if isinstance(images, np.ndarray):
        images = torch.from_numpy(np.array(images))  # a copy: memory maps are read-only
    x = images.to(device)
    if layout == "NHWC":
        x = x.permute(0, 3, 1, 2)
    x = Normalizer(mean, std, x.device)(x.to(torch.float32, copy=True))  # never the caller's tensor
    x = x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    return x if dtype == torch.float32 else x.to(dtype)


def normalize_np(images: np.ndarray, mean: Sequence[float], std: Sequence[float], *,
                 layout: str = "NHWC") -> np.ndarray:
    """The numpy twin of :func:`normalize` (float32, (N, C, H, W), C-contiguous): the input of
    an ONNX export, bit for bit what the torch path gives."""
    c = _channels(tuple(images.shape), layout)
    x = np.asarray(images)
    if layout == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    m = np.asarray(mean, np.float32).reshape(1, c, 1, 1)
    inv = (np.float32(1.0) / np.asarray(std, np.float32)).reshape(1, c, 1, 1)
    return np.ascontiguousarray((x.astype(np.float32) - m) * inv)
