"""The layer toolbox of the classic tutorial, in PyTorch terms.

conv with SAME/VALID padding and strides (TensorFlow's SAME semantics, also for strides > 1),
max/avg pooling, dropout, batch norm, relu/sigmoid/tanh, fully connected.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from mnistflow.core.errors import MnistflowError
from mnistflow.kernels import bnrelu as kernel_bnrelu
from mnistflow.kernels import pool as kernel_pool

ACTIVATIONS = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "gelu": nn.GELU,
               "identity": nn.Identity}


def _same_pad(size: int, k: int, s: int) -> tuple[int, int]:
    """TensorFlow SAME: output = ceil(size / s); extra padding goes to the end."""
    total = max((math.ceil(size / s) - 1) * s + k - size, 0)
    return total // 2, total - total // 2


class Conv2d(nn.Conv2d):
    """``nn.Conv2d`` with ``padding='same'|'valid'`` for any stride (TF semantics)."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int = 1,
                 padding: str = "same", bias: bool = True):
        if padding not in ("same", "valid"):
            raise MnistflowError(f"conv padding must be 'same' or 'valid', got '{padding}'")
        # Stride 1 SAME is symmetric for odd kernels: let the kernel pad (faster).
        native = padding == "valid" or (stride == 1 and kernel % 2 == 1)
        super().__init__(in_ch, out_ch, kernel, stride,
                         padding=(0 if padding == "valid" else kernel // 2) if native else 0,
                         bias=bias)
        self.tf_same = padding == "same" and not native

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tf_same:
            k, s = self.kernel_size[0], self.stride[0]
            ph, pw = _same_pad(x.shape[-2], k, s), _same_pad(x.shape[-1], k, s)
            x = F.pad(x, (pw[0], pw[1], ph[0], ph[1]))
        return super().forward(x)


class Dropout(nn.Module):
    """Inverted dropout, like ``nn.Dropout``, with a cheaper mask on CPUs.

    The CPU generator's cost is per 32-bit draw and ``bernoulli_``/``rand_like`` spend one per
    value. Here each draw gives four random bytes (or two 16-bit halves when ``p`` is not a
    multiple of 1/256, so ``p`` is exact to 1.5e-5): 2.2x cheaper than ``rand_like`` for a
    128x1024 bf16 batch, which was 2.2x cheaper than ``bernoulli_``. GPUs use ``rand_like``.
    """

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0 <= p < 1:
            raise MnistflowError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        return x * keep_mask(x, self.p) * (1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}"


def keep_mask(x: torch.Tensor, p: float) -> torch.Tensor:
    """A bool tensor shaped like ``x``: True with probability ``1 - p``, independently."""
    if x.device.type != "cpu":
        return torch.rand_like(x) >= p
    n = x.numel()
    byte = float(p * 256).is_integer()
    per_draw = 4 if byte else 2
    draws = torch.empty((n + per_draw - 1) // per_draw, dtype=torch.int32, device=x.device)
    draws.random_(-2 ** 31, 2 ** 31)  # all 32 bits random (plain random_() leaves the top one 0)
    if byte:
        return draws.view(torch.uint8)[:n].view(x.shape) >= int(p * 256)
    return draws.view(torch.int16)[:n].view(x.shape) >= round(p * 65536) - 32768  # signed halves


class MaxPool2x2(nn.MaxPool2d):
    """``nn.MaxPool2d(2)`` that runs on mnistflow's native kernel for channels-last bf16/fp32
    CPU tensors (``kernels.pool``: one pass each way, no index tensor, no zero-fill), and is
    PyTorch's op everywhere else (other devices, layouts, exports, no compiler)."""

    def __init__(self, ceil_mode: bool = True):
        super().__init__(2, 2, ceil_mode=ceil_mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if kernel_pool.supports(x, self.ceil_mode):
            return kernel_pool.max_pool2x2(x)
        return super().forward(x)


class BatchNormReLU2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` then ReLU, in one module. Channels-last bf16/fp32 CPU inputs run on
    mnistflow's native kernel (``kernels.bnrelu``) in training (two passes each way instead of
    PyTorch's eight) and in inference without autograd (one pass instead of two); everywhere
    else it is PyTorch's batch norm and ReLU. The parameters and buffers are batch norm's,
    under the same names."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and kernel_bnrelu.supports(x, self.weight, self.bias, self.running_mean,
                                                    self.running_var):
            momentum = self.momentum
            if self.track_running_stats:
                self.num_batches_tracked.add_(1)
                if momentum is None:  # a cumulative average, as nn.BatchNorm2d
                    momentum = 1.0 / float(self.num_batches_tracked)
            return kernel_bnrelu.batch_norm_relu(x, self.weight, self.bias, self.running_mean,
                                                 self.running_var, momentum or 0.0, self.eps)
        if (not self.training and self.running_mean is not None and not torch.is_grad_enabled()
                and kernel_bnrelu.supports(x, self.weight, self.bias, self.running_mean, self.running_var)):
            return kernel_bnrelu.batch_norm_relu_eval(x, self.weight, self.bias, self.running_mean,
                                                      self.running_var, self.eps)
        return F.relu(super().forward(x), inplace=True)


def pool(kind: str, kernel: int = 2, stride: int | None = None, padding: str = "same") -> nn.Module:
    """Max or average pooling; SAME rounds the output size up (TF semantics when k == s)."""
    stride = stride or kernel
    cls = {"max": nn.MaxPool2d, "avg": nn.AvgPool2d}.get(kind)
    if cls is None:
        raise MnistflowError(f"pool kind must be 'max' or 'avg', got '{kind}'")
    if kind == "max" and kernel == stride == 2:
        return MaxPool2x2(ceil_mode=(padding == "same"))
    return cls(kernel, stride, ceil_mode=(padding == "same"))


def activation(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise MnistflowError(f"unknown activation '{name}' (known: {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]()


def conv_block(in_ch: int, out_ch: int, kernel: int = 3, stride: int = 1, padding: str = "same",
               act: str = "relu", bn: bool = False) -> nn.Sequential:
    """conv -> [batch norm] -> activation."""
    layers = [Conv2d(in_ch, out_ch, kernel, stride, padding, bias=not bn)]
    if bn:
        layers.append(nn.BatchNorm2d(out_ch))
    layers.append(activation(act))
    return nn.Sequential(*layers)


def fc(in_features: int, out_features: int, act: str | None = None, dropout: float = 0.0) -> nn.Sequential:
    """fully connected -> [activation] -> [dropout]."""
    layers: list[nn.Module] = [nn.Linear(in_features, out_features)]
    if act:
        layers.append(activation(act))
    if dropout:
        layers.append(Dropout(dropout))
    return nn.Sequential(*layers)


def out_shape(module: nn.Module, in_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Output shape (without batch) of a layer ``_build`` makes, for one input of ``in_shape``,
    by PyTorch's size rules, without running it: a model planned on the ``meta`` device would
    otherwise import PyTorch's compiler stack (~2 s) for its meta kernels. Raises RuntimeError,
    as running the layer would, when the input is too small for it."""
    if isinstance(module, nn.Conv2d):
        (k, _), (s, _), (p, _) = module.kernel_size, module.stride, module.padding
        if getattr(module, "tf_same", False):
            sizes = [math.ceil(n / s) for n in in_shape[1:]]
        else:
            sizes = [_window_count(n + 2 * p, k, s, ceil=False) for n in in_shape[1:]]
        return (module.out_channels, *sizes)
    if isinstance(module, (nn.MaxPool2d, nn.AvgPool2d)):
        k, s = _int(module.kernel_size), _int(module.stride)
        return (in_shape[0], *(_window_count(n, k, s, ceil=module.ceil_mode) for n in in_shape[1:]))
    if isinstance(module, nn.AdaptiveAvgPool2d):
        return (in_shape[0], 1, 1)
    if isinstance(module, nn.Flatten):
        return (math.prod(in_shape),)
    if isinstance(module, nn.Linear):
        if in_shape != (module.in_features,):
            raise RuntimeError(f"a linear layer of {module.in_features} inputs cannot take {in_shape}")
        return (module.out_features,)
    if isinstance(module, (Dropout, nn.BatchNorm1d, nn.BatchNorm2d, *ACTIVATIONS.values())):
        return tuple(in_shape)
    raise TypeError(f"no size rule for {type(module).__name__}")


def _int(v: int | tuple[int, ...]) -> int:
    return v if isinstance(v, int) else v[0]


def _window_count(n: int, k: int, s: int, *, ceil: bool) -> int:
    """Windows of ``k`` at stride ``s`` over ``n`` values (PyTorch's rule: with ``ceil``, a last
    partial window counts if it starts inside the input)."""
    count = (n - k + (s - 1 if ceil else 0)) // s + 1
    if ceil and (count - 1) * s >= n:
        count -= 1
    if count < 1:
        raise RuntimeError(f"Output size is too small: a window of {k} over {n} values")
    return count
