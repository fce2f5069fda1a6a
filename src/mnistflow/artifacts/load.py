"""``load_any``: the one loader behind eval / predict / serve / export / summary / report.

    from mnistflow.artifacts.load import load_any
    model, info = load_any("runs/fast-1")                     # model.safetensors, else the newest checkpoint
    model, info = load_any("runs/fast-1/checkpoints/step-000400.pt")
    model, info = load_any("weights.npz", "fast", data="data/mnist")   # a bare npz: name + records
    backend, info = load_any("runs/fast-1/model.onnx")        # an OnnxBackend (onnxruntime, CPU)
    model, info = load_any("runs/fast-1/model.pt2")           # an ExportedModel (torch.export program)

A PyTorch model comes back in eval mode on ``device``; an ``.onnx`` file comes back as an
``artifacts.onnx.OnnxBackend`` (``logits``/``predict``, CPU); a ``.pt2`` as an
``artifacts.pt2.ExportedModel`` on ``device`` (a program: loaded only with
``$MNISTFLOW_TRUST_PT2=1``, see ``artifacts.pt2``). Wrap any of them with
``artifacts.predictor.as_predictor`` to classify uint8 images. Weights always go through the
strict loader (``model_file.load_weights``).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn as nn

from mnistflow.artifacts import checkpoint
from mnistflow.artifacts.model_file import MODEL_FILE, build_model, load_model, load_weights
from mnistflow.artifacts.model_info import ModelInfo, check_model_info, info_from_records
from mnistflow.artifacts.npz import as_tensors, read_npz
from mnistflow.artifacts.onnx import OnnxBackend, load_onnx
from mnistflow.artifacts.pt2 import load_pt2
from mnistflow.artifacts.rundir import RunDir
from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError, display
from mnistflow.core.fsutil import regular_file
from mnistflow.core.log import note

PLAIN_TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".pkl")

TRUST_PT2 = "MNISTFLOW_TRUST_PT2"  # the user's word that their .pt2 files are trusted as code


def load_checkpoint_model(path: str | Path, device: torch.device | str = "cpu",
                          model_name: str | None = None) -> tuple[nn.Module, ModelInfo]:
    """The model of a training checkpoint (weights only; optimizer etc. are ignored)."""
    p = Path(path)
    payload = checkpoint.load(p)
    if not payload.get("model_info"):
        raise MnistflowError("checkpoint has no model information", p)
    info = check_model_info(payload["model_info"], p)
    if model_name:
        info.model = model_name
    weights = payload["model"]
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise MnistflowError("checkpoint's model weights are not a dict of tensors", p)
    model = build_model(info, p, expect={k: v.shape for k, v in weights.items()})
    load_weights(model, weights, p, what=info.model)
    return model.to(device).eval(), info


def _npz_model(p: Path, model_name: str | None, device, data) -> tuple[nn.Module, ModelInfo]:
    arrays, info = read_npz(p)
    if info is None:
        if not model_name or data is None:
            raise MnistflowError("npz has no mnistflow metadata: use an npz written by 'mnistflow "
                                 "export', or pass the model name and its records (eval --model NAME "
                                 "--data RECORDS)", p)
        from mnistflow.data import open_data

        info = info_from_records(model_name, open_data(data))
    if model_name:
        info.model = model_name
    model = build_model(info, p, expect={k: a.shape for k, a in arrays.items()})
    load_weights(model, as_tensors(arrays, model.state_dict()), p, what=info.model)
    return model.to(device).eval(), info


def resolve(path: str | Path) -> Path:
    """The file ``load_any`` reads for ``path``: a run directory's ``model.safetensors``, or
    for a run that has not finished, its newest valid checkpoint."""
    if not isinstance(path, (str, os.PathLike)):
        raise MnistflowError(f"a model must be given as a path (a run directory or a model file), "
                             f"not {type(path).__name__}")
    p = Path(path)
    if p.is_dir():
        run = RunDir(p)
        training = run.training_pid()  # a run being trained: what is read is of a step in the middle
        if os.path.lexists(run.model):  # a FIFO or a device there is refused, not skipped
            found = regular_file(run.model, limits.MAX_MODEL_BYTES, "model file")
            if training:
                note(f"{display(p)}: a training is writing this run now (pid {training}): reading the "
                     f"{MODEL_FILE} of an earlier end of it")
            return found
        latest = checkpoint.find_latest(run.checkpoints if run.checkpoints.is_dir() else p)
        if latest is None:
            raise MnistflowError(f"no {MODEL_FILE} and no valid checkpoint in this directory "
                                 "(did the run start?)", p)
        if training:
            note(f"{display(p)}: a training is writing this run now (pid {training}): reading its newest "
                 f"checkpoint, {latest.name}, not a finished model")
        return latest
    if not p.exists():
        raise MnistflowError("no such file or directory", p)
    return p


def load_any(path: str | Path, model_name: str | None = None, device: torch.device | str = "cpu",
             *, data: str | Path | None = None) -> tuple[nn.Module | OnnxBackend, ModelInfo]:
    """A model ready for inference and its info, from any of the formats.

    A run directory gives its ``model.safetensors`` or, for a run that has not finished, its
    newest valid checkpoint. ``model_name`` picks the architecture of an ``.npz`` or a
    checkpoint (it defaults to the one recorded inside the file); an npz without mnistflow
    metadata also needs ``data`` (records or raw input) for the input shape, class names and
    normalization. ``.onnx`` models come back as an ``OnnxBackend`` (onnxruntime, CPU), ``.pt2``
    programs (``mnistflow export --format pt2``) as an ``ExportedModel``.
    """
    p = resolve(path)
    suffix = p.suffix.lower()
    if suffix == ".onnx":
        return load_onnx(p)
    if suffix == ".pt2":
        if os.environ.get(TRUST_PT2) != "1":  # (a program: checks cannot make a hostile one safe)
            raise MnistflowError("a .pt2 is a program, not data (torch.export.load unpickles it, and "
                                 "its graph may call any function PyTorch can reach): mnistflow loads "
                                 f"one only when you trust it as code: set {TRUST_PT2}=1", p)
        model, info = load_pt2(p, device)
        if model_name and model_name != info.model:
            raise MnistflowError(f"the file holds a '{info.model}' model, not '{model_name}'", p)
        return model, info
    if suffix == ".npz":
        return _npz_model(p, model_name, device, data)
    if checkpoint.is_checkpoint_file(p):
        return load_checkpoint_model(p, device, model_name)
    if suffix in PLAIN_TORCH_SUFFIXES:
        regular_file(p, limits.MAX_CHECKPOINT_BYTES, "torch file")  # before torch opens it
        obj = checkpoint.safe_torch_load(p, p)  # refuses pickle payloads with a clear error
        raise MnistflowError("not a mnistflow checkpoint (a plain torch file"
                             f"{' of ' + str(len(obj)) + ' entries' if isinstance(obj, dict) else ''}); "
                             "use a run directory, model.safetensors, a checkpoint, an npz, an "
                             "ONNX file or a .pt2 export", p)
    model, info = load_model(p, device)
    if model_name and model_name != info.model:
        raise MnistflowError(f"the file holds a '{info.model}' model, not '{model_name}'", p)
    return model, info
