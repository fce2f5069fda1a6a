"""Using a trained model: ``evaluate`` (the eval verb) and ``predict`` (the predict verb).

    mnistflow eval runs/fast-1                         # test accuracy, per class, confusion matrix
    mnistflow eval runs/fast-1/model.onnx --tta 4      # in onnxruntime, with 4 shifted views
    mnistflow predict runs/fast-1 digit.png t10k-images-idx3-ubyte.gz
    mnistflow predict runs/fast-1 emnist-byclass-train-images-idx3-ubyte.gz --format csv > out.csv

Both run a batch at a time, so memory is bounded by the batch, not by the number of images:
eval reads the records' split through the streaming loader (on a CPU), predict reads its
images through ``data.image_stream`` (IDX files in chunks, pictures a batch at a time) and
``write_predictions`` writes each batch as it is classified (``predict_batches`` is the same
for the API; ``predict`` returns the whole list). A PyTorch model runs as training runs it
(``artifacts.predictor.inference_model``: channels-last, mnistflow's kernels); predict's
predictor runs a plain CNN's convolutions in oneDNN's blocked layout (``blocked_model``). A
progress bar shows on a terminal while a long run lasts.

Both take anything ``artifacts.load.load_any`` reads: a run directory, model.safetensors, a
checkpoint, an npz (with the model name), an ONNX file (run in onnxruntime on the CPU) or a
``.pt2`` export (a torch.export program, trusted: ``artifacts.pt2``).

Both speak the data's own labels: a model trained on labels 1..26 predicts "label" 1..26 (its
output index is "index"), and eval's per-class table and confusion matrix list 1..26 (their
names, a..z, when the dataset has them). Records whose classes differ from the model's are
mapped onto its outputs by label value (``model_info.outputs_of_records``).
"""
from __future__ import annotations

import io
import json
import numbers
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import torch

from mnistflow.artifacts.load import load_any
from mnistflow.artifacts.model_info import ModelInfo, outputs_of_records
from mnistflow.artifacts.onnx import OnnxBackend
from mnistflow.artifacts.predictor import (BATCH, Predictor, as_predictor, default_batch, inference_model,
                                           takes_channels_last)
from mnistflow.artifacts.rundir import SUMMARY
from mnistflow.artifacts.runlog import describe_views, read_summary
from mnistflow.core import choices, openmp
from mnistflow.core.choices import TTA_VIEWS
from mnistflow.core.errors import MnistflowError
from mnistflow.core.log import warn
from mnistflow.core.progress import above_bars, progress
from mnistflow.data import memory, picture
from mnistflow.data.augment import mirror_safe
from mnistflow.data.image_stream import ImageStream, pictures_in
from mnistflow.runtime.cpu import BusyCores, env_threads, set_threads, threads_for_load, usable_cores
from mnistflow.runtime.device import Amp, pick_device, pick_precision

__all__ = ["evaluate", "format_eval", "predict", "predict_batches", "format_predictions", "write_predictions"]

PROGRESS_DELAY_S = 1.0  # eval's and predict's bar shows only for a run longer than this


def check_tta(views: int) -> None:
    """``--tta``: one of ``TTA_VIEWS``."""
    if views not in TTA_VIEWS:
        raise MnistflowError(f"--tta must be one of {', '.join(map(str, TTA_VIEWS))}; got {views}")


def evaluate(model_path: str | Path, split: str = "test", *, data: str | Path | None = None,
             device: str = "auto", batch_size: int | None = None, threads: int | None = None,
             model_name: str | None = None, tta: int = 0, precision: str = "auto") -> dict:
    """Accuracy, loss, per-class accuracy and confusion matrix of a trained model on ``split``;
    ``tta`` > 0 averages each prediction over that many one-pixel shifts too (0, 2, 4, 8).
    ``precision``: fp32, bf16, or auto: the precision a run directory's own evaluations used
    (its summary.json) where this device runs it fast, so that eval gives the run's own figure
    (bf16 and fp32 disagree on a few images), else fp32 (a model file, or a bf16 run on a CPU
    without bf16 units). ``batch_size``: images per forward pass (default: as many as fit the
    CPU's caches, ``artifacts.predictor.default_batch``). On a CPU the images are read from the records
    a batch at a time (memory bounded by the batch, not the split); a progress bar shows on a
    terminal."""
    from mnistflow.data import make_loader, open_data
    from mnistflow.models.evaluate import evaluate as run_eval

    check_tta(tta)
    _check_precision(precision)
    if batch_size is not None:
        _check_batch_size(batch_size)
    dev = pick_device(device)
    set_threads(threads)
    busy = BusyCores()
    model, info = load_any(model_path, model_name, dev, data=data)
    _fit_threads(threads, busy)
    if isinstance(model, OnnxBackend):
        dev = model.device
    else:
        model = inference_model(model)
    amp = Amp.create(_precision_for(precision, model_path, dev), dev)
    if batch_size is None:
        batch_size = BATCH if isinstance(model, OnnxBackend) else default_batch(model, info, amp)
    rec = open_data(data, fallback=info.records)
    if rec.in_shape != tuple(info.in_shape):
        raise MnistflowError(f"records hold {rec.shape} images but the model takes "
                             f"{tuple(info.in_shape)} (C, H, W)", rec.path)
    outputs = outputs_of_records(info, rec, split)  # checked before any image is classified
    # normalized as the model was trained (its own mean and std), not by the evaluated records'
    loader = make_loader(rec, split, batch_size=batch_size, device=dev, train=False, norm=(info.mean, info.std),
                         channels_last=takes_channels_last(model), resident="no" if dev.type == "cpu" else "auto")
    mirror = mirror_safe(info.dataset or rec.name)
    with progress(rec.size(split), "eval", "img", unit_scale=True, delay=PROGRESS_DELAY_S) as bar:
        res = run_eval(model, _Batches(loader, outputs, bar), amp, info.num_classes, confusion=True, tta=tta,
                       mirror=mirror)
    res.update(split=split, tta=tta, precision=amp.precision, tta_mirror=bool(tta) and mirror, model=info.model,
               class_names=info.class_names, label_values=info.values, records=str(rec.path))
    return res


def _fit_threads(threads: int | None, busy: BusyCores) -> None:
    """Fewer intra-op threads than the usable cores when other processes keep some busy (as
    training chooses: a thread sharing a core with a busy process stalls the others at every
    op), measured over the model's loading (``busy``, no wait of its own); not when the caller,
    ``$MNISTFLOW_THREADS`` or an idle machine at start (``core.openmp``) chose."""
    if threads or env_threads() or openmp.chosen == "spin" or torch.get_num_threads() == 1:
        return
    torch.set_num_threads(threads_for_load(torch.get_num_threads(), usable_cores(), busy.elsewhere()))


def _check_precision(precision: object) -> None:
    if precision not in choices.PRECISIONS:  # (the CLI's choices guard --precision; the API's here)
        raise MnistflowError(f"--precision {str(precision)[:40]!r}: expected one of {', '.join(choices.PRECISIONS)}")


def _check_batch_size(batch_size: object) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size <= 0:
        raise MnistflowError(f"batch size must be positive (an integer), got {str(batch_size)[:40]}")


def _precision_for(precision: str, model_path: str | Path, dev: torch.device) -> str:
    """The precision ``evaluate`` and ``predict`` run in: ``precision`` itself, or for auto the
    run's (see ``evaluate``)."""
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


class _Batches:
    """A loader whose labels (the records' class indices) are turned into the model's outputs
    (``outputs``; None: they are already), counting the images on ``bar`` as they are drawn."""

    def __init__(self, loader, outputs: list[int] | None, bar):
        self.loader, self.bar = loader, bar
        self.lut = None if outputs is None else torch.tensor(outputs, dtype=torch.int64)
        self.world_size = getattr(loader, "world_size", 1)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        lut = None
        for xb, yb in self.loader:
            if self.lut is not None:
                lut = self.lut.to(yb.device) if lut is None else lut
                yb = lut[yb]
            yield xb, yb
            self.bar.update(len(yb))


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


IMAGES_ACCEPTED = ("a path (a PNG/JPEG/IDX file or a folder of pictures), a list of paths, or an "
                   "array of images already at the model's size (as train takes them)")


def _is_array(x: object) -> bool:
    return isinstance(x, (np.ndarray, torch.Tensor))


def _image_arg(images: object) -> list[Path] | np.ndarray | torch.Tensor:
    """``predict``'s ``images`` as a list of paths (one path is one input, never its
    characters; a folder is the pictures in it) or an array (numpy or torch, checked later);
    anything else is a ``MnistflowError`` saying what is accepted."""
    if isinstance(images, (np.ndarray, torch.Tensor)) and images.ndim:
        return images
    if isinstance(images, (str, os.PathLike)):
        images = [images]
    elif isinstance(images, (bytes, bytearray, dict, np.ndarray, torch.Tensor)) or not isinstance(images, Iterable):
        raise MnistflowError(f"images must be {IMAGES_ACCEPTED}; got {type(images).__name__}")
    out: list[Path] = []
    for x in images:
        if not isinstance(x, (str, os.PathLike)):
            raise MnistflowError(f"images must be {IMAGES_ACCEPTED}; got a list with an item of "
                                 f"type {type(x).__name__}")
        p = Path(x)
        out += pictures_in(p) if p.is_dir() else [p]
    return out


def _check_array(a: np.ndarray | torch.Tensor, in_shape: tuple[int, int, int]) -> np.ndarray:
    """A batch given as an array, read by the rules ``train`` reads its images by
    (``data.memory.images``: N x H x W, N x H x W x C or N x C x H x W; uint8, integers 0..255
    or floats 0..1 or 0..255), as uint8 N x H x W x C at the model's size."""
    if not len(a):
        raise MnistflowError("no images given")
    batch = memory.images(a, "images")
    c, h, w = in_shape
    if tuple(batch.shape[1:]) != (h, w, c):
        raise MnistflowError(f"images: this model takes {h} x {w} pictures with {c} channel"
                             f"{'s' if c > 1 else ''}; the array holds {batch.shape[1]} x "
                             f"{batch.shape[2]} with {batch.shape[3]} (shape {tuple(a.shape)})")
    return batch


@dataclass
class Predictions:
    """The predictions of consecutive images: their ``names``, the way each was made
    (``preprocess``) and class probabilities ``probs`` (B, K) float32 in the model's output
    order; ``info`` says the label value and name of each output."""

    names: list[str]
    preprocess: list[str]
    probs: np.ndarray
    info: ModelInfo

    def __len__(self) -> int:
        return len(self.names)

    def dicts(self) -> list[dict]:
        """Each prediction as ``predict`` gives it (``prediction``'s dict), made for the whole
        batch at once: the same values, since ``probs`` are float32 (see ``rounded``)."""
        info, labels = self.info, self.info.values
        out = []
        for name, how, k, p in zip(self.names, self.preprocess, self.probs.argmax(1).tolist(),
                                   rounded(self.probs).tolist()):
            out.append({"image": name, "preprocess": how, "label": info.label(k),
                        "name": info.class_names[k], "class_name": info.class_names[k], "index": k,
                        "probabilities": p, "labels": labels})
        return out


def rounded(probs: np.ndarray) -> np.ndarray:
    """float32 probabilities rounded to 6 decimals, as ``round(float(v), 6)`` rounds each (for
    every float32 value: its product with 10**6 is exact in float64, ``rint`` rounds half to
    even as ``round`` does, and the quotient is the float nearest the decimal)."""
    return np.rint(probs.astype(np.float64) * 1e6) / 1e6


class PredictionStream:
    """``predict_batches``' answer: ``len()`` images, classified a batch at a time as it is
    iterated (:class:`Predictions`; a progress bar on a terminal while it runs)."""

    def __init__(self, predictor: Predictor, images: ImageStream, batch_size: int):
        self.predictor, self.images, self.batch_size = predictor, images, batch_size
        self.info = predictor.info

    def __len__(self) -> int:
        return len(self.images)

    def name_width(self) -> int:
        """The length of the longest image name."""
        return self.images.name_width()

    def __iter__(self) -> Iterator[Predictions]:
        with progress(len(self), "predict", "img", unit_scale=True, delay=PROGRESS_DELAY_S) as bar:
            for batch in self.images.batches(self.batch_size):
                probs = self.predictor.predict(batch.images)
                yield Predictions(batch.names, batch.preprocess, probs, self.info)
                bar.update(len(batch))


def predict_batches(model_path: str | Path, images: str | Path | list[str | Path] | np.ndarray, *,
                    as_is: bool = False, device: str = "cpu", model_name: str | None = None,
                    data: str | Path | None = None, max_pixels: int | None = None,
                    batch_size: int | None = None, precision: str = "fp32") -> PredictionStream:
    """:func:`predict` a batch at a time: the model is loaded and the inputs checked (IDX
    headers, missing files) now; iterating classifies ``batch_size`` images at a time (default:
    as many as fit the CPU's caches, ``artifacts.predictor.default_batch``), as
    :class:`Predictions` (their ``probs``: a (B, K) float32 array), so memory is bounded by the
    batch whatever the number of images. ``precision``: fp32 (what ``serve`` and the exports
    compute), bf16 (several times faster on CPUs with bf16 units; a few answers differ), or auto
    (as ``evaluate``: the run's own where this device runs it fast, else fp32)."""
    given = _image_arg(images)  # checked before the model is loaded
    if not _is_array(given) and not given:
        raise MnistflowError("no images given")
    if batch_size is not None:
        _check_batch_size(batch_size)
    _check_precision(precision)
    set_threads(None)  # $MNISTFLOW_THREADS or the usable cores, as eval and train (a bad value: one line)
    dev = pick_device(device)
    busy = BusyCores()
    model, info = load_any(model_path, model_name, dev, data=data)
    _fit_threads(None, busy)
    shape = tuple(info.in_shape)
    if _is_array(given):
        stream = ImageStream([_check_array(given, shape)], None)
    else:
        target = picture.Target.of(shape, info.mean, info.dataset)
        stream = ImageStream.of_paths(given, target, as_is=bool(as_is), max_pixels=max_pixels)
    precision = _precision_for(precision, model_path, getattr(model, "device", dev))
    predictor = as_predictor(model, info, precision=precision, batch_size=batch_size)
    return PredictionStream(predictor, stream, batch_size or getattr(predictor, "batch_size", BATCH))


def predict(model_path: str | Path, images: str | Path | list[str | Path] | np.ndarray, *,
            as_is: bool = False, device: str = "cpu", model_name: str | None = None,
            data: str | Path | None = None, max_pixels: int | None = None,
            batch_size: int | None = None, precision: str = "fp32") -> list[dict]:
    """Label and class probabilities for each image: ``images`` is one path or a list of paths
    (picture files, folders of them, IDX files of many images), or an array of images
    already at the model's size (numpy or torch; any layout and pixel scale ``train`` takes),
    named ``array[i]``.

    A picture file is made as the model's dataset images were made (``data.picture``: the
    polarity, the ink's box scaled and centred), as the served page does; ``as_is`` feeds it
    as it is (only resized to the model's size). IDX files and arrays hold the dataset's own
    images: they are used as they are. Each result says which way in ``preprocess`` (``none``
    for as it is). ``max_pixels``: the largest picture decoded (default
    ``core.limits.MAX_PIXELS``, the CLI's ``--max-pixels``); a larger one is refused from its
    header, before decoding.

    The images are read and classified ``batch_size`` at a time; the answer is one dict per
    image (about 1 KB each). For many images, :func:`predict_batches` gives them a batch at a
    time, with the probabilities as arrays."""
    stream = predict_batches(model_path, images, as_is=as_is, device=device, model_name=model_name,
                             data=data, max_pixels=max_pixels, batch_size=batch_size,
                             precision=precision)
    return [d for batch in stream for d in batch.dicts()]


def prediction(info: ModelInfo, probs: np.ndarray, **extra) -> dict:
    """One prediction as users see it: ``label`` (the original label value, e.g. 1..26),
    ``name`` (its class name; ``class_name`` too, as before), ``index`` (the model output),
    and ``probabilities`` in output order, rounded to 6 decimals (``labels`` gives the label of
    each). ``Predictions.dicts`` makes the same dicts for a batch."""
    k = int(np.argmax(probs))
    return {**extra, "label": info.label(k), "name": info.class_names[k],
            "class_name": info.class_names[k], "index": k,
            "probabilities": [round(float(v), 6) for v in probs], "labels": info.values}


def format_predictions(preds: list[dict], top: int = 3) -> str:
    """Predictions as a table: image, label, its probability and the next best ones."""
    w = max(5, max(len(p["image"]) for p in preds))
    return "\n".join([_table_head(w), *_table_rows(preds, w, top)])


def _table_head(w: int) -> str:
    return f"{'image':<{w}}  label  prob     next best"


def _table_rows(preds: list[dict], w: int, top: int = 3) -> list[str]:
    lines = []
    for p in preds:
        order = np.argsort(p["probabilities"])[::-1]
        labels = p.get("labels") or list(range(len(p["probabilities"])))
        nxt = ", ".join(f"{labels[i]}:{p['probabilities'][i]:.3f}" for i in order[1:top])
        lines.append(f"{p['image']:<{w}}  {p['class_name']:<5}  {p['probabilities'][order[0]]:.4f}   {nxt}")
    return lines


def write_predictions(preds: PredictionStream, fmt: str = "table", out: IO[str] | None = None) -> int:
    """Write ``preds`` to ``out`` (stdout) as each batch is classified, in ``fmt`` (one of
    ``core.choices.PREDICT_FORMATS``): ``table`` (for people), ``json`` (one array, as
    ``json.dumps`` of ``predict``'s list writes it), ``jsonl`` (one object a line) or ``csv``
    (image, preprocess, label, name, index, then the probability of each label, ``p_LABEL``).
    Returns the number of images written."""
    out = sys.stdout if out is None else out
    write = _writer(fmt, preds, out)
    n = 0
    for batch in preds:
        text = write(batch.dicts())
        with above_bars(out):
            out.write(text)
        n += len(batch)
    with above_bars(out):
        out.write(write(None))
        out.flush()
    return n


def _writer(fmt: str, preds: PredictionStream, out: IO[str]) -> Callable[[list[dict] | None], str]:
    """A function from each batch's dicts to its text, and from None to the text that ends
    the output."""
    first = [True]

    def opening() -> str:
        was, first[0] = first[0], False
        return was

    if fmt == "table":
        w = max(5, preds.name_width())
        return lambda ds: "" if ds is None else "".join(
            (_table_head(w) + "\n" if opening() else "") + line + "\n" for line in _table_rows(ds, w))
    if fmt == "json":  # "[" + ", ".join(items) + "]": what json.dumps writes for the whole list
        return lambda ds: "]\n" if ds is None else ("[" if opening() else ", ") + json.dumps(ds)[1:-1]
    if fmt == "jsonl":
        return lambda ds: "" if ds is None else "".join(json.dumps(d) + "\n" for d in ds)
    if fmt == "csv":
        return _csv_writer(preds.info, opening)
    raise MnistflowError(f"--format {str(fmt)[:40]!r}: expected one of {', '.join(choices.PREDICT_FORMATS)}")


def _csv_writer(info: ModelInfo, opening: Callable[[], bool]) -> Callable[[list[dict] | None], str]:
    import csv

    head = ["image", "preprocess", "label", "name", "index", *(f"p_{v}" for v in info.values)]

    def write(ds: list[dict] | None) -> str:
        if ds is None:
            return ""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        if opening():
            w.writerow(head)
        w.writerows([d["image"], d["preprocess"], d["label"], d["name"], d["index"], *d["probabilities"]]
                     for d in ds)
        return buf.getvalue()

    return write
