"""``mnistflow export``: a trained model as ONNX or a torch.export program (deployment), npz
(name -> array), safetensors, or a static web page that runs it in the browser.

    mnistflow export runs/fast-1 --format onnx                  # verified against PyTorch
    mnistflow export runs/fast-1 --format onnx --quantize int8  # plus an int8 model, compared
    mnistflow export runs/fast-1 --format pt2                   # torch.export, verified likewise
    mnistflow export runs/fast-1 --format npz --only 'conv*'    # a subset of the parameters
    mnistflow export runs/fast-1/checkpoints/step-000400.pt --format safetensors --out w.safetensors
    mnistflow export runs/fast-1 --format web --out digits-web/  # a folder: python -m http.server -d digits-web
    mnistflow train --model seed-cnn --init-from runs/a/model.npz --init-only 'conv*'  # restore by name

This module picks the format, verifies, and writes; the formats themselves live in
``artifacts`` (``onnx``, ``pt2``, ``npz``, ``model_file``, ``web``). The ONNX model (in
onnxruntime), the pt2 program (loaded back from the bytes to be written) and the web page's
graph (run in PyTorch, node by node) are verified against PyTorch on the real test images of
the model's records before they are written. onnx, onnxscript and
onnxruntime are optional (``pip install 'mnistflow[onnx]'``); pt2 needs PyTorch alone.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
import torch.nn as nn

from mnistflow.artifacts.load import load_any
from mnistflow.artifacts.model_file import unwrap
from mnistflow.artifacts.model_info import META_KEY, ModelInfo
from mnistflow.artifacts.npz import globs, selected, write_npz
from mnistflow.artifacts.onnx import OnnxBackend, quiet_exporter, session, to_onnx
from mnistflow.artifacts.pt2 import ExportedModel, program_from_bytes, to_pt2
from mnistflow.artifacts.rundir import CHECKPOINTS, RunDir
from mnistflow.core.choices import EXPORT_FORMATS
from mnistflow.core.errors import MnistflowError, display, import_optional
from mnistflow.core.fsutil import atomic_write_bytes, replace_together, sweep_stale
from mnistflow.core.progress import stages
from mnistflow.runtime.cpu import set_threads

EXT = {"onnx": ".onnx", "pt2": ".pt2", "npz": ".npz", "safetensors": ".safetensors",
       "web": "-web"}  # by EXPORT_FORMATS; web: a folder (RUN/model-web)
WEB_CHECK_IMAGES = 256  # test images the web graph is checked on (one forward each)


def _records(info: ModelInfo, data):
    """The records to verify / calibrate on: ``data`` if given, else the model's own."""
    from mnistflow.data import open_data

    if data is None and not (info.records and Path(info.records).is_dir()):
        raise MnistflowError("the model's training records are gone; pass --data RECORDS_OR_RAW "
                             "(real images are needed to verify the export)")
    return open_data(data, fallback=info.records)


def _normalized(images: np.ndarray, info: ModelInfo) -> np.ndarray:
    from mnistflow.data.normalize import normalize_np

    return normalize_np(images, info.mean, info.std)


def _test_images(info: ModelInfo, data, split: str = "test") -> tuple[np.ndarray, np.ndarray, str]:
    rec = _records(info, data)
    if not rec.has(split):
        split = "val"
    x, y = rec.split(split)
    return np.asarray(x), np.asarray(y), f"{rec.name} {split}"


def _logits_torch(model: nn.Module, x: np.ndarray, bs: int = 1000) -> np.ndarray:
    out = []
    with torch.inference_mode():
        for i in range(0, len(x), bs):
            out.append(model(torch.from_numpy(x[i:i + bs])).float().numpy())
    return np.concatenate(out)


def quantize_int8(model_bytes: bytes, calib: np.ndarray) -> bytes:
    """Static int8 quantization (QDQ, per-channel int8 weights, uint8 activations), calibrated
    on ``calib`` (normalized training images)."""
    import_optional("onnx")
    q = import_optional("onnxruntime.quantization")
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory(prefix="mnistflow-q-") as tmp:
        src, pre, dst = (os.path.join(tmp, n) for n in ("f.onnx", "p.onnx", "q.onnx"))
        Path(src).write_bytes(model_bytes)
        name = session(model_bytes).get_inputs()[0].name
        batches = [{name: calib[i:i + 64]} for i in range(0, len(calib), 64)]

        class Reader(q.CalibrationDataReader):
            def __init__(self):
                self.it = iter(batches)

            def get_next(self):
                return next(self.it, None)

        try:
            with quiet_exporter():
                try:
                    quant_pre_process(src, pre, skip_symbolic_shape=True)
                except Exception:  # pre-processing is an optimisation; quantize the raw model
                    pre = src
                q.quantize_static(pre, dst, Reader(), quant_format=q.QuantFormat.QDQ, per_channel=True,
                                  weight_type=q.QuantType.QInt8, activation_type=q.QuantType.QUInt8)
        except Exception as e:
            raise MnistflowError(f"int8 quantization failed ({e.__class__.__name__}: "
                                 f"{str(e).splitlines()[0][:200]})") from None
        return Path(dst).read_bytes()


def _accuracy(logits: np.ndarray, y: np.ndarray) -> float:
    return float((logits.argmax(1) == y).mean())


# --- the verb -----------------------------------------------------------------------------

def default_out(src: Path, fmt: str, suffix: str = "") -> Path:
    """Next to the source: RUN/model.onnx for a run, RUN/step-000123.onnx for a checkpoint."""
    if src.is_dir():
        return src / f"{RunDir(src).model.stem}{suffix}{EXT[fmt]}"
    folder = src.parent.parent if src.parent.name == CHECKPOINTS else src.parent
    return folder / f"{src.stem}{suffix}{EXT[fmt]}"


def int8_path(out: Path) -> Path:
    """Where ``--quantize int8`` writes the int8 model: ``m.onnx`` -> ``m.int8.onnx``."""
    return out.with_name(out.name.removesuffix(".onnx") + ".int8.onnx")


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _real(p: Path) -> str:
    """``p`` with its symlinks resolved as far as they go (a symlink loop stays as it is,
    where ``Path.resolve`` raises ``RuntimeError`` before Python 3.13)."""
    return os.path.realpath(p)


def _check_out_name(raw: str, fmt: str) -> None:
    """``--out`` as typed: a file name, with this format's suffix if with any known one."""
    if not raw.strip():
        raise MnistflowError(f"--out is empty: name the file to write (e.g. model{EXT[fmt]})")
    if raw.endswith(("/", os.sep)) or os.path.basename(raw) in ("", ".", ".."):
        raise MnistflowError(f"ends with '{os.path.basename(raw) or '/'}', a folder; --out names the file "
                             f"to write (e.g. {os.path.join(raw, 'model' + EXT[fmt])})", raw)
    suffix = Path(raw).suffix.lower()
    other = next((f for f, ext in EXT.items() if ext == suffix and f != fmt), None)
    if other:
        raise MnistflowError(f"the name of {'a' if other in ('pt2', 'safetensors') else 'an'} {other} file, "
                             f"not {fmt}: name it *{EXT[fmt]} "
                             f"(or pass --format {other})", raw)


def _check_free(path: Path, force: bool, what: str = "") -> None:
    """A file the user named is written only where nothing is, unless ``force``; a folder
    (or anything that is not a file or a link) is never replaced."""
    if os.path.isdir(path):
        raise MnistflowError(f"is a directory, not a file{what}", path)
    if os.path.lexists(path):
        if not (path.is_symlink() or path.is_file()):
            raise MnistflowError(f"is not a regular file{what}; not replaced", path)
        if not force:
            raise MnistflowError(f"already exists{what}; --force replaces it", path)


def _check_out_folder(raw: str, fmt: str = "web") -> None:
    """``--out`` as typed for a web page: a folder's name, not another format's file name."""
    if not raw.strip():
        raise MnistflowError("--out is empty: name the folder to write (e.g. model-web)")
    suffix = Path(raw.rstrip("/" + os.sep) or raw).suffix.lower()
    other = next((f for f, ext in EXT.items() if ext == suffix), None)
    if other:
        raise MnistflowError(f"the name of {'a' if other in ('pt2', 'safetensors') else 'an'} {other} file; "
                             f"--format web writes a folder: name it e.g. model-web (or pass --format {other})", raw)


def _check_free_folder(path: Path, force: bool, named: bool) -> None:
    """A web page's folder is written where nothing is, or an empty folder is; an earlier web
    export there is replaced with ``force``, or when it is the default place (made again from
    the run); anything else is never replaced."""
    from mnistflow.artifacts.web.folder import is_web_export

    if not os.path.lexists(path):
        return
    if not path.is_dir():
        raise MnistflowError("is a file, not a folder; --format web writes a folder", path)
    if not is_web_export(path):
        raise MnistflowError("is a folder with other files than a web export's; not replaced", path)
    if named and not force and any(path.iterdir()):
        raise MnistflowError("already exists; --force replaces it", path)


def _check_request(model_path, format, out, only, quantize) -> tuple[str, list[str]]:
    """The export's arguments checked at the API's edge: (the format, the ``--only`` patterns)."""
    fmt = format.lower() if isinstance(format, str) else format
    if fmt not in EXPORT_FORMATS:
        raise MnistflowError(f"unknown export format '{format}' (known: {', '.join(EXPORT_FORMATS)})")
    if quantize not in (None, "int8"):
        raise MnistflowError(f"--quantize supports int8, got '{quantize}'")
    if quantize and fmt != "onnx":
        raise MnistflowError("--quantize int8 applies to --format onnx")
    patterns = globs(only)
    if patterns and fmt in ("onnx", "pt2", "web"):
        raise MnistflowError(f"--only selects parameters for npz/safetensors; "
                             f"{ {'onnx': 'ONNX', 'pt2': 'pt2', 'web': 'a web page'}[fmt]} needs the whole model")
    for what, value in (("model_path", model_path), ("out", out)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise MnistflowError(f"{what} is a path (str or os.PathLike), not {type(value).__name__} "
                                 f"{_short(repr(value))}")
    return fmt, patterns


def export(model_path: str | Path, format: str, out: str | Path | None = None,
           only: str | Iterable[str] | None = None, quantize: str | None = None, *,
           model_name: str | None = None, data: str | Path | None = None,
           verify_images: int | None = None, force: bool = False) -> dict:
    """Python twin of ``mnistflow export``; returns what was written and measured.

    ``out`` (``--out``): the file to write (web: the folder); one that exists (or, with
    ``quantize``, an int8 model beside it that exists) is refused unless ``force``. Without
    ``out`` the export goes next to the model (``default_out``), replacing an earlier export
    there: it is derived from the run and made again from it."""
    fmt, patterns = _check_request(model_path, format, out, only, quantize)
    set_threads(None)  # $MNISTFLOW_THREADS or the usable cores, as eval and train (a bad value: one line)
    src = Path(model_path)
    named = out is not None
    if named:
        (_check_out_folder if fmt == "web" else _check_out_name)(os.fspath(out), fmt)
    source_file = _real(RunDir(src).model if src.is_dir() else src)
    training = RunDir(src).training_pid() if src.is_dir() and not named else None
    if training:  # RUN/model.onnx of a step in the middle, beside the final model.safetensors: refused
        raise MnistflowError(f"a training is writing this run now (pid {training}): its export would be of a "
                             "mid-run checkpoint, left in the run beside its final model as if made from it; "
                             "export when the run ends, or name the file with --out", src)
    if out is None:
        out = default_out(src, fmt)
        if _real(out) == source_file:  # e.g. safetensors of a run: RUN/model.weights.safetensors
            out = default_out(src, fmt, ".weights")
    out = Path(out)
    if _real(out) == source_file:
        raise MnistflowError("would overwrite the source model; pass another --out FILE", out)

    def free() -> None:  # before the model loads, and again before writing (verifying takes time)
        if fmt == "web":
            _check_free_folder(out, force, named)
        elif named:  # the defaults are re-made from the run: replaced
            _check_free(out, force)
            if quantize:
                _check_free(int8_path(out), force, f" (the int8 model written beside {out})")

    free()
    sweep_stale(out.parent, out.name)  # what a killed export (or another writer) left there
    model, info = load_any(src, model_name, "cpu", data=data)
    if isinstance(model, (OnnxBackend, ExportedModel)):
        raise MnistflowError(f"already an {'ONNX model' if isinstance(model, OnnxBackend) else 'exported program'}; "
                             "export from the run directory, a checkpoint, model.safetensors or an npz", src)
    res: dict = {"format": fmt, "source": str(src), "model": info.model, "out": str(out)}
    sd = {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}
    chosen = {k: v for k, v in sd.items() if selected(k, patterns)}
    if patterns and not chosen:
        raise MnistflowError(f"--only {','.join(patterns)} matches no name (names: "
                             f"{', '.join(list(sd)[:8])}{' ...' if len(sd) > 8 else ''})")
    if fmt in ("npz", "safetensors"):
        free()
    if fmt == "npz":
        arrays = {k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in chosen.items()}
        write_npz(out, arrays, info)
        res.update(names=len(arrays), values=int(sum(a.size for a in arrays.values())))
    elif fmt == "safetensors":
        from safetensors.torch import save

        atomic_write_bytes(out, save({k: v.contiguous() for k, v in chosen.items()},
                                     metadata={META_KEY: info.to_json()}))
        res.update(names=len(chosen), values=int(sum(v.numel() for v in chosen.values())))
    elif fmt == "pt2":
        res.update(_export_pt2(model, info, out, data, verify_images, free))
    elif fmt == "web":
        res.update(_export_web(model, info, out, data, verify_images, free))
    else:
        res.update(_export_onnx(model, info, out, quantize, data, verify_images, free))
    res.setdefault("bytes", out.stat().st_size)
    return res


def _verify(model: nn.Module, run, info: ModelInfo, data, verify_images, what: str, acc_key: str
            ) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """``run`` (normalized images -> logits: the export) against PyTorch's ``model`` on the real
    test images (the first ``verify_images``), all at once and one alone (the batch is dynamic);
    a mismatch is an error (``what`` is not written). Returns the measures, the normalized
    images, their labels and PyTorch's logits."""
    x_u8, y, split = _test_images(info, data)
    if verify_images:
        x_u8, y = x_u8[:verify_images], y[:verify_images]
    x = _normalized(x_u8, info)
    ref = _logits_torch(model, x)
    got = run(x)
    one = run(x[:1])
    max_diff = float(np.abs(ref - got).max())
    agree = float((ref.argmax(1) == got.argmax(1)).mean())
    scale = float(np.abs(ref).max()) or 1.0
    if agree < 0.999 or max_diff > 1e-3 * max(scale, 1.0) or one.shape != (1, info.num_classes):
        raise MnistflowError(f"{what} does not match PyTorch (max abs diff {max_diff:.3g}, "
                             f"labels agree on {100 * agree:.2f}% of {len(x):,} images); not written")
    res = {"verified_on": f"{len(x):,} images ({split})", "n_images": len(x), "max_abs_diff": max_diff,
           "label_agreement": agree, "torch_acc": _accuracy(ref, y), acc_key: _accuracy(got, y)}
    return res, x, y, ref


def _export_pt2(model, info: ModelInfo, out: Path, data, verify_images, free) -> dict:
    """torch.export, then the program loaded back from the very bytes to be written (as
    ``load_any`` loads a .pt2) and verified; then ``free()`` and write."""
    with stages(["torch.export", "verify"], "export") as stage:
        stage("torch.export")
        t0 = time.perf_counter()
        blob = to_pt2(model, info)
        export_s = time.perf_counter() - t0
        stage("verify")
        program, _ = program_from_bytes(blob, out)
        checked, *_ = _verify(model, lambda x: _logits_torch(program, x), info, data, verify_images,
                              "the exported program", "pt2_acc")
    free()
    atomic_write_bytes(out, blob)
    return {"export_s": round(export_s, 2), **checked}


def _export_web(model, info: ModelInfo, out: Path, data, verify_images, free) -> dict:
    """Trace the model into the page's graph (``artifacts.web``: an operation the page cannot run
    is one error line), check the graph against PyTorch on the real test images (the first
    ``WEB_CHECK_IMAGES``: one forward each), then ``free()`` and write the folder."""
    from mnistflow.artifacts.web.folder import page_files, write_folder
    from mnistflow.artifacts.web.run import check
    from mnistflow.artifacts.web.trace import trace
    from mnistflow.data.normalize import normalize

    with stages(["trace", "verify"], "export") as stage:
        stage("trace")  # shapes only: any image of the model's size, before the records are needed
        c, h, w = info.in_shape
        graph = trace(model.eval(), normalize(np.zeros((1, h, w, c), np.uint8), info.mean, info.std))
        stage("verify")
        x_u8, _, split = _test_images(info, data)
        x_u8 = x_u8[:verify_images or WEB_CHECK_IMAGES]
        checked = check(graph, model, info, x_u8)
    files = page_files(graph, model, info)
    free()
    write_folder(out, files)
    return {"verified_on": f"{len(x_u8):,} images ({split})", **checked,
            "files": {name: len(b) for name, b in files.items()}, "bytes": sum(map(len, files.values()))}


def _export_onnx(model, info: ModelInfo, out: Path, quantize, data, verify_images, free) -> dict:
    names = ["convert to ONNX", "verify", *(["int8"] if quantize == "int8" else [])]
    with stages(names, "export") as stage:  # a bar on a terminal: these take seconds each
        return _export_onnx_stages(stage, model, info, out, quantize, data, verify_images, free)


def _export_onnx_stages(stage, model, info: ModelInfo, out: Path, quantize, data, verify_images, free) -> dict:
    """Convert, verify (and quantize), then ``free()`` (the outputs may be written), write."""
    stage("convert to ONNX")
    t0 = time.perf_counter()
    blob = to_onnx(model, info)
    export_s = time.perf_counter() - t0
    stage("verify")
    backend = OnnxBackend(session(blob), info)
    checked, x, y, ref = _verify(model, backend.run, info, data, verify_images, "the ONNX model", "onnx_acc")
    res = {"export_s": round(export_s, 2), **checked}
    if quantize != "int8":
        free()
        atomic_write_bytes(out, blob)
    else:  # both made before either is written: a failed quantization writes neither
        stage("int8")
        xc_u8, _, _ = _calibration_images(info, data)
        qblob = quantize_int8(blob, _normalized(xc_u8, info))
        qout = int8_path(out)
        qlogits = OnnxBackend(session(qblob), info).run(x)
        free()
        replace_together({out: blob, qout: qblob})  # never one model of the pair without the other
        res["int8"] = {"out": str(qout), "bytes": qout.stat().st_size, "acc": _accuracy(qlogits, y),
                       "label_agreement": float((qlogits.argmax(1) == ref.argmax(1)).mean()),
                       "max_abs_diff": float(np.abs(qlogits - ref).max()),
                       "calibration_images": len(xc_u8)}
    return res


def _calibration_images(info: ModelInfo, data, n: int = 512, seed: int = 0):
    """``n`` training images (a fixed random sample) for int8 calibration."""
    rec = _records(info, data)
    x, y = rec.split("train")
    idx = np.sort(np.random.default_rng(seed).choice(len(y), size=min(n, len(y)), replace=False))
    return np.asarray(x[idx]), np.asarray(y[idx]), "train"


def format_export(res: dict) -> str:
    """The export result as a small fixed-width table."""
    rows = [("wrote", f"{display(res['out'])}  ({res['bytes']:,} bytes)")]
    if res["format"] in ("npz", "safetensors"):
        rows.append(("tensors", f"{res['names']} ({res['values']:,} values)"))
    if res["format"] == "pt2":
        rows += [("verified on", f"{res['verified_on']}, loaded back, vs PyTorch"),
                 ("max abs diff", f"{res['max_abs_diff']:.3g} (logits)"),
                 ("labels agree", f"{100 * res['label_agreement']:.2f}%"),
                 ("test accuracy", f"{100 * res['pt2_acc']:.2f}% (PyTorch {100 * res['torch_acc']:.2f}%)")]
    if res["format"] == "onnx":
        rows += [("verified on", f"{res['verified_on']} in onnxruntime vs PyTorch"),
                 ("max abs diff", f"{res['max_abs_diff']:.3g} (logits)"),
                 ("labels agree", f"{100 * res['label_agreement']:.2f}%")]
        q = res.get("int8")
        if q is None:
            rows.append(("test accuracy", f"{100 * res['onnx_acc']:.2f}% (PyTorch {100 * res['torch_acc']:.2f}%)"))
        else:
            rows.append(("wrote int8", f"{display(q['out'])}  ({q['bytes']:,} bytes)"))
            w = max(len(f"{res['bytes']:,}"), len(f"{q['bytes']:,}"))
            rows += [("", f"{'model':<6} {'bytes':>{w}}  {'size':>6}  {'test acc':>8}  agree w/ torch"),
                     ("", f"{'float':<6} {res['bytes']:>{w},}  {'100%':>6}  {100 * res['onnx_acc']:7.2f}%  "
                          f"{100 * res['label_agreement']:.2f}%"),
                     ("", f"{'int8':<6} {q['bytes']:>{w},}  {100 * q['bytes'] / res['bytes']:5.1f}%  "
                          f"{100 * q['acc']:7.2f}%  {100 * q['label_agreement']:.2f}%")]
    if res["format"] == "web":
        rows = [("wrote", f"{display(res['out'])}{os.sep}  ({res['bytes']:,} bytes in {len(res['files'])} files; "
                          f"model.js {res['files']['model.js']:,})"),
                ("verified on", f"{res['verified_on']}: the page's graph in PyTorch vs the model"),
                ("max diff", f"{res['max_prob_diff']:.3g} (probabilities), {res['max_layer_diff']:.3g} (layers)"),
                ("open", f"python -m http.server -d {display(res['out'])}  (or its index.html from disk)")]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}   {v}" for k, v in rows)
