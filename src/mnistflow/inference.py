"""Using a trained model: ``evaluate`` (the eval verb) and ``predict`` (the predict verb).

    mnistflow eval runs/fast-1                         # test accuracy, per class, confusion matrix
    mnistflow eval runs/fast-1/model.onnx --tta 4      # in onnxruntime, with 4 shifted views
    mnistflow predict runs/fast-1 digit.png t10k-images-idx3-ubyte.gz

Both take anything ``artifacts.load.load_any`` reads: a run directory, model.safetensors, a
checkpoint, an npz (with the model name) or an ONNX file (run in onnxruntime on the CPU).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mnistflow.artifacts.load import load_any
from mnistflow.artifacts.onnx import OnnxBackend
from mnistflow.artifacts.predictor import as_predictor, predict_arrays
from mnistflow.core.errors import MnistflowError
from mnistflow.runtime.cpu import set_threads
from mnistflow.runtime.device import Amp, pick_device

__all__ = ["evaluate", "format_eval", "predict", "predict_arrays", "format_predictions"]

TTA_VIEWS = (0, 2, 4, 8)  # extra views: left/right, + up/down, + the diagonals


def check_tta(views: int) -> None:
    """``--tta``: one of ``TTA_VIEWS``."""
    if views not in TTA_VIEWS:
        raise MnistflowError(f"--tta must be one of {', '.join(map(str, TTA_VIEWS))}; got {views}")


def evaluate(model_path: str | Path, split: str = "test", *, data: str | Path | None = None,
             device: str = "auto", batch_size: int = 2000, threads: int | None = None,
             model_name: str | None = None, tta: int = 0) -> dict:
    """Accuracy, loss, per-class accuracy and confusion matrix of a trained model on ``split``;
    ``tta`` > 0 averages each prediction over that many one-pixel shifts too (0, 2, 4, 8)."""
    from mnistflow.data import make_loader, open_data
    from mnistflow.models.evaluate import evaluate as run_eval

    check_tta(tta)
    dev = pick_device(device)
    set_threads(threads)
    model, info = load_any(model_path, model_name, dev, data=data)
    if isinstance(model, OnnxBackend):
        dev = model.device
    rec = open_data(data, fallback=info.records)
    if rec.shape != (info.in_shape[1], info.in_shape[2], info.in_shape[0]):
        raise MnistflowError(f"records hold {rec.shape} images but the model takes "
                             f"{tuple(info.in_shape)} (C, H, W)", rec.path)
    loader = make_loader(rec, split, batch_size=batch_size, device=dev, train=False)
    res = run_eval(model, loader, Amp.create("fp32", dev), info.num_classes, confusion=True, tta=tta)
    res.update(split=split, tta=tta, model=info.model, class_names=info.class_names, records=str(rec.path))
    return res


def format_eval(res: dict) -> str:
    """The eval result as text: headline, per-class accuracy, confusion matrix."""
    names = res["class_names"]
    w = max(5, max(len(n) for n in names))
    lines = [f"{res['model']} on {res['split']} ({res['n']:,} images): accuracy "
             f"{100 * res['acc']:.2f}%  loss {res['loss']:.4f}"
             + (f"  (mean of {res['tta'] + 1} shifted views)" if res.get("tta") else ""), "",
             f"{'class':<{w}}  accuracy"]
    lines += [f"{n:<{w}}  {100 * a:7.2f}%" for n, a in zip(names, res["per_class_acc"])]
    cw = max(5, max(len(str(v)) for row in res["confusion"] for v in row) + 1)
    lines += ["", "confusion matrix (rows: true, columns: predicted)",
              " " * w + "".join(f"{n[:cw - 1]:>{cw}}" for n in names)]
    lines += [f"{n:<{w}}" + "".join(f"{v:>{cw}}" for v in row) for n, row in zip(names, res["confusion"])]
    return "\n".join(lines)


def _read_images(paths: list[Path]) -> list[tuple[str, np.ndarray]]:
    """Decode PNG/JPEG files, or every image of an IDX file, as uint8 arrays."""
    from PIL import Image, UnidentifiedImageError

    from mnistflow.data.formats.idx import read_idx

    out = []
    for p in paths:
        p = Path(p)
        if "idx3-ubyte" in p.name or p.suffix in (".idx", ".idx3"):
            arr = read_idx(p)
            if arr.ndim != 3:
                raise MnistflowError(f"expected an IDX image file (N, H, W), got shape {arr.shape}", p)
            out += [(f"{p.name}[{i}]", a) for i, a in enumerate(arr)]
            continue
        try:
            with Image.open(p) as im:
                im.load()
                out.append((str(p), np.asarray(im.convert("L") if im.mode in ("L", "1", "P", "I;16", "LA") else im.convert("RGB"))))
        except FileNotFoundError:
            raise MnistflowError("no such file", p) from None
        except (UnidentifiedImageError, OSError) as e:
            raise MnistflowError(f"not a readable image ({e.__class__.__name__})", p) from None
    return out


def predict(model_path: str | Path, images: list[str | Path], *, invert: bool | None = False,
            mnist_style: bool = False, device: str = "cpu", model_name: str | None = None,
            data: str | Path | None = None) -> list[dict]:
    """Label and class probabilities for each image (PNG/JPEG files, or IDX files)."""
    from mnistflow.data.picture import to_model_input

    model, info = load_any(model_path, model_name, pick_device(device), data=data)
    items = _read_images([Path(p) for p in images])
    if not items:
        raise MnistflowError("no images given")
    shape = tuple(info.in_shape)
    batch = np.stack([to_model_input(a, shape, invert=invert, mnist=mnist_style) for _, a in items])
    probs = as_predictor(model, info).predict(batch)
    return [{"image": name, "label": int(p.argmax()), "class_name": info.class_names[int(p.argmax())],
             "probabilities": [round(float(v), 6) for v in p]} for (name, _), p in zip(items, probs)]


def format_predictions(preds: list[dict], top: int = 3) -> str:
    w = max(5, max(len(p["image"]) for p in preds))
    lines = [f"{'image':<{w}}  label  prob     next best"]
    for p in preds:
        order = np.argsort(p["probabilities"])[::-1]
        nxt = ", ".join(f"{i}:{p['probabilities'][i]:.3f}" for i in order[1:top])
        lines.append(f"{p['image']:<{w}}  {p['class_name']:<5}  {p['probabilities'][order[0]]:.4f}   {nxt}")
    return "\n".join(lines)
