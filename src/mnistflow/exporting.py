"""``mnistflow export``: a trained model as ONNX (deployment), npz (name -> array) or safetensors.

    mnistflow export runs/fast-1 --format onnx                  # verified against PyTorch
    mnistflow export runs/fast-1 --format onnx --quantize int8  # plus an int8 model, compared
    mnistflow export runs/fast-1 --format npz --only 'conv*'    # a subset of the parameters
    mnistflow export runs/fast-1/checkpoints/step-000400.pt --format safetensors --out w.safetensors
    mnistflow train --model seed-cnn --init-from runs/a/model.npz --init-only 'conv*'  # restore by name

The ONNX model has a dynamic batch dimension and carries the model's info (class names,
normalization) in its metadata; it is verified in onnxruntime against PyTorch on the real
test images of the model's records before it is written. The npz holds one array per
parameter/buffer name plus a reserved ``__mnistflow__`` entry (the info as uint8 JSON), so it
loads with ``allow_pickle=False``. onnx, onnxscript and onnxruntime are optional
(``pip install 'mnistflow[onnx]'``) and imported only here.
"""
from __future__ import annotations

import contextlib
import fnmatch
import io
import json
import logging
import os
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from mnistflow.artifacts.model_file import (MODEL_FILE, ModelInfo, OnnxModule, import_optional, info_from_json, load_any, unwrap)
from mnistflow.core.errors import MnistflowError, display
from mnistflow.core.fsutil import atomic_write_bytes

FORMATS = ("onnx", "npz", "safetensors")
NPZ_META_KEY = "__mnistflow__"
EXT = {"onnx": ".onnx", "npz": ".npz", "safetensors": ".safetensors"}


# --- npz ----------------------------------------------------------------------------------

def _globs(only) -> list[str]:
    if not only:
        return []
    items = [only] if isinstance(only, str) else list(only)
    return [g.strip() for item in items for g in str(item).split(",") if g.strip()]


def _selected(name: str, globs: list[str]) -> bool:
    return not globs or any(fnmatch.fnmatchcase(name, g) for g in globs)


def write_npz(path: str | Path, arrays: dict[str, np.ndarray], info: ModelInfo | None) -> None:
    """An npz of name -> array (no pickled objects), plus the info under ``__mnistflow__``."""
    if NPZ_META_KEY in arrays:
        raise MnistflowError(f"'{NPZ_META_KEY}' is a reserved name")
    entries = dict(arrays)
    if info is not None:
        meta = json.dumps({"format": "mnistflow-npz", "version": 1, "info": asdict(info)})
        entries[NPZ_META_KEY] = np.frombuffer(meta.encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **entries)
    atomic_write_bytes(path, buf.getvalue())


def read_npz(path: str | Path) -> tuple[dict[str, np.ndarray], ModelInfo | None]:
    """(name -> array, info or None) from an npz, opened with ``allow_pickle=False``."""
    p = Path(path)
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise MnistflowError("no such file", p) from None
    except ValueError as e:
        if "allow_pickle" in str(e) or "pickle" in str(e).lower():
            raise MnistflowError("refused: the npz holds pickled objects (loading them could "
                                 "execute code); only plain arrays are read", p) from None
        raise MnistflowError(f"not a readable npz ({e})", p) from None
    except (OSError, EOFError) as e:
        raise MnistflowError(f"not a readable npz ({e.__class__.__name__}: {e})", p) from None
    except Exception as e:  # zipfile.BadZipFile and friends
        raise MnistflowError(f"not a readable npz ({e.__class__.__name__}: {e})", p) from None
    info = None
    raw = arrays.pop(NPZ_META_KEY, None)
    if raw is not None:
        if raw.dtype != np.uint8 or raw.ndim != 1:
            raise MnistflowError(f"'{NPZ_META_KEY}' entry is not uint8 JSON", p)
        meta = json.loads(raw.tobytes().decode()) if raw.size else {}
        info = info_from_json(json.dumps(meta.get("info", {})), p)
    return arrays, info


@dataclass
class NpzReport:
    """What restoring by name did: every name is accounted for."""

    path: str
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # in the model (and selected), not in the file
    unexpected: list[str] = field(default_factory=list)  # in the file (and selected), not in the model
    mismatched: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # name, file, model shape
    skipped: list[str] = field(default_factory=list)  # not selected by --only

    @property
    def complete(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def problems(self) -> str:
        def short(v):
            return ", ".join(v[:5]) + (f" and {len(v) - 5} more" if len(v) > 5 else "")

        parts = []
        if self.missing:
            parts.append(f"missing in file: {short(self.missing)}")
        if self.unexpected:
            parts.append(f"unexpected: {short(self.unexpected)}")
        if self.mismatched:
            parts.append("shape mismatch: " + short([f"{n} (file {'x'.join(map(str, a)) or 'scalar'}, "
                                                      f"model {'x'.join(map(str, b)) or 'scalar'})"
                                                      for n, a, b in self.mismatched]))
        return "; ".join(parts) or "all names match"

    def format(self) -> str:
        head = (f"restored {len(self.loaded)} of {len(self.loaded) + len(self.missing) + len(self.mismatched)} "
                f"selected tensors from {display(self.path)}")
        if self.skipped:
            head += f" ({len(self.skipped)} not selected by --only)"
        return head + ("" if self.complete else f"; {self.problems()}")


def load_npz_into(model: nn.Module, path: str | Path, only=None, *,
                  arrays: dict[str, np.ndarray] | None = None) -> NpzReport:
    """Copy arrays into ``model``'s parameters/buffers by name (selected by ``only`` globs).

    Nothing is guessed: names missing from the file, names the model lacks and shape
    mismatches are reported (and left untouched) instead of failing obscurely.
    """
    if arrays is None:
        arrays, _ = read_npz(path)
    globs = _globs(only)
    target = unwrap(model)
    own = target.state_dict()
    rep = NpzReport(str(path))
    rep.skipped = sorted(k for k in set(own) | set(arrays) if not _selected(k, globs))
    new = {}
    for name, t in own.items():
        if not _selected(name, globs):
            continue
        if name not in arrays:
            rep.missing.append(name)
            continue
        a = arrays[name]
        if tuple(a.shape) != tuple(t.shape):
            rep.mismatched.append((name, tuple(a.shape), tuple(t.shape)))
            continue
        new[name] = torch.tensor(a, dtype=t.dtype)  # a copy; keeps 0-d arrays 0-d
        rep.loaded.append(name)
    rep.unexpected = sorted(k for k in arrays if k not in own and _selected(k, globs))
    if new:
        with torch.no_grad():
            for name, v in new.items():
                own[name].copy_(v)  # state_dict tensors share storage with the module
    return rep


# --- onnx ---------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet_exporter():
    """The exporter prints progress and warnings (e.g. 'torchvision is not installed'); the
    user sees our result table instead. Errors still propagate."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export",
                                               "onnxscript", "onnx_ir", "root", "")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


def to_onnx(model: nn.Module, info: ModelInfo) -> bytes:
    """The model as ONNX bytes: input ``input`` (N, C, H, W) float32 with a dynamic batch,
    output ``logits`` (N, K); the info is stored in ``metadata_props['mnistflow']``."""
    import inspect

    import_optional("onnxscript")
    onnx = import_optional("onnx")
    model = unwrap(model).cpu().eval()
    arg = next(iter(inspect.signature(model.forward).parameters))  # 'input' for nn.Sequential
    x = torch.zeros(2, *info.in_shape)
    try:
        with _quiet_exporter():
            prog = torch.onnx.export(model, (x,), dynamo=True, input_names=["input"],
                                     output_names=["logits"],
                                     dynamic_shapes={arg: {0: torch.export.Dim("batch")}})
    except Exception as e:
        raise MnistflowError(f"ONNX export of '{info.model}' failed "
                             f"({e.__class__.__name__}: {str(e).splitlines()[0][:200]})") from None
    proto = prog.model_proto
    onnx.helper.set_model_props(proto, {"mnistflow": json.dumps(asdict(info))})
    proto.doc_string = f"mnistflow {info.model} ({info.dataset}); input normalized: (x - mean) / std"
    return proto.SerializeToString()


def _ort_session(model: bytes | str):
    ort = import_optional("onnxruntime")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    opts.log_severity_level = 3
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def _normalized(images: np.ndarray, info: ModelInfo) -> np.ndarray:
    x = images.transpose(0, 3, 1, 2).astype(np.float32)
    c = x.shape[1]
    mean = np.asarray(info.mean, np.float32).reshape(1, c, 1, 1)
    std = np.asarray(info.std, np.float32).reshape(1, c, 1, 1)
    return (x - mean) / std


def _test_images(info: ModelInfo, data, split: str = "test") -> tuple[np.ndarray, np.ndarray, str]:
    from mnistflow.data.records import open_records

    if data is not None:
        from mnistflow.data.prepare import prepare

        rec = open_records(prepare(None, Path(data), quiet=True))
    elif info.records and Path(info.records).is_dir():
        rec = open_records(info.records)
    else:
        raise MnistflowError("the model's training records are gone; pass --data RECORDS_OR_RAW "
                             "(real images are needed to verify the export)")
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


def _logits_ort(sess, x: np.ndarray, bs: int = 1000) -> np.ndarray:
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i:i + bs]})[0] for i in range(0, len(x), bs)])


def quantize_int8(model_bytes: bytes, calib: np.ndarray) -> bytes:
    """Static int8 quantization (QDQ, per-channel int8 weights, uint8 activations), calibrated
    on ``calib`` (normalized training images)."""
    import_optional("onnx")
    q = import_optional("onnxruntime.quantization")
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory(prefix="mnistflow-q-") as tmp:
        src, pre, dst = (os.path.join(tmp, n) for n in ("f.onnx", "p.onnx", "q.onnx"))
        Path(src).write_bytes(model_bytes)
        name = _ort_session(model_bytes).get_inputs()[0].name
        batches = [{name: calib[i:i + 64]} for i in range(0, len(calib), 64)]

        class Reader(q.CalibrationDataReader):
            def __init__(self):
                self.it = iter(batches)

            def get_next(self):
                return next(self.it, None)

        try:
            with _quiet_exporter():
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
        return src / f"model{suffix}{EXT[fmt]}"
    folder = src.parent.parent if src.parent.name == "checkpoints" else src.parent
    return folder / f"{src.stem}{suffix}{EXT[fmt]}"


def export(model_path: str | Path, format: str, out: str | Path | None = None, only=None,
           quantize: str | None = None, *, model_name: str | None = None, data=None,
           verify_images: int | None = None) -> dict:
    """Python twin of ``mnistflow export``; returns what was written and measured."""
    fmt = format.lower()
    if fmt not in FORMATS:
        raise MnistflowError(f"unknown export format '{format}' (known: {', '.join(FORMATS)})")
    if quantize not in (None, "int8"):
        raise MnistflowError(f"--quantize supports int8, got '{quantize}'")
    if quantize and fmt != "onnx":
        raise MnistflowError("--quantize int8 applies to --format onnx")
    globs = _globs(only)
    if globs and fmt == "onnx":
        raise MnistflowError("--only selects parameters for npz/safetensors; ONNX needs the whole model")
    src = Path(model_path)
    model, info = load_any(src, model_name, "cpu", data=data)
    if isinstance(model, OnnxModule):
        raise MnistflowError("already an ONNX model; export from the run directory, a checkpoint, "
                             "model.safetensors or an npz", src)
    source_file = (src / MODEL_FILE if src.is_dir() else src).resolve()
    if out is None:
        out = default_out(src, fmt)
        if out.resolve() == source_file:  # e.g. safetensors of a run: RUN/model.weights.safetensors
            out = default_out(src, fmt, ".weights")
    out = Path(out)
    if out.resolve() == source_file:
        raise MnistflowError("would overwrite the source model; pass another --out FILE", out)
    res: dict = {"format": fmt, "source": str(src), "model": info.model, "out": str(out)}
    sd = {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}
    chosen = {k: v for k, v in sd.items() if _selected(k, globs)}
    if globs and not chosen:
        raise MnistflowError(f"--only {','.join(globs)} matches no name (names: "
                             f"{', '.join(list(sd)[:8])}{' ...' if len(sd) > 8 else ''})")
    if fmt == "npz":
        arrays = {k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in chosen.items()}
        write_npz(out, arrays, info)
        res.update(names=len(arrays), values=int(sum(a.size for a in arrays.values())))
    elif fmt == "safetensors":
        from safetensors.torch import save

        atomic_write_bytes(out, save({k: v.contiguous() for k, v in chosen.items()},
                                     metadata={"mnistflow": json.dumps(asdict(info))}))
        res.update(names=len(chosen), values=int(sum(v.numel() for v in chosen.values())))
    else:
        res.update(_export_onnx(model, info, out, quantize, data, verify_images))
    res["bytes"] = out.stat().st_size
    return res


def _export_onnx(model, info: ModelInfo, out: Path, quantize, data, verify_images) -> dict:
    t0 = time.perf_counter()
    blob = to_onnx(model, info)
    export_s = time.perf_counter() - t0
    x_u8, y, split = _test_images(info, data)
    if verify_images:
        x_u8, y = x_u8[:verify_images], y[:verify_images]
    x = _normalized(x_u8, info)
    sess = _ort_session(blob)
    ref = _logits_torch(model, x)
    got = _logits_ort(sess, x)
    one = sess.run(None, {sess.get_inputs()[0].name: x[:1]})[0]  # the batch dimension is dynamic
    max_diff = float(np.abs(ref - got).max())
    agree = float((ref.argmax(1) == got.argmax(1)).mean())
    scale = float(np.abs(ref).max()) or 1.0
    if agree < 0.999 or max_diff > 1e-3 * max(scale, 1.0) or one.shape != (1, info.num_classes):
        raise MnistflowError(f"the ONNX model does not match PyTorch (max abs diff {max_diff:.3g}, "
                             f"labels agree on {100 * agree:.2f}% of {len(x):,} images); not written")
    atomic_write_bytes(out, blob)
    res = {"export_s": round(export_s, 2), "verified_on": f"{len(x):,} images ({split})",
           "n_images": len(x), "max_abs_diff": max_diff, "label_agreement": agree,
           "torch_acc": _accuracy(ref, y), "onnx_acc": _accuracy(got, y)}
    if quantize == "int8":
        xc_u8, _, _ = _calibration_images(info, data)
        qblob = quantize_int8(blob, _normalized(xc_u8, info))
        qout = out.with_name(out.name[: -len(".onnx")] + ".int8.onnx") if out.name.endswith(".onnx") \
            else out.with_name(out.name + ".int8.onnx")
        qlogits = _logits_ort(_ort_session(qblob), x)
        atomic_write_bytes(qout, qblob)
        res["int8"] = {"out": str(qout), "bytes": qout.stat().st_size, "acc": _accuracy(qlogits, y),
                       "label_agreement": float((qlogits.argmax(1) == ref.argmax(1)).mean()),
                       "max_abs_diff": float(np.abs(qlogits - ref).max()),
                       "calibration_images": len(xc_u8)}
    return res


def _calibration_images(info: ModelInfo, data, n: int = 512, seed: int = 0):
    """``n`` training images (a fixed random sample) for int8 calibration."""
    from mnistflow.data.records import open_records

    if data is not None:
        from mnistflow.data.prepare import prepare

        rec = open_records(prepare(None, Path(data), quiet=True))
    else:
        rec = open_records(info.records)
    x, y = rec.split("train")
    idx = np.sort(np.random.default_rng(seed).choice(len(y), size=min(n, len(y)), replace=False))
    return np.asarray(x[idx]), np.asarray(y[idx]), "train"


def format_export(res: dict) -> str:
    """The export result as a small fixed-width table."""
    rows = [("wrote", f"{display(res['out'])}  ({res['bytes']:,} bytes)")]
    if res["format"] in ("npz", "safetensors"):
        rows.append(("tensors", f"{res['names']} ({res['values']:,} values)"))
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
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}   {v}" for k, v in rows)
