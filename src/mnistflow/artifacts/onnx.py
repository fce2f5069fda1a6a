"""ONNX: writing a model as ONNX bytes, and running an ONNX file as a predictor backend.

    mnistflow export runs/fast-1 --format onnx   # to_onnx (exporting.py verifies, then writes)
    mnistflow eval runs/fast-1/model.onnx        # OnnxBackend: onnxruntime on the CPU
    mnistflow serve runs/fast-1/model.onnx

The ONNX model takes ``input`` (N, C, H, W) float32, normalized, with a dynamic batch, gives
``logits`` (N, K), and carries the model's info (class names, normalization) in
``metadata_props['mnistflow']``. onnx, onnxscript and onnxruntime are optional
(``pip install 'mnistflow[onnx]'``) and imported inside the functions that need them.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import io
import logging
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np
import torch
import torch.nn as nn

from mnistflow.artifacts.model_file import unwrap
from mnistflow.artifacts.model_info import META_KEY, ModelInfo, info_from_json
from mnistflow.artifacts.onnx_check import GraphCost, check_onnx_file
from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError, import_optional
from mnistflow.core.fsutil import regular_file
from mnistflow.data.normalize import normalize_np

if TYPE_CHECKING:
    import onnxruntime


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """The exporters (torch.onnx, torch.export) print progress and warnings (e.g. 'torchvision
    is not installed'; a failed trace's partial graph, on stderr); the user sees our result
    table, or our one error line, instead. Errors still propagate."""
    loggers = [logging.getLogger(n) for n in ("torch", "torch.onnx", "torch.export", "torch._export",
                                               "onnxscript", "onnx_ir", "root", "")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


def to_onnx(model: nn.Module, info: ModelInfo) -> bytes:
    """The model as ONNX bytes: input ``input`` (N, C, H, W) float32 with a dynamic batch,
    output ``logits`` (N, K); the info is stored in ``metadata_props['mnistflow']``."""
    import_optional("onnxscript")
    onnx = import_optional("onnx")
    model = unwrap(model).cpu().eval()
    arg = next(iter(inspect.signature(model.forward).parameters))  # 'input' for nn.Sequential
    x = torch.zeros(2, *info.in_shape)
    try:
        with quiet_exporter():
            prog = torch.onnx.export(model, (x,), dynamo=True, input_names=["input"],
                                     output_names=["logits"],
                                     dynamic_shapes={arg: {0: torch.export.Dim("batch")}})
    except Exception as e:
        raise MnistflowError(f"ONNX export of '{info.model}' failed "
                             f"({e.__class__.__name__}: {str(e).splitlines()[0][:200]})") from None
    proto = prog.model_proto
    onnx.helper.set_model_props(proto, {META_KEY: info.to_json()})
    proto.doc_string = f"mnistflow {info.model} ({info.dataset}); input normalized: (x - mean) / std"
    return proto.SerializeToString()


def session(model: bytes | str | Path, threads: int | None = None) -> onnxruntime.InferenceSession:
    """An onnxruntime CPU session for ONNX bytes or a file (``threads``: intra-op threads,
    default torch's); an unloadable model is a one-line ``MnistflowError``."""
    ort = import_optional("onnxruntime")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or torch.get_num_threads()
    opts.log_severity_level = 3
    src = model if isinstance(model, bytes) else str(model)
    try:
        return ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own exception types
        raise MnistflowError(f"not a loadable ONNX model ({str(e).splitlines()[0][:160]})",
                             None if isinstance(model, bytes) else model) from None


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(1, keepdims=True)


class OnnxBackend:
    """An ONNX model run by onnxruntime on the CPU, behind the predictor interface:
    ``logits(normalized batch)`` and ``predict(uint8 images) -> probabilities``. Safe to call
    from several threads at once (``InferenceSession.run``).

    A file's graph is checked before it runs (``artifacts.onnx_check``); what it computes is
    checked on every call: float logits (N, K), K the metadata's classes, all finite, else one
    error line. Each onnxruntime call takes at most ``cost.max_batch`` images and is stopped
    after ``deadline`` seconds (its terminate flag: the thread ends, the error is one line)."""

    backend = "onnxruntime"
    device = torch.device("cpu")

    def __init__(self, sess, info: ModelInfo, path: Path | None = None, cost: GraphCost | None = None):
        self.session, self.info, self.path = sess, info, path
        self.input_name = sess.get_inputs()[0].name
        self.max_batch = cost.max_batch if cost is not None else None
        self.deadline = limits.MAX_ONNX_RUN_SECONDS

    def run(self, x: np.ndarray, batch_size: int = 1000) -> np.ndarray:
        """Logits (N, K) float32 of a normalized float32 (N, C, H, W) array, in batches."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        step = min(batch_size, self.max_batch or batch_size)
        out = [self._call(x[i:i + step]) for i in range(0, len(x), step)]
        return np.concatenate(out) if out else np.zeros((0, self.info.num_classes), np.float32)

    def _call(self, x: np.ndarray) -> np.ndarray:
        """One onnxruntime call under the deadline, and its logits checked."""
        import onnxruntime as ort

        opts = ort.RunOptions()
        stopped = threading.Event()

        def stop() -> None:
            stopped.set()
            opts.terminate = True

        timer = threading.Timer(self.deadline, stop)
        timer.daemon = True
        timer.start()
        try:
            out = self.session.run(None, {self.input_name: x}, opts)[0]
        except Exception as e:  # onnxruntime's own exception types
            if stopped.is_set():
                raise MnistflowError(f"the model took over {self.deadline:g} s for {len(x)} image(s); "
                                     "stopped", self.path) from None
            raise MnistflowError(f"onnxruntime could not run the model ({' '.join(str(e).split())[:200]})",
                                 self.path) from None
        finally:
            timer.cancel()
        return self._checked(out, len(x))

    def _checked(self, out: object, n: int) -> np.ndarray:
        """``out`` as float32 logits (n, K), else one error line: a graph that computes other
        than it declares (5 classes under 10 names, strings, integers, NaN)."""
        k = self.info.num_classes
        if not isinstance(out, np.ndarray) or out.dtype.kind != "f" or out.shape != (n, k):
            what = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, np.ndarray) else type(out).__name__
            raise MnistflowError(f"the model computed {what} for {n} image(s), not float logits "
                                 f"({n}, {k}) for its {k} classes; refusing its answers", self.path)
        out = out.astype(np.float32, copy=False)
        bad = int((~np.isfinite(out)).any(1).sum())
        if bad:
            raise MnistflowError(f"the model computed NaN or infinite logits for {bad} of {n} image(s); "
                                 "refusing its answers", self.path)
        return out

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a normalized (N, C, H, W) batch, as a CPU tensor: the model's forward."""
        return torch.from_numpy(self.run(x.detach().to("cpu", torch.float32).numpy()))

    @functools.cached_property
    def params(self) -> int | None:
        """Parameters of the source model (shown by ``serve``), None when unknown."""
        return _source_params(self.path, self.info) if self.path is not None else None

    __call__ = logits  # stands in for a model's forward where a function x -> logits is taken

    def predict(self, batch: np.ndarray) -> np.ndarray:
        """uint8 images (N, H, W, C) at the model's size -> class probabilities (N, K)."""
        return _softmax(self.run(normalize_np(batch, self.info.mean, self.info.std)))


def _source_params(path: Path, info: ModelInfo) -> int | None:
    """Parameters of the model an ONNX file was exported from (the export folds some, e.g.
    batch norm, into others); else its initializers; None when neither can be read."""
    try:
        from mnistflow.models import create_model

        with torch.device("meta"):  # counted, never allocated (the metadata may be hostile)
            model = create_model(info.model, tuple(info.in_shape), info.num_classes)
        return sum(p.numel() for p in model.parameters())
    except Exception:  # a model this mnistflow does not know: count the file's weights
        pass
    try:
        import onnx

        m = onnx.load(str(path), load_external_data=False)
        return int(sum(int(np.prod(t.dims)) for t in m.graph.initializer))
    except Exception:  # onnx is optional (the count is only shown)
        return None


def _check_io(sess, info: ModelInfo, path: Path) -> None:
    """The session's input (N, C, H, W) and output (N, K) against the metadata's in_shape and
    class count (a fixed dimension that differs is an error; a symbolic one is taken as is)."""
    ins, outs = sess.get_inputs(), sess.get_outputs()
    if len(ins) != 1 or not outs:
        raise MnistflowError(f"ONNX model has {len(ins)} inputs and {len(outs)} outputs; "
                             "expected one image input and logits", path)

    def fits(shape, want) -> bool:
        return isinstance(shape, list) and len(shape) == len(want) and all(
            not isinstance(d, int) or w is None or d == w for d, w in zip(shape, want))

    c, h, w = info.in_shape
    if not fits(ins[0].shape, [None, c, h, w]):
        raise MnistflowError(f"ONNX input shape {ins[0].shape} does not match the metadata's "
                             f"in_shape {c}x{h}x{w}", path)
    if outs[0].type not in ("tensor(float)", "tensor(float16)", "tensor(double)"):
        raise MnistflowError(f"ONNX output is {outs[0].type}, not float logits", path)
    if not fits(outs[0].shape, [None, info.num_classes]):
        raise MnistflowError(f"ONNX output shape {outs[0].shape} does not match the metadata's "
                             f"{info.num_classes} classes", path)


def load_onnx(path: str | Path, threads: int | None = None) -> tuple[OnnxBackend, ModelInfo]:
    """An ``.onnx`` file written by ``mnistflow export`` as a backend, and its info; the
    initializers, the graph (``artifacts.onnx_check``), the metadata and the input/output shapes
    are validated, and one blank image is run through it (its answer checked as every later one
    is): a model that cannot answer is refused before any data is read or any request served."""
    p = regular_file(path, limits.MAX_MODEL_BYTES, "ONNX model")  # before onnx / onnxruntime read it whole
    cost = check_onnx_file(p)
    sess = session(p, threads)
    try:
        meta = sess.get_modelmeta().custom_metadata_map
    except UnicodeDecodeError:  # found by fuzzing: protobuf strings are not checked on load
        raise MnistflowError("ONNX model metadata is not UTF-8 text", p) from None
    if META_KEY not in meta:
        raise MnistflowError("ONNX model has no mnistflow metadata (export it with "
                             "'mnistflow export --format onnx')", p)
    info = info_from_json(meta[META_KEY], p)
    _check_io(sess, info, p)
    backend = OnnxBackend(sess, info, p, cost)
    backend.run(np.zeros((1, *info.in_shape), np.float32))
    return backend, info
