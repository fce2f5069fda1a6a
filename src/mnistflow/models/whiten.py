"""Whitening initialisation of a model's first convolution (``--whiten``).

The first convolution's filters are set to the principal directions of its input patches,
each scaled by 1/sqrt(its variance), and their negations (so that a ReLU passes both signs),
as the airbench CIFAR-10 speed records do. The layer then starts out decorrelating its input,
and training gets further in its first hundred steps: with Nesterov SGD, 0.9 of an
epoch with whitening scores as well as a whole epoch without (mean of 8 seeds, BENCHMARKS.md).

The patches are taken at the convolution's own input (after any fixed reshaping such as the
fast net's space-to-depth), captured by a forward pre-hook that stops the forward there.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from mnistflow.core.errors import MnistflowError
from mnistflow.models.patch_conv import windows


class _Captured(Exception):
    pass


def first_conv(model: nn.Module, model_name: str = "this model") -> tuple[str, nn.Conv2d]:
    """The first ``nn.Conv2d`` in registration order (the first one data meets in the
    sequential models registered here), with its name; an error when ``--whiten`` cannot use it."""
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Conv2d):
            if mod.groups != 1:
                raise MnistflowError(f"--whiten: the first convolution of {model_name} ({name}) is "
                                     "grouped; it needs a plain one")
            return name, mod
    raise MnistflowError(f"--whiten needs a model with a convolution; {model_name} has none")


def _padding(conv: nn.Conv2d) -> tuple[int, int]:
    if conv.padding == "valid":
        return 0, 0
    if conv.padding == "same":  # odd kernels: symmetric; the statistics hardly differ otherwise
        return tuple(d * (k - 1) // 2 for k, d in zip(conv.kernel_size, conv.dilation))
    return tuple(conv.padding)


def patches(x: torch.Tensor, kernel: tuple[int, int], dilation: tuple[int, int], padding: tuple[int, int],
            stride: tuple[int, int]) -> torch.Tensor:
    """``F.unfold(x, kernel, dilation, padding, stride)``, (N, C * kh * kw, L), the same values:
    the windows' strided view of the padded input copied once (PyTorch's im2col took 17 ms for
    the fast recipe's 1,000 whitening images, this 6 ms; both inside the timed run)."""
    xp = F.pad(x, (padding[1], padding[1], padding[0], padding[0]))
    v = windows(xp, kernel, dilation, stride)  # (N, C, KH, KW, OH, OW)
    n, c, kh, kw, oh, ow = v.shape
    return v.reshape(n, c * kh * kw, oh * ow)


@torch.no_grad()
def whiten_first_conv(model: nn.Module, images: torch.Tensor, eps: float = 1e-2) -> str:
    """Initialise ``model``'s first convolution from the patches it sees in ``images``
    (normalized, N x C x H x W); returns a one-line description of what was set.

    ``eps`` is added to every variance (inputs are standardized, so it is in those units):
    it keeps the many near-empty directions of MNIST's black borders from being blown up.
    """
    name, conv = first_conv(model)
    seen: dict[str, torch.Tensor] = {}

    def grab(_mod, args):
        seen["x"] = args[0]
        raise _Captured  # the rest of the forward is not needed

    handle = conv.register_forward_pre_hook(grab)
    was_training = model.training
    model.eval()
    try:
        model(images)
    except _Captured:
        pass
    finally:
        handle.remove()
        model.train(was_training)
    x = seen["x"]
    x = x.to(torch.promote_types(x.dtype, torch.float32))  # bf16/fp16 inputs: in float32
    cols = patches(x, conv.kernel_size, conv.dilation, _padding(conv), conv.stride)  # (N, D, L)
    d = cols.shape[1]
    n = cols.shape[0] * cols.shape[2]  # patches
    # sums per image in float32 (the second moments in one batched matmul), over images in float64
    mean = cols.sum(2).sum(0, dtype=torch.float64) / n
    cov = torch.bmm(cols, cols.transpose(1, 2)).sum(0, dtype=torch.float64) / n - torch.outer(mean, mean)
    var, vecs = torch.linalg.eigh(cov)  # ascending
    var, vecs = var.flip(0), vecs.flip(1)
    k = min((conv.out_channels + 1) // 2, d)
    w = (vecs[:, :k] / (var[:k].clamp(min=0) + eps).sqrt()).T  # (k, D)
    filters = torch.cat([w, -w])[:conv.out_channels]
    k = len(filters)
    conv.weight[:k] = filters.view(k, *conv.weight.shape[1:]).to(conv.weight)
    if conv.bias is not None:
        conv.bias[:k] = -(filters @ mean).to(conv.bias)  # centre the patches
    return (f"whitened {name or 'the first convolution'}: {len(filters)} of {conv.out_channels} "
            f"filters from {n:,} patches of {d} values")
