"""The trained model on disk: weights in safetensors plus what is needed to use them.

``model.safetensors`` carries, in its metadata, the model name (or spec), input shape, class
names and the normalization of its training data, so eval / predict / serve need nothing else.
Loading never executes code from the file.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from .errors import MnistflowError
from .fsutil import atomic_write_bytes

MODEL_FILE = "model.safetensors"


@dataclass
class ModelInfo:
    model: str
    in_shape: list[int]  # (C, H, W)
    class_names: list[str]
    mean: list[float]  # per channel, 0..255 units
    std: list[float]
    dataset: str = ""
    records: str | None = None
    metrics: dict = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DDP / torch.compile wrappers (what gets saved)."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def save_model(path: str | Path, model: nn.Module, info: ModelInfo) -> Path:
    """Write weights + info atomically as safetensors."""
    from safetensors.torch import save

    sd = {k: v.detach().cpu().contiguous() for k, v in unwrap(model).state_dict().items()}
    atomic_write_bytes(path, save(sd, metadata={"mnistflow": json.dumps(asdict(info))}))
    return Path(path)


def resolve_model_path(path: str | Path) -> Path:
    p = Path(path)
    if p.is_dir():
        if (p / MODEL_FILE).is_file():
            return p / MODEL_FILE
        raise MnistflowError(f"no {MODEL_FILE} in this run directory (did the run finish?)", p)
    if not p.exists():
        raise MnistflowError("no such file or directory", p)
    return p


def load_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[nn.Module, ModelInfo]:
    """A model ready for inference (eval mode) from a run directory or a .safetensors file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from .models import create_model

    p = resolve_model_path(path)
    try:
        from safetensors import safe_open

        with safe_open(str(p), "pt") as f:
            meta = f.metadata() or {}
        sd = load_file(str(p))
    except (SafetensorError, OSError, ValueError) as e:
        raise MnistflowError(f"not a readable safetensors model ({e})", p) from None
    if "mnistflow" not in meta:
        raise MnistflowError("has no mnistflow metadata (which model is it?)", p)
    info = ModelInfo(**json.loads(meta["mnistflow"]))
    model = create_model(info.model, tuple(info.in_shape), info.num_classes)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise MnistflowError(f"weights do not fit model '{info.model}' (missing: {missing[:3]}, "
                             f"unexpected: {unexpected[:3]})", p)
    return model.to(device).eval(), info
