"""The net behind the time-to-accuracy recipe, shaped by profiles of a CPU training step.

* Space-to-depth input (28x28x1 -> 14x14x4, one cheap copy): no activation ever lives at
  full resolution, where batch norm, ReLU and pooling cost more than the convolutions.
* conv -> max-pool -> batch norm -> ReLU: normalizing after the pool does 4x less
  elementwise work (in the first version, conv-BN-ReLU-pool at 28x28, batch norm's backward
  alone was 22% of a step; here convolutions dominate, as they should).
* Max-pool over strided convs: oneDNN's strided convolution backward was 2x slower here.
* The last stage (``fast``) is a VALID 3x3 convolution to 192 channels, without a pool: on
  MNIST it maps the 4x4 map straight to the 2x2 the pool gave, runs as one matrix product
  (``PatchConv2d``; oneDNN ran the 4x4 SAME convolution at ~190 GMAC/s), and with twice the
  channels reaches in 0.45 epoch the accuracy the 96-channel SAME stage reached in 0.55
  (seeds 0-63: mean 99.10% vs 99.08%). ``fast-wide`` keeps the SAME stage.
* Global max pool and a scaled linear head (as in the airbench recipes) for large learning rates.
* 32 channels in the first stage, not 24: the same step time (32 fills the bf16 vectors of the
  channels-last batch norm and pooling kernels; 24 left them on slower paths) and a better
  worst seed (99.11% vs 99.06% test on 3 seeds).
* The convolutions take their weight gradient from mnistflow's kernel on CPUs that have AMX or
  AVX-512-BF16 (``kernels.wgrad``), else (at 4x4 and below) as a convolution over the batch
  axis (``FastConv2d``): oneDNN's own ran 2-4x slower than the forward at these sizes on AMX
  CPUs, 1.5-2.2x on a Zen 4.
* Max-pooling and batch norm + ReLU run on mnistflow's native kernels on CPUs
  (``layers.MaxPool2x2``, ``layers.BatchNormReLU2d``): PyTorch's max-pool was ~20% of the
  step at the first stage.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from mnistflow.kernels import wgrad
from mnistflow.kernels.layout import swap_batch_channels
from mnistflow.models.layers import BatchNormReLU2d, MaxPool2x2
from mnistflow.models.patch_conv import PatchConv2d
from mnistflow.models.registry import register_model


class _WeightGradOverBatch(torch.autograd.Function):
    """``conv2d(x, w, padding=p)`` whose weight gradient is itself a forward convolution.

    dW[o, c, i, j] = sum over n, y, x of g[n, o, y, x] * x_pad[n, c, y + i, x + j]: a
    convolution of the inputs, batch as channels (C, N, H, W), with the output gradients as
    the kernel (O, N, H, W), at padding p. On a 4x4 map oneDNN's bf16 backward-weights kernel
    ran 3-4x slower than a forward convolution of the same FLOPs; this form runs at forward
    speed (a ``fast-wide`` step 28.3 -> 23.3 ms, ``fast`` 8.8 -> 8.4 ms, 2 threads; slower
    than oneDNN's on the 7x7 and 14x14 maps, so used at 4x4 and below only).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, padding: int) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.padding = padding
        return F.conv2d(x, w, padding=padding)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, w = ctx.saved_tensors
        p = ctx.padding
        gx = None
        if ctx.needs_input_grad[0]:
            gx = torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [p, p], [1, 1], False,
                                                     [0, 0], 1, [True, False, False])[0]
        gw = F.conv2d(swap_batch_channels(x), swap_batch_channels(g), padding=p).transpose(0, 1)
        return gx, gw, None


class FastConv2d(nn.Conv2d):
    """A stride-1, odd-kernel, SAME, bias-free ``nn.Conv2d`` with a faster weight gradient
    when training on CPUs:

    * 3x3 under bf16 autocast on a CPU with AMX or AVX-512-BF16: the native kernel's
      (``kernels.wgrad``; oneDNN's took 1.5-4x the forward's time at these sizes);
    * otherwise, on maps of at most 4x4: a convolution over the batch axis
      (``_WeightGradOverBatch``).

    Elsewhere, and outside training, it is ``nn.Conv2d``.
    """

    def __init__(self, in_ch: int, out_ch: int, kernel: int):
        if kernel % 2 == 0:
            raise ValueError(f"FastConv2d needs an odd kernel, got {kernel}")
        super().__init__(in_ch, out_ch, kernel, padding=kernel // 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (torch.jit.is_tracing() or x.device.type != "cpu" or not torch.is_grad_enabled()
                or not self.weight.requires_grad):
            return super().forward(x)
        xb = self._kernel_input(x)
        if xb is not None:
            with torch.autocast("cpu", enabled=False):
                return wgrad.conv3x3(xb, self.weight)  # fp32 weight in, fp32 gradient out
        if x.shape[-1] * x.shape[-2] > 16:
            return super().forward(x)
        w = self.weight
        if torch.is_autocast_enabled("cpu"):  # autocast's own casts (its grad flows back to fp32)
            dt = torch.get_autocast_dtype("cpu")
            x, w = x.to(dt), w.to(dt)
        with torch.autocast("cpu", enabled=False):
            return _WeightGradOverBatch.apply(x, w, self.padding[0])

    def forward_pooled(self, x: torch.Tensor, pool: MaxPool2x2) -> torch.Tensor:
        """``pool(self(x))``; for an input that needs no gradient (the first layer), under bf16
        autocast, with the weight-gradient kernel: one node (``kernels.wgrad.conv3x3_maxpool``)
        that, in training, takes the weight gradient straight from the pool's (and on AMX pools
        the convolution on the fly)."""
        xb = self._kernel_input(x) if not x.requires_grad and pool.ceil_mode else None
        if xb is not None:
            with torch.autocast("cpu", enabled=False):
                return wgrad.conv3x3_maxpool(xb, self.weight)
        return pool(self(x))

    def _kernel_input(self, x: torch.Tensor) -> torch.Tensor | None:
        """``x`` cast to bf16 (as autocast would) when this 3x3 convolution can take the
        weight-gradient kernel: on a CPU, under bf16 autocast, outside tracing, a shape it
        takes; else None."""
        if (self.kernel_size != (3, 3) or x.device.type != "cpu" or torch.jit.is_tracing()
                or not torch.is_autocast_enabled("cpu") or torch.get_autocast_dtype("cpu") != torch.bfloat16):
            return None
        xb = x.to(torch.bfloat16)
        return xb if wgrad.supports(xb, self.out_channels) else None


_WORD = {1: torch.int16, 2: torch.int32, 4: torch.int64}  # the integer twice an element's size


def space_to_depth(x: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) -> (N, 4C, H/2, W/2), channels-last, channel order (row, column, channel) of
    each 2x2 block as in TensorFlow's ``space_to_depth`` (for C = 1 the same as
    ``F.pixel_unshuffle``). Under autocast the input is cast first (the convolution would
    cast it anyway), so the copy moves half the bytes.

    One copy: a horizontal pixel pair's channels are moved as single integers twice the
    element size (the copy kernel is per element: ``pixel_unshuffle`` plus the channels-last
    copy took 0.36 ms on a 256-image batch, this 0.07 ms). Inputs that need a gradient, and
    exports, take the plain path (integer views have neither a gradient nor an ONNX op).
    """
    n, c, h, w = x.shape
    if torch.is_autocast_enabled(x.device.type):
        x = x.to(torch.get_autocast_dtype(x.device.type))  # the conv would cast it anyway
    v = x.permute(0, 2, 3, 1).contiguous().view(n, h, w // 2, 2 * c)  # NHWC: a pixel pair per row
    plain = x.requires_grad or torch.jit.is_tracing() or torch.compiler.is_compiling()
    word = None if plain else _WORD.get(x.element_size())  # exporters have no dtype views
    if word is not None:
        v = v.view(word)  # (n, h, w/2, c): a pixel pair's channel as one integer
    k = v.shape[-1]
    v = v.view(n, h // 2, 2, w // 2, k).permute(0, 1, 3, 2, 4).contiguous()  # (n, h/2, w/2, row, pair)
    if word is not None:
        v = v.view(x.dtype)
    return v.view(n, h // 2, w // 2, 4 * c).permute(0, 3, 1, 2)


class FastNet(nn.Module):
    """Conv-pool-BN-ReLU stages on a space-to-depth input, global max pool, scaled head.

    ``valid_last``: the last stage is a VALID 3x3 convolution without a pool (``PatchConv2d``;
    on MNIST 4x4 -> 2x2, the map the pool would have given), when its input map is at least
    3x3; else a stage like the others. ``deep``: each stage has a second 3x3 conv-BN-ReLU at its
    own width after the pool (as airbench's blocks).
    """

    def __init__(self, in_shape=(1, 28, 28), num_classes: int = 10, widths=(32, 48, 96),
                 head_scale: float = 1 / 8, valid_last: bool = False, deep: bool = False):
        super().__init__()
        c, h, w = in_shape
        self.s2d = h % 2 == 0 and w % 2 == 0
        ch = c * 4 if self.s2d else c
        h, w = (h // 2, w // 2) if self.s2d else (h, w)
        layers = []
        for i, width in enumerate(widths):
            if valid_last and i == len(widths) - 1 and min(h, w) >= 3:
                layers += [PatchConv2d(ch, width, 3), BatchNormReLU2d(width)]
            else:
                layers += [FastConv2d(ch, width, 3), MaxPool2x2(ceil_mode=True), BatchNormReLU2d(width)]
                h, w = -(-h // 2), -(-w // 2)
                if deep:
                    layers += [FastConv2d(width, width, 3), BatchNormReLU2d(width)]
            ch = width
        self.features = nn.Sequential(*layers)
        self.last_pool = MaxPool2x2()
        self.head = nn.Linear(ch, num_classes, bias=False)
        self.head_scale = head_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.s2d:
            x = space_to_depth(x)  # (N, C, H, W) -> (N, 4C, H/2, W/2)
        conv, pool = self.features[0], self.features[1]
        x = conv.forward_pooled(x, pool)  # the first conv and its pool (one node under bf16 autocast)
        for i in range(2, len(self.features)):
            x = self.features[i](x)
        if not torch.jit.is_tracing() and x.shape[-2:] == (2, 2):  # MNIST, CIFAR: the max-pool kernel
            x = self.last_pool(x).flatten(1)
        else:  # (amax's backward is an equality mask and a division: 3 passes)
            x = torch.amax(x, dim=(2, 3))  # global max pool
        return self.head(x) * self.head_scale


@register_model
def fast(in_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10,
         widths: Sequence[int] = (32, 48, 192)) -> nn.Module:
    """Space-to-depth, two conv-pool-BN-ReLU stages (32/48), a VALID conv-BN-ReLU (192), global
    max pool, scaled head."""
    return FastNet(tuple(in_shape), num_classes, tuple(widths), valid_last=True)


@register_model
def fast_wide(in_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10) -> nn.Module:
    """The fast net at 64/128/256 channels: the base of the most accurate recipe."""
    return FastNet(tuple(in_shape), num_classes, (64, 128, 256))


@register_model
def fast_deep(in_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10) -> nn.Module:
    """The wide fast net with a second conv per stage: the base of ``best`` on clothing and photos."""
    return FastNet(tuple(in_shape), num_classes, (64, 128, 256), deep=True)
