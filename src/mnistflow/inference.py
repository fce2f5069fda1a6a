"""Using a trained model: ``evaluate`` (the eval verb) and ``predict`` (the predict verb).

    mnistflow eval runs/fast-1                         # test accuracy, per class, confusion matrix
    mnistflow eval runs/fast-1/model.onnx --tta 4      # in onnxruntime, with 4 shifted views
    mnistflow predict runs/fast-1 digit.png t10k-images-idx3-ubyte.gz

Both take anything ``artifacts.load.load_any`` reads: a run directory, model.safetensors, a
checkpoint, an npz (with the model name) or an ONNX file (run in onnxruntime on the CPU).

Both speak the data's own labels: a model trained on labels 1..26 predicts "label" 1..26 (its
output index is "index"), and eval's per-class table and confusion matrix list 1..26 (their
names, a..z, when the dataset has them). Records whose classes differ from the model's are
mapped onto its outputs by label value (``model_info.outputs_of_records``).
"""
from __future__ import annotations

import numbers

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from mnistflow.artifacts.load import load_any
from mnistflow.artifacts.model_info import ModelInfo, outputs_of_records
from mnistflow.artifacts.onnx import OnnxBackend
from mnistflow.artifacts.predictor import as_predictor
from mnistflow.artifacts.rundir import SUMMARY
from mnistflow.artifacts.runlog import describe_views, read_summary
from mnistflow.core.errors import MnistflowError
from mnistflow.core.log import warn
from mnistflow.data.augment import mirror_safe
from mnistflow.core import choices
from mnistflow.core.choices import TTA_VIEWS
from mnistflow.runtime.cpu import set_threads
from mnistflow.runtime.device import Amp, pick_device, pick_precision

__all__ = ["evaluate", "format_eval", "predict", "format_predictions"]

def check_tta(views: int) -> None:
    """``--tta``: one of ``TTA_VIEWS``."""
    if views not in TTA_VIEWS:
        raise MnistflowError(f"--tta must be one of {', '.join(map(str, TTA_VIEWS))}; got {views}")


def evaluate(model_path: str | Path, split: str = "test", *, data: str | Path | None = None,
             device: str = "auto", batch_size: int = 2000, threads: int | None = None,
             model_name: str | None = None, tta: int = 0, precision: str = "auto") -> dict:
    """Accuracy, loss, per-class accuracy and confusion matrix of a trained model on ``split``;
    ``tta`` > 0 averages each prediction over that many one-pixel shifts too (0, 2, 4, 8).
    ``precision``: fp32, bf16, or auto: the precision a run directory's own evaluations used
    (its summary.json) where this device runs it fast, so that eval gives the run's own figure
    (bf16 and fp32 disagree on a few images), else fp32 (a model file, or a bf16 run on a CPU
    without bf16 units)."""
    from mnistflow.data import make_loader, open_data
    from mnistflow.models.evaluate import evaluate as run_eval

    check_tta(tta)
    if precision not in choices.PRECISIONS:  # (the CLI's choices guard --precision; the API's here)
        raise MnistflowError(f"--precision {str(precision)[:40]!r}: expected one of {', '.join(choices.PRECISIONS)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size <= 0:
        raise MnistflowError(f"batch size must be positive (an integer), got {str(batch_size)[:40]}")
    dev = pick_device(device)
    set_threads(threads)
    model, info = load_any(model_path, model_name, dev, data=data)
    if isinstance(model, OnnxBackend):
        dev = model.device
    rec = open_data(data, fallback=info.records)
    if rec.in_shape != tuple(info.in_shape):
        raise MnistflowError(f"records hold {rec.shape} images but the model takes "
                             f"{tuple(info.in_shape)} (C, H, W)", rec.path)
    outputs = outputs_of_records(info, rec, split)  # checked before any image is classified
    loader = make_loader(rec, split, batch_size=batch_size, device=dev, train=False)
    if outputs is not None:
        loader = _Relabelled(loader, outputs)
    mirror = mirror_safe(info.dataset or rec.name)
    precision = _eval_precision(precision, model_path, dev)
    res = run_eval(model, loader, Amp.create(precision, dev), info.num_classes, confusion=True, tta=tta,
                   mirror=mirror)
    res.update(split=split, tta=tta, precision=precision, tta_mirror=bool(tta) and mirror, model=info.model,
               class_names=info.class_names, label_values=info.values, records=str(rec.path))
    return res


def _eval_precision(precision: str, model_path: str | Path, dev: torch.device) -> str:
    """``evaluate``'s precision: ``precision`` itself, or for auto the run's (see there)."""
    if precision != "auto":
        return pick_precision(precision, dev)
    return "bf16" if _run_precision(model_path) == "bf16" and pick_precision("auto", dev) == "bf16" else "fp32"


def _run_precision(model_path: str | Path) -> object:
    """The precision a run directory's summary.json records (None: no run, no summary, no
    value). A summary that cannot be used (too large, not a regular file, not a JSON object,
    ...: ``runlog.read_summary``) is only a hint lost: one warning, and eval goes on as
    without one (fp32), since the model itself is what is evaluated."""
    if not Path(model_path).is_dir():
        return None  # a model file: no summary of its own
    try:
        summary = read_summary(Path(model_path) / SUMMARY)
    except MnistflowError as e:
        warn(f"{e}; ignored: evaluating in fp32 (--precision chooses)")
        return None
    return None if summary is None else summary.get("precision")


class _Relabelled:
    """A loader whose labels (the records' class indices) are turned into the model's outputs."""

    def __init__(self, loader, outputs: list[int]):
        self.loader, self.lut = loader, torch.tensor(outputs, dtype=torch.int64)
        self.world_size = getattr(loader, "world_size", 1)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        lut = None
        for xb, yb in self.loader:
            if lut is None:
                lut = self.lut.to(yb.device)
            yield xb, lut[yb]


def format_eval(res: dict) -> str:
    """The eval result as text: headline, per-class accuracy (label value, name, images,
    accuracy), confusion matrix (rows and columns by name, else by label)."""
    names = list(res["class_names"])
    values = [str(v) for v in res.get("label_values") or range(len(names))]
    named = any(n != v for n, v in zip(names, values))
    counts = res.get("per_class_n") or [sum(row) for row in res["confusion"]]
    wl = max(5, *(len(v) for v in values))
    wn = min(max(4, *(len(n) for n in names)), 24) if named else 0
    lines = [f"{res['model']} on {res['split']} ({res['n']:,} images): accuracy "
             f"{100 * res['acc']:.2f}%  loss {res['loss']:.4f}"
             + (f"  ({describe_views(res['tta'], res.get('tta_mirror', False))})" if res.get("tta") else ""), "",
             f"{'label':>{wl}}" + (f"  {'name':<{wn}}" if named else "") + "   images  accuracy"]
    for v, n, k, a in zip(values, names, counts, res["per_class_acc"]):
        acc = f"{100 * a:7.2f}%" if k else "       -"
        lines.append(f"{v:>{wl}}" + (f"  {n[:wn]:<{wn}}" if named else "") + f"  {k:>7,}  {acc}")
    heads = [n if named else v for n, v in zip(names, values)]
    w = max(5, *(len(h) for h in heads)) if not named else min(max(5, *(len(h) for h in heads)), 16)
    cw = max(5, max(len(str(v)) for row in res["confusion"] for v in row) + 1)
    lines += ["", "confusion matrix (rows: true, columns: predicted)",
              " " * w + "".join(f"{h[:cw - 1]:>{cw}}" for h in heads)]
    lines += [f"{h[:w]:<{w}}" + "".join(f"{v:>{cw}}" for v in row) for h, row in zip(heads, res["confusion"])]
    return "\n".join(lines)


def _read_images(paths: list[Path], info: ModelInfo, *, as_is: bool,
                 max_pixels: int | None) -> list[tuple[str, np.ndarray, str]]:
    """(name, model input, preparation) for picture files, or every image of an IDX file.

    A picture is made as the model's dataset images were (``data.picture.prepare``, what the
    served page does), or with ``as_is`` fed as it is (``data.picture.as_is``: only resized to
    the model's size). Each picture's size is checked from its header before decoding
    (``read_picture``: at most ``max_pixels``, default ``core.limits.MAX_PIXELS``; only regular
    files) and it is brought to the model's size at once, so only one full-size picture is in
    memory at a time. An IDX file holds the dataset's own images: they are used as they are,
    read as ``prep`` reads them (``idx.read_idx_images``: upright for EMNIST's files, at least
    one image, pixels integers 0..255 whatever the IDX type)."""
    from mnistflow.data import picture
    from mnistflow.data.formats.idx import read_idx_images

    shape = tuple(info.in_shape)
    target = picture.Target.of(shape, info.mean, info.dataset)
    out = []
    for p in paths:
        if "idx3-ubyte" in p.name or p.suffix in (".idx", ".idx3"):
            arr = read_idx_images(p, ranks=(3,))  # uint8, at least one image of 1+ pixels
            out += [(f"{p.name}[{i}]", picture.as_is(a, shape), "none") for i, a in enumerate(arr)]
            continue
        if not p.exists():
            raise MnistflowError("no such file", p)
        img = picture.read_picture(p, max_pixels)
        out.append((str(p), picture.as_is(img, shape), "none") if as_is
                   else (str(p), *picture.prepare(img, target)))
    return out


def _pictures_in(folder: Path) -> list[Path]:
    """The pictures in ``folder`` (not its sub-folders), sorted by name; none is an error."""
    from mnistflow.data.formats.image import PICTURE_SUFFIXES

    try:
        found = sorted(p for p in folder.iterdir() if p.suffix.lower() in PICTURE_SUFFIXES
                       and not p.name.startswith(".") and p.is_file())
    except OSError as e:
        raise MnistflowError(f"cannot list the folder ({e.strerror or e})", folder) from None
    if not found:
        raise MnistflowError(f"a folder with no pictures ({', '.join(PICTURE_SUFFIXES)}) in it", folder)
    return found


IMAGES_ACCEPTED = ("a path (a PNG/JPEG/IDX file or a folder of pictures), a list of paths, or a "
                   "uint8 array (N, H, W, C) of images already at the model's size")


def _is_array(x: object) -> bool:
    return isinstance(x, (np.ndarray, torch.Tensor))


def _image_arg(images: object) -> list[Path] | np.ndarray:
    """``predict``'s ``images`` as a list of paths (one path is one input, never its
    characters; a folder is the pictures in it) or a numpy array (a torch tensor is brought
    to the CPU); anything else is a ``MnistflowError`` saying what is accepted."""
    if isinstance(images, torch.Tensor):
        return images.detach().cpu().numpy()
    if isinstance(images, np.ndarray):
        return images
    if isinstance(images, (str, os.PathLike)):
        images = [images]
    elif isinstance(images, (bytes, bytearray, dict)) or not isinstance(images, Iterable):
        raise MnistflowError(f"images must be {IMAGES_ACCEPTED}; got {type(images).__name__}")
    out: list[Path] = []
    for x in images:
        if not isinstance(x, (str, os.PathLike)):
            raise MnistflowError(f"images must be {IMAGES_ACCEPTED}; got a list with an item of "
                                 f"type {type(x).__name__}")
        p = Path(x)
        out += _pictures_in(p) if p.is_dir() else [p]
    return out


def _check_array(a: np.ndarray, in_shape: tuple[int, int, int]) -> np.ndarray:
    """A batch given as an array: uint8 (N, H, W, C) at the model's size (``predict_arrays``)."""
    c, h, w = in_shape
    if a.dtype != np.uint8 or a.ndim != 4 or tuple(a.shape[1:]) != (h, w, c):
        raise MnistflowError(f"an array of images must be uint8 (N, {h}, {w}, {c}) for this model "
                             f"(pictures at the model's size); got {a.dtype} {tuple(a.shape)}")
    if not len(a):
        raise MnistflowError("no images given")
    return a


def predict(model_path: str | Path, images: str | Path | list[str | Path] | np.ndarray, *,
            as_is: bool = False, device: str = "cpu", model_name: str | None = None,
            data: str | Path | None = None, max_pixels: int | None = None) -> list[dict]:
    """Label and class probabilities for each image: ``images`` is one path or a list of paths
    (picture files, folders of them, IDX files of many images), or a uint8 array (N, H, W, C)
    of images already at the model's size (numpy, or a torch tensor), named ``array[i]``.

    A picture file is made as the model's dataset images were made (``data.picture``: the
    polarity, the ink's box scaled and centred), as the served page does; ``as_is`` feeds it
    as it is (only resized to the model's size). IDX files and arrays hold the dataset's own
    images: they are used as they are. Each result says which way in ``preprocess`` (``none``
    for as it is). ``max_pixels``: the largest picture decoded (default
    ``core.limits.MAX_PIXELS``, the CLI's ``--max-pixels``); a larger one is refused from its
    header, before decoding."""
    given = _image_arg(images)  # checked before the model is loaded
    if not _is_array(given) and not given:
        raise MnistflowError("no images given")
    set_threads(None)  # $MNISTFLOW_THREADS or the usable cores, as eval and train (a bad value: one line)
    model, info = load_any(model_path, model_name, pick_device(device), data=data)
    if _is_array(given):
        batch = _check_array(given, tuple(info.in_shape))
        probs = as_predictor(model, info).predict(batch)
        return [prediction(info, p, image=f"array[{i}]", preprocess="none") for i, p in enumerate(probs)]
    items = _read_images(given, info, as_is=bool(as_is), max_pixels=max_pixels)
    probs = as_predictor(model, info).predict(np.stack([x for _, x, _ in items]))
    return [prediction(info, p, image=name, preprocess=how) for (name, _, how), p in zip(items, probs)]


def prediction(info: ModelInfo, probs: np.ndarray, **extra) -> dict:
    """One prediction as users see it: ``label`` (the original label value, e.g. 1..26),
    ``name`` (its class name; ``class_name`` too, as before), ``index`` (the model output),
    and ``probabilities`` in output order (``labels`` gives the label of each)."""
    k = int(np.argmax(probs))
    return {**extra, "label": info.label(k), "name": info.class_names[k],
            "class_name": info.class_names[k], "index": k,
            "probabilities": [round(float(v), 6) for v in probs], "labels": info.values}


def format_predictions(preds: list[dict], top: int = 3) -> str:
    w = max(5, max(len(p["image"]) for p in preds))
    lines = [f"{'image':<{w}}  label  prob     next best"]
    for p in preds:
        order = np.argsort(p["probabilities"])[::-1]
        labels = p.get("labels") or list(range(len(p["probabilities"])))
        nxt = ", ".join(f"{labels[i]}:{p['probabilities'][i]:.3f}" for i in order[1:top])
        lines.append(f"{p['image']:<{w}}  {p['class_name']:<5}  {p['probabilities'][order[0]]:.4f}   {nxt}")
    return "\n".join(lines)
