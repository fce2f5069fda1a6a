"""The device and precision a run uses: CPU / CUDA / MPS, bf16 / fp16 / fp32 autocast, and a
cap on the GPU's memory.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from mnistflow.core.errors import MnistflowError
from mnistflow.core.log import warn
from mnistflow.runtime.cpu import cpu_has_fast_bf16


def limit_gpu_memory(fraction: float | None, device: torch.device) -> None:
    """Cap this process's share of the GPU's memory (an allocation beyond it raises
    out-of-memory). PyTorch's caching allocator already takes GPU memory only as needed."""
    if fraction is None:
        return
    if device.type != "cuda":
        warn(f"--gpu-memory-fraction applies to CUDA GPUs; ignored on {device.type}")
        return
    torch.cuda.set_per_process_memory_fraction(fraction, device)


# The device types mnistflow trains and runs on (PyTorch parses more: meta, xla, hpu, vulkan,
# lazy, privateuseone..., which none of its code supports).
DEVICE_TYPES = ("cpu", "cuda", "mps")
DEVICES_HELP = "auto, cpu, cuda, cuda:N or mps"


def parse_device(name: str) -> torch.device | None:
    """``name`` as a device of a type mnistflow supports (None for ``auto``); anything else,
    a PyTorch device of another type included, is one error listing the supported ones. No
    hardware is looked at (:func:`pick_device` does that)."""
    if name == "auto":
        return None
    shown = (repr(name) if len(name) <= 40 else repr(name[:37]) + "...") if isinstance(name, str) \
        else type(name).__name__
    try:
        dev = torch.device(name) if isinstance(name, str) and len(name) <= 32 else None
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in DEVICE_TYPES or (dev.type != "cuda" and dev.index not in (None, 0)):
        raise MnistflowError(f"unknown device {shown} (use {DEVICES_HELP})")
    return dev


def pick_device(name: str = "auto") -> torch.device:
    """auto: the current CUDA device when present, else Apple's MPS, else the CPU.

    ``cuda:N`` counts among the GPUs that ``CUDA_VISIBLE_DEVICES`` leaves visible."""
    dev = parse_device(name)
    if dev is None:
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise MnistflowError(f"--device {name}: no CUDA GPU is visible "
                                 "(check the driver and CUDA_VISIBLE_DEVICES)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise MnistflowError(f"--device {name}: only {torch.cuda.device_count()} GPU(s) visible "
                                 "(numbered from 0 among CUDA_VISIBLE_DEVICES)")
        if dev.index is None:  # "cuda": the current GPU, by number (some CUDA calls refuse no number)
            dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise MnistflowError("--device mps: MPS is not available on this machine")
    return dev


def machine_kind(device: str = "auto") -> str:
    """What the measured figures of a recipe are for (``training/measured.json``): "gpu" when
    ``device`` is or picks a CUDA GPU, else "cpu-bf16" for a CPU fast at bf16, else "cpu"."""
    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        return "gpu"
    return "cpu-bf16" if cpu_has_fast_bf16() else "cpu"


def pick_precision(name: str, device: torch.device) -> str:
    """Resolve ``auto`` (one of ``core.choices.PRECISIONS``): bf16 where the hardware runs it
    fast, else fp32."""
    if name != "auto":
        if name == "fp16" and device.type == "cpu":
            raise MnistflowError("--precision fp16 needs a GPU; on a CPU use bf16 or fp32")
        return name
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type == "cpu" and cpu_has_fast_bf16():
        return "bf16"
    return "fp32"


@dataclass
class Amp:
    """Mixed precision: the autocast context and (fp16 on CUDA) the gradient scaler."""

    precision: str
    device_type: str
    scaler: torch.amp.GradScaler | None = None

    @classmethod
    def create(cls, precision: str, device: torch.device) -> "Amp":
        scaler = torch.amp.GradScaler("cuda") if precision == "fp16" and device.type == "cuda" else None
        return cls(precision, device.type, scaler)

    def autocast(self, cache: bool = True) -> contextlib.AbstractContextManager[torch.autocast | None]:
        """The autocast context; ``cache=False`` under CUDA graph capture (the weights' cached
        casts would outlive the captured step)."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(self.device_type, dtype=dtype, cache_enabled=cache)
