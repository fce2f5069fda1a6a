"""The exported page: a folder that runs the model in a browser, with no server and no network.

    files = page_files(graph, model, info)   # {"index.html": bytes, "model.js": ..., ...}
    write_folder(Path("runs/fast-1/model-web"), files)

The folder holds the served page's ``index.html`` (with ``model.js`` loaded before the
backend), ``app.js`` and ``style.css`` (``server/static``), ``backend.js`` (the concatenation
of ``server/static/web``'s ``prepare.js``, ``forward.js`` and ``local.js``: the page's
``window.mnistflow`` answered in the browser) and ``model.js``: one script that sets
``window.mnistflowModel`` to the graph, the model's description and its weights (float32,
little-endian, base64). A script, not a file fetched: the folder works from a static server and
from disk (``file://``), where pages may not fetch local files.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import tempfile
from importlib import resources
from pathlib import Path

import numpy as np
import torch.nn as nn

from mnistflow.artifacts.model_info import ModelInfo
from mnistflow.artifacts.web.graph import Graph
from mnistflow.core.errors import os_error
from mnistflow.core.limits import MAX_BODY_BYTES, MAX_LAYER_VALUES, MAX_REQUEST_PIXELS

__all__ = ["FILES", "model_json", "page_files", "is_web_export", "write_folder"]

FILES = ("index.html", "app.js", "style.css", "backend.js", "model.js")
BACKEND = ("prepare.js", "forward.js", "local.js")  # server/static/web, in this order


def model_json(info: ModelInfo, params: int, backend: str = "browser", *, max_body: int = MAX_BODY_BYTES,
               max_pixels: int = MAX_REQUEST_PIXELS) -> dict:
    """What ``GET /api/model`` answers for this model (``server.app.describe``'s fields), plus
    ``picture``: how a drawing becomes one of the dataset's images (``data.picture.Target``)."""
    import math

    from mnistflow.data.picture import Target

    c, h, w = info.in_shape
    metrics = {k: v for k, v in (info.metrics or {}).items()
               if isinstance(v, (int, float)) and math.isfinite(v)}
    return {
        "model": info.model, "dataset": info.dataset, "backend": backend,
        "params": params, "in_shape": [c, h, w], "input_size": f"{h}x{w}x{c}",
        "class_names": list(info.class_names), "num_classes": info.num_classes,
        "label_values": info.values,
        "test_acc": metrics.get("test_acc"), "val_acc": metrics.get("val_acc"),
        "background": "dark" if sum(info.mean) / len(info.mean) < 127 else "light",
        "max_body_bytes": max_body, "max_pixels": max_pixels,
        "picture": Target.of(info.in_shape, info.mean, info.dataset).style,
    }


def _kernels(g: Graph, model: nn.Module) -> dict:
    """Every convolution's weights, for ``kernel(layer, channel)`` (``artifacts.layers.kernel``):
    the graph's own tensor when the forward used it, else added."""
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.modules.conv._ConvNd) and not mod.transposed:
            k = g.sources.get(id(mod.weight))
            if k is None:
                g.tensors.append(mod.weight.detach().float().contiguous().numpy().copy())
                k = g.sources[id(mod.weight)] = len(g.tensors) - 1
            out[name] = {"tensor": k, "groups": mod.groups, "in_channels": mod.in_channels,
                         "out_channels": mod.out_channels}
    return out


def model_script(g: Graph, model: nn.Module, info: ModelInfo) -> bytes:
    """``model.js``: ``window.mnistflowModel = {...}`` (see the module docstring)."""
    kernels = _kernels(g, model)
    offsets = np.cumsum([0] + [t.size for t in g.tensors]).tolist()
    blob = b"".join(np.ascontiguousarray(t, "<f4").tobytes() for t in g.tensors)
    c = info.in_shape[0]
    mean = np.asarray(info.mean, np.float32)  # data.normalize's float32 arithmetic, exactly
    inv_std = np.float32(1.0) / np.asarray(info.std, np.float32)
    doc = {
        "format": 1,
        "info": model_json(info, sum(p.numel() for p in model.parameters())),
        "normalize": {"mean": [float(v) for v in mean], "inv_std": [float(v) for v in inv_std[:c]]},
        "nodes": g.nodes, "output": g.output, "layers": g.layers,
        "tensors": [{"offset": o, "shape": list(t.shape)} for o, t in zip(offsets, g.tensors)],
        "kernels": kernels, "max_kernel_values": MAX_LAYER_VALUES,
        "modules": {name: type(m).__name__ for name, m in model.named_modules() if name},
    }
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    return (f"// mnistflow export --format web: the model {info.model} (graph, weights)\n"
            f"window.mnistflowModel = {text};\n"
            f"window.mnistflowModel.weights = \"{base64.b64encode(blob).decode()}\";\n").encode()


def _static(name: str) -> bytes:
    return (resources.files("mnistflow") / "server" / "static" / name).read_bytes()


def page_html(html: str) -> str:
    """The served ``index.html`` for the folder: paths relative (``/static/app.js`` -> ``app.js``)
    and ``model.js`` loaded before the backend (the backend too, if the page does not load one)."""
    html = html.replace('"/static/', '"')
    tag = re.search(r'<script\b[^>]*\bsrc="backend\.js"', html)
    if tag is not None:
        return html[:tag.start()] + '<script src="model.js"></script>\n  ' + html[tag.start():]
    tag = re.search(r'<script\b[^>]*\bsrc="app\.js"', html)
    if tag is None:
        raise RuntimeError("server/static/index.html loads no app.js")
    return (html[:tag.start()] + '<script src="model.js"></script>\n  <script src="backend.js"></script>\n  '
            + html[tag.start():])


def page_files(g: Graph, model: nn.Module, info: ModelInfo) -> dict[str, bytes]:
    """Every file of the folder, by name (``FILES``)."""
    backend = b"\n".join(b"// ---- " + name.encode() + b"\n" + _static(f"web/{name}") for name in BACKEND)
    return {"index.html": page_html(_static("index.html").decode()).encode(), "app.js": _static("app.js"),
            "style.css": _static("style.css"), "backend.js": backend, "model.js": model_script(g, model, info)}


def is_web_export(path: Path) -> bool:
    """Whether the folder ``path`` holds a web export (its files and nothing else), which
    ``--force`` (or the default place) may replace; an empty folder counts as one."""
    try:
        names = set(os.listdir(path))
    except OSError:
        return False
    return not names or (names <= set(FILES) and {"index.html", "model.js"} <= names)


def write_folder(out: Path, files: dict[str, bytes]) -> None:
    """``files`` as the folder ``out``, written beside it first and then renamed into place: a
    failure leaves ``out`` as it was. An earlier folder there is replaced (the caller checked
    that it may be)."""
    parent = out.parent
    tmp = None
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private
        for name, data in files.items():
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        old = None
        if os.path.lexists(out):
            old = tmp.with_name(tmp.name + ".old")
            os.rename(out, old)
        try:
            os.rename(tmp, out)
        except OSError:
            if old is not None:
                os.rename(old, out)  # as it was
            raise
        tmp = None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        raise os_error(e) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

