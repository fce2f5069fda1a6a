"""The trained model on disk: weights in safetensors plus what is needed to use them.

``model.safetensors`` carries, in its metadata, the model name (or spec), input shape, class
names and the normalization of its training data, so eval / predict / serve need nothing else.
Loading never executes code from the file.

``load_any`` is the one loader behind eval / predict / serve / export / summary: a run
directory, ``model.safetensors``, a checkpoint (``.pt``), an ``.npz`` of parameters (with the
model name) or an ``.onnx`` file (run by onnxruntime).
"""
from __future__ import annotations

import importlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from mnistflow.core.errors import MnistflowError
from mnistflow.core.fsutil import atomic_write_bytes

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

    from mnistflow.models import create_model

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


def info_from_json(text: str, where: str | Path) -> ModelInfo:
    try:
        d = json.loads(text)
        return ModelInfo(**{k: v for k, v in d.items() if k in ModelInfo.__dataclass_fields__})
    except (ValueError, TypeError) as e:
        raise MnistflowError(f"unreadable mnistflow metadata ({e})", where) from None


def info_from_records(model: str, rec, metrics: dict | None = None) -> ModelInfo:
    """What a model trained on the record set ``rec`` needs to be used."""
    h, w, c = rec.shape
    return ModelInfo(model=model, in_shape=[c, h, w], class_names=rec.class_names, mean=rec.mean,
                     std=rec.std, dataset=rec.name, records=str(Path(rec.path).resolve()),
                     metrics=dict(metrics or {}))


def import_optional(module: str, extra: str = "onnx"):
    """Import an optional dependency, or fail with one line telling what to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MnistflowError(f"this needs the optional package '{module.split('.')[0]}': "
                             f"pip install 'mnistflow[{extra}]'") from None


def _build(info: ModelInfo, model_name: str | None = None) -> nn.Module:
    from mnistflow.models import create_model

    return create_model(model_name or info.model, tuple(info.in_shape), info.num_classes)


def load_checkpoint_model(path: str | Path, device: torch.device | str = "cpu",
                          model_name: str | None = None) -> tuple[nn.Module, ModelInfo]:
    """The model of a training checkpoint (weights only; optimizer etc. are ignored)."""
    from mnistflow.artifacts import checkpoint

    p = Path(path)
    payload = checkpoint.load(p)
    if not payload.get("model_info"):
        raise MnistflowError("checkpoint has no model information", p)
    info = ModelInfo(**payload["model_info"])
    if model_name:
        info.model = model_name
    model = _build(info)
    _strict_load(model, payload["model"], p, info)
    return model.to(device).eval(), info


def _strict_load(model: nn.Module, sd: dict, p: Path, info: ModelInfo) -> None:
    own = model.state_dict()
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    shape = [k for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shape:
        raise MnistflowError(f"weights do not fit model '{info.model}' (missing: {missing[:3]}, "
                             f"unexpected: {unexpected[:3]}, shape mismatch: {shape[:3]})", p)
    model.load_state_dict(sd, strict=True)


class OnnxModule(nn.Module):
    """An ONNX file run by onnxruntime, behind the ``nn.Module`` interface that eval / predict
    use (float32 NCHW in, logits out, CPU). A zero-size parameter marks the device."""

    def __init__(self, path: str | Path):
        super().__init__()
        ort = import_optional("onnxruntime")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = torch.get_num_threads()
        opts.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types
            raise MnistflowError(f"not a loadable ONNX model ({str(e).splitlines()[0][:160]})",
                                 path) from None
        self.input_name = self.session.get_inputs()[0].name
        self.path = Path(path)
        self.anchor = nn.Parameter(torch.empty(0), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        arr = x.detach().to("cpu", torch.float32).contiguous().numpy()
        return torch.from_numpy(self.session.run(None, {self.input_name: arr})[0])


def load_onnx(path: str | Path) -> tuple[OnnxModule, ModelInfo]:
    p = Path(path)
    m = OnnxModule(p)
    meta = m.session.get_modelmeta().custom_metadata_map
    if "mnistflow" not in meta:
        raise MnistflowError("ONNX model has no mnistflow metadata (export it with "
                             "'mnistflow export --format onnx')", p)
    return m, info_from_json(meta["mnistflow"], p)


def _records_info(model_name: str, data, p: Path) -> ModelInfo:
    from mnistflow.data.records import open_records
    from mnistflow.data.prepare import prepare

    rec = open_records(prepare(None, Path(data), quiet=True))
    return info_from_records(model_name, rec)


def load_any(path: str | Path, model_name: str | None = None, device: torch.device | str = "cpu",
             *, data: str | Path | None = None) -> tuple[nn.Module, ModelInfo]:
    """A model ready for inference (eval mode) and its info, from any of the formats.

    A run directory gives its ``model.safetensors`` or, for a run that has not finished, its
    newest valid checkpoint. ``model_name`` picks the architecture of an ``.npz`` (it defaults
    to the one recorded inside the file); an npz without mnistflow metadata also needs
    ``data`` (records) for the input shape, class names and normalization. ``.onnx`` models
    run on the CPU with onnxruntime.
    """
    from mnistflow.artifacts import checkpoint

    p = Path(path)
    if p.is_dir():
        if (p / MODEL_FILE).is_file():
            p = p / MODEL_FILE
        else:
            latest = checkpoint.find_latest(p / checkpoint.CKPT_DIR if (p / checkpoint.CKPT_DIR).is_dir() else p)
            if latest is None:
                raise MnistflowError(f"no {MODEL_FILE} and no valid checkpoint in this directory "
                                     "(did the run start?)", p)
            p = latest
    elif not p.exists():
        raise MnistflowError("no such file or directory", p)
    suffix = p.suffix.lower()
    if suffix == ".onnx":
        return load_onnx(p)
    if suffix == ".npz":
        from mnistflow.exporting import load_npz_into, read_npz

        arrays, info = read_npz(p)
        if info is None:
            if not model_name or data is None:
                raise MnistflowError("npz has no mnistflow metadata: pass the model name (--model) "
                                     "and the records it was trained on (--data)", p)
            info = _records_info(model_name, data, p)
        if model_name:
            info.model = model_name
        model = _build(info)
        report = load_npz_into(model, p, arrays=arrays)
        if not report.complete:
            raise MnistflowError(f"parameters do not fit model '{info.model}' ({report.problems()})", p)
        return model.to(device).eval(), info
    if checkpoint.is_checkpoint_file(p):
        return load_checkpoint_model(p, device, model_name)
    if suffix in (".pt", ".pth", ".ckpt", ".bin", ".pkl"):
        obj = checkpoint.safe_torch_load(p, p)  # refuses pickle payloads with a clear error
        raise MnistflowError("not a mnistflow checkpoint (a plain torch file"
                             f"{' of ' + str(len(obj)) + ' entries' if isinstance(obj, dict) else ''}); "
                             "use a run directory, model.safetensors, a checkpoint, an npz or an "
                             "ONNX file", p)
    model, info = load_model(p, device)
    if model_name and model_name != info.model:
        raise MnistflowError(f"the file holds a '{info.model}' model, not '{model_name}'", p)
    return model, info
