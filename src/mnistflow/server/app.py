"""``mnistflow serve``: the draw-a-digit page and a JSON API for a trained model.

    mnistflow serve runs/fast-20250101-120000            # open http://127.0.0.1:8000/
    mnistflow serve runs/fast-20250101-120000/model.safetensors --port 8080
    mnistflow serve model.onnx                           # inference in ONNX Runtime
    curl -s -F file=@digit.png http://127.0.0.1:8000/api/predict
    curl -s -H 'Content-Type: image/png' --data-binary @digit.png http://127.0.0.1:8000/api/predict
    curl -s -H 'Content-Type: application/json' \
         -d '{"pixels": [[0, 0, 255, 0], [0, 0, 255, 0], [0, 0, 255, 0], [0, 0, 255, 0], [0, 0, 255, 0]]}' \
         http://127.0.0.1:8000/api/predict
    curl -s http://127.0.0.1:8000/api/model

Routes: ``GET /`` the page (its files beside it: ``/app.js``, ``/backend.js``, ``/style.css``;
nothing from the network), ``POST /api/predict`` (an image body, a multipart/form-data upload
of one image, or JSON pixels; see ``inputs`` for the preparation) -> ``{"label", "name",
"class_name", "index", "probabilities", "model", "latency_ms", "preprocess"}`` (``label``: the
data's own label value, e.g. 1..26; ``index``: the model output, the position in
``probabilities``; ``name`` = ``class_name``: the class's name), plus ``input``, the picture
the model saw (H x W or H x W x C), with ``?input=1``; ``POST /api/layers`` (the same bodies)
-> every layer's activations, ``{"layers": [{"name", "kind", "shape", "values"}, ...],
"probabilities", ...}`` (``artifacts.layers``: bounded by ``core.limits.MAX_LAYER_VALUES``, a
truncated layer has ``truncated`` and the ``channels`` kept; ``?input=1`` as above;
``?encoding=f16``: each layer's values as base64 float16, what the page reads);
``GET /api/kernel?layer=NAME&channel=K`` -> ``{"layer", "channel", "shape",
"input_channels", "values"}``, the weights that produced channel K of convolution NAME;
``GET /api/model``; ``GET /healthz``. Bad requests get a 4xx and ``{"error": "..."}``; the
server keeps serving. Every bound (body size, pixels, concurrent decodes, header/body/work
deadlines, connections) and who may POST (the page's own origin, or a script that sends no
``Origin``) are in ``guard``. docs/serving.md is the user's guide.

The event loop only reads requests; decoding, preprocessing and inference run in a thread
pool, so requests are handled concurrently (one intra-op thread per request by default).
"""
from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mnistflow.core.errors import MnistflowError
from mnistflow.core.limits import MAX_BODY_BYTES, MAX_FORM_FIELD_BYTES, MAX_FORM_FIELDS
from mnistflow.core.log import warn
from mnistflow.data.picture import Target
from mnistflow.server.guard import (
    LOCAL_HOSTS,
    BadInput,
    Deadline,
    Limits,
    Slots,
    body_kind,
    check_host,
    check_origin,
)
from mnistflow.server.connection import server_config
from mnistflow.server.inputs import decode_image, is_json, parse_json, to_input
from mnistflow.server.predictor import Predictor, load_predictor

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from mnistflow.artifacts.layers import Layer
    from starlette.requests import Request

STATIC = Path(__file__).parent / "static"
PAGE_HEADERS = {  # the page may load nothing from elsewhere
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; object-src 'none'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def describe(pred: Predictor, limits: Limits | None = None) -> dict:
    """What ``GET /api/model`` returns and the page's model panel shows; ``picture`` is how a
    picture becomes one of the dataset's images (``data.picture.STYLES``: the page's words and,
    in the web export, its own preparation follow it)."""
    info = pred.info
    c, h, w = info.in_shape
    metrics = {k: v for k, v in (info.metrics or {}).items()
               if isinstance(v, (int, float)) and math.isfinite(v)}
    return {
        "model": info.model, "dataset": info.dataset, "backend": pred.backend,
        "params": pred.params, "in_shape": [c, h, w], "input_size": f"{h}x{w}x{c}",
        "class_names": list(info.class_names), "num_classes": info.num_classes,
        "label_values": info.values,
        "test_acc": metrics.get("test_acc"), "val_acc": metrics.get("val_acc"),
        "background": "dark" if sum(info.mean) / len(info.mean) < 127 else "light",
        "picture": Target.of(info.in_shape, info.mean, info.dataset).style,
        "max_body_bytes": limits.max_body if limits else MAX_BODY_BYTES,
        "max_pixels": (limits or Limits()).max_pixels,
    }


_DEFAULT_LIMITS = Limits()


def classify(pred: Predictor, body: bytes, content_type: str, mode: str | None,
             with_input: bool = False, limits: Limits | None = None) -> dict:
    """One request body -> the prediction (runs in a worker thread)."""
    x, used = body_input(pred, body, content_type, mode, limits)
    p = pred.predict(x[None])[0]
    if not np.isfinite(p).all():
        raise RuntimeError("the model returned non-finite probabilities")
    k = int(p.argmax())
    name = pred.info.class_names[k]
    res = {"label": pred.info.label(k), "name": name, "class_name": name, "index": k,
           "probabilities": [round(float(v), 6) for v in p], "model": pred.info.model,
           "preprocess": used}
    if with_input:
        res["input"] = (x[..., 0] if x.shape[2] == 1 else x).tolist()
    return res


def body_input(pred: Predictor, body: bytes, content_type: str, mode: str | None,
               limits: Limits | None = None) -> tuple[np.ndarray, str]:
    """One request body (a picture or JSON pixels) -> (the uint8 H x W x C image the model
    sees, the preparation used); what ``/api/predict`` and ``/api/layers`` both read."""
    limits = limits or _DEFAULT_LIMITS
    if is_json(content_type, body):
        img, json_mode = parse_json(body)
        mode = json_mode or mode
    else:
        img = decode_image(body, limits)
    return to_input(img, pred.info, mode, limits.min_side)


ENCODINGS = ("json", "f16")  # how /api/layers writes the activations (``?encoding=``)


def layer_view(pred: Predictor, body: bytes, content_type: str, mode: str | None,
               with_input: bool = False, encoding: str = "json", limits: Limits | None = None) -> dict:
    """One request body -> every layer's activations (``artifacts.layers``), as JSON; runs in a
    worker thread. ``encoding``: ``json``, each layer's values a flat (row-major) list rounded
    to 4 decimals, a NaN or infinite one as null; ``f16``, a base64 string of little-endian
    float16 (for the page's pictures: far quicker to write and read than JSON numbers; values
    past float16's range clipped to it). The probabilities are always a list. ``with_input``: the picture the
    model saw too, as ``/api/predict?input=1`` gives it. A model without PyTorch layers (ONNX)
    is a 501."""
    from mnistflow.artifacts.layers import layers, torch_model

    if encoding not in ENCODINGS:
        raise BadInput(422, f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding[:20]!r}")
    try:
        torch_model(pred)
    except MnistflowError as e:
        raise BadInput(501, str(e)) from None
    x, used = body_input(pred, body, content_type, mode, limits)
    found = layers(pred, pred.info, x)
    out = [_layer_json(layer, encoding) for layer in found[:-1]]
    probs = found[-1].values
    if not np.isfinite(probs).all():
        raise RuntimeError("the model returned non-finite probabilities")
    out.append({"name": found[-1].name, "kind": found[-1].kind, "shape": list(found[-1].shape),
                "values": [round(float(v), 6) for v in probs]})
    res = {"layers": out, "probabilities": out[-1]["values"], "model": pred.info.model,
           "preprocess": used, "truncated": any(layer.truncated for layer in found),
           "encoding": encoding}
    if with_input:
        res["input"] = (x[..., 0] if x.shape[2] == 1 else x).tolist()
    return res


def _layer_json(layer: Layer, encoding: str) -> dict:
    """One ``artifacts.layers.Layer`` as ``layer_view`` writes it."""
    if encoding == "f16":  # np.clip keeps a NaN; an infinity becomes float16's largest
        half = np.clip(layer.values, -65504, 65504).astype("<f2")
        values = base64.b64encode(half.tobytes()).decode("ascii")
    else:
        values = layer.values.astype(np.float64).round(4).ravel().tolist()
        if not np.isfinite(layer.values).all():  # JSON has no NaN nor infinity: null
            values = [v if math.isfinite(v) else None for v in values]
    item = {"name": layer.name, "kind": layer.kind, "shape": list(layer.shape), "values": values}
    if layer.truncated:
        item.update(truncated=True, channels=layer.channels)
    return item


def kernel_view(pred: Predictor, query: dict[str, str]) -> dict:
    """``GET /api/kernel?layer=NAME&channel=K``'s answer: channel K of convolution NAME's
    weights per input channel (``artifacts.layers.kernel``); a bad name or channel is a 4xx."""
    from mnistflow.artifacts.layers import kernel, torch_model

    layer, channel = query.get("layer"), query.get("channel")
    try:
        torch_model(pred, "kernels")
    except MnistflowError as e:
        raise BadInput(501, str(e)) from None
    if not layer or channel is None:
        raise BadInput(400, "give the layer and the channel: /api/kernel?layer=NAME&channel=K")
    if not (channel.isascii() and channel.isdigit()) or len(channel) > 9:
        raise BadInput(400, f"channel must be a channel number, got {channel[:20]!r}")
    try:
        weights, inputs = kernel(pred, layer, int(channel))
    except MnistflowError as e:
        raise BadInput(422, str(e)) from None
    return {"layer": layer, "channel": int(channel), "shape": list(weights.shape),
            "input_channels": inputs, "values": weights.astype(np.float64).round(6).ravel().tolist()}


def wants_input(request: Request) -> bool:
    """``?input=1``: the answer carries the picture the model saw."""
    return request.query_params.get("input", "0").lower() in ("1", "true")


async def read_request(request: Request, limits: Limits) -> tuple[bytes, str, str | None]:
    """A POST's picture: (its bytes, their Content-Type, the preparation asked for), after the
    checks ``guard`` makes before any work (origin, content type, the body's size and
    deadline); a multipart upload gives its file part (``read_upload``)."""
    check_origin(request.headers)
    content_type = request.headers.get("content-type", "")
    kind = body_kind(content_type)  # 415 before reading the body
    deadline = Deadline(limits.body_timeout)
    try:
        body = await read_body(request, limits.max_body)
    except asyncio.CancelledError:
        if not deadline.expired():
            raise
        raise BadInput(408, f"the request body did not arrive within {limits.body_timeout:g} s",
                       {"Connection": "close"}) from None
    finally:
        deadline.expired()
    mode = request.query_params.get("preprocess")
    if kind == "multipart":
        return await read_upload(request, body, mode)
    return body, content_type, mode


async def read_upload(request: Request, body: bytes, mode: str | None) -> tuple[bytes, str, str | None]:
    """The one file of a multipart/form-data ``body`` (already read within the body cap), a
    Content-Type for it (its part's, when that names an image or JSON; else sniffed) and the
    form's ``preprocess`` field (else ``mode``). Parsed by Starlette's form parser
    (python-multipart), its fields bounded by ``core.limits``; a malformed form is a 400."""
    from starlette.datastructures import UploadFile
    from starlette.exceptions import HTTPException
    from starlette.formparsers import MultiPartException
    from starlette.requests import Request

    async def replay() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(request.scope, replay).form(
            max_files=1, max_fields=MAX_FORM_FIELDS, max_part_size=MAX_FORM_FIELD_BYTES)
    except (HTTPException, MultiPartException) as e:  # HTTPException: the same, raised inside an app
        raise BadInput(400, f"bad multipart/form-data body: {getattr(e, 'detail', None) or e.message}") from None
    try:
        files = [v for _, v in form.multi_items() if isinstance(v, UploadFile)]
        if not files:
            raise BadInput(400, "no complete file part in the multipart/form-data body: send one "
                                "picture, e.g. curl -F file=@digit.png URL")
        data = await files[0].read()
        part_type = (files[0].content_type or "").lower()
    finally:
        await form.close()
    asked = form.get("preprocess")
    if not data:
        raise BadInput(400, "the uploaded file is empty")
    try:
        kind = body_kind(part_type)
    except BadInput:  # text/plain, none, ...: the bytes tell
        kind = "sniff"
    content_type = part_type if kind in ("image", "json") else "application/octet-stream"
    return data, content_type, asked if isinstance(asked, str) else mode


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body, refused with 413 past ``limit`` bytes (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise BadInput(400, "bad Content-Length header") from None
        if n > limit:
            raise BadInput(413, f"request body of {n:,} bytes: at most {limit:,}")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise BadInput(413, f"request body over {limit:,} bytes")
        chunks.append(chunk)
    if total == 0:
        raise BadInput(400, "empty body: send a PNG/JPEG image, or JSON {\"pixels\": [[...]]}")
    return b"".join(chunks)


def json_error(status: int, message: str, headers: dict | None = None):
    """A refusal as every route answers it: ``{"error", "status"}`` with that HTTP status."""
    from starlette.responses import JSONResponse

    return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers)


def create_app(model: str | Path | Predictor, *, threads: int = 1, limits: Limits | None = None,
               allowed_hosts: tuple[str, ...] | None = None) -> Front:
    """The Starlette app for a run directory, model file, ONNX export or a ready ``Predictor``.

    ``limits``: the server's bounds (``guard.Limits``; its defaults otherwise).
    ``allowed_hosts``: the host names the ``Host`` header may carry (None: any); ``serve`` on
    this machine passes the local names, which stops DNS rebinding."""
    try:
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.requests import ClientDisconnect
        from starlette.responses import FileResponse, JSONResponse, Response
        from starlette.routing import Route
        import python_multipart  # noqa: F401  (uploads: Starlette's form parser)
    except ImportError:
        raise MnistflowError("serving needs starlette, uvicorn and python-multipart: "
                             "pip install 'mnistflow[serve]'") from None

    limits = limits or Limits()
    hosts = None if allowed_hosts is None else frozenset(h.lower().strip("[]") for h in allowed_hosts)
    pred = model if hasattr(model, "predict") else load_predictor(model, threads, limits.work_timeout)
    model_json = describe(pred, limits)
    slots = Slots(limits.max_concurrent, limits.work_timeout)

    page_files = {p.name for p in STATIC.iterdir() if p.is_file()}

    async def page_file(request):  # the page's own files, beside it: index.html loads "app.js"
        name = request.path_params.get("name", "index.html")
        return FileResponse(STATIC / name, headers=PAGE_HEADERS) if name in page_files else json_error(404, "Not Found")

    async def healthz(request):
        return JSONResponse({"status": "ok", "model": pred.info.model, "backend": pred.backend})

    async def model_info(request):
        return JSONResponse(model_json)

    async def posted(request, work, *args):  # a picture in, work(pred, body, ..., *args, limits) out
        t0 = time.perf_counter()
        try:
            body, content_type, mode = await read_request(request, limits)
            res = await slots.run(work, pred, body, content_type, mode, *args, limits)
        except BadInput as e:
            return json_error(e.status, e.message, e.headers)
        except ClientDisconnect:  # the client left mid-body: nobody reads an answer, no traceback
            return Response(status_code=400)
        res["latency_ms"] = round(1000 * (time.perf_counter() - t0), 3)
        return JSONResponse(res)

    async def predict(request):
        return await posted(request, classify, wants_input(request))

    async def layer_activations(request):
        return await posted(request, layer_view, wants_input(request), request.query_params.get("encoding", "json"))

    async def conv_kernel(request):
        try:
            return JSONResponse(await slots.run(kernel_view, pred, dict(request.query_params)))
        except BadInput as e:
            return json_error(e.status, e.message, e.headers)

    async def http_error(request, exc):
        return json_error(exc.status_code, exc.detail)

    async def server_error(request, exc):  # a bug, not bad input: say so, keep serving
        return json_error(500, f"internal error ({exc.__class__.__name__})")

    routes = [
        Route("/", page_file, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/api/model", model_info, methods=["GET"]),
        Route("/api/predict", predict, methods=["POST"]),
        Route("/api/layers", layer_activations, methods=["POST"]),
        Route("/api/kernel", conv_kernel, methods=["GET"]),
        Route("/{name:str}", page_file, methods=["GET"]),  # no "/" in it: never /api/...
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})
    app.state.predictor = pred
    app.state.limits = limits
    return Front(app, hosts)


class Front:
    """ASGI wrapper in front of the app: a request whose ``Host`` is not one of ``hosts`` (when
    given) gets a JSON 403, and a ``Range`` header is dropped. RFC 9110 lets a server ignore
    ranges; the page's files are small, and Starlette would answer a bad range in plain text,
    not with the JSON error every other refusal gets."""

    def __init__(self, app, hosts: frozenset[str] | None):
        self.app, self.hosts, self.state = app, hosts, app.state

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k not in (b"range", b"if-range")]}
            if self.hosts is not None:
                headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                           if k == b"host"}
                try:
                    check_host(headers, self.hosts)
                except BadInput as e:
                    body = json.dumps({"error": e.message, "status": e.status}).encode()
                    await send({"type": "http.response.start", "status": e.status,
                                "headers": [(b"content-type", b"application/json"),
                                            (b"content-length", str(len(body)).encode())]})
                    await send({"type": "http.response.body", "body": body})
                    return
        await self.app(scope, receive, send)


def app_from_env() -> Front:
    """The app for ``--workers N``: each worker process loads the private copy of the model
    that ``serve`` checked (``_private_copy``); a failure is one line, not a traceback, and
    stops the server."""
    _quiet_bomb_warnings()
    hosts = os.environ.get("MNISTFLOW_SERVE_HOSTS")
    try:
        return create_app(os.environ["MNISTFLOW_SERVE_MODEL"],
                          threads=int(os.environ.get("MNISTFLOW_SERVE_THREADS", "1")),
                          limits=Limits(**json.loads(os.environ.get("MNISTFLOW_SERVE_LIMITS", "{}"))),
                          allowed_hosts=tuple(json.loads(hosts)) if hosts else None)
    except MnistflowError as e:
        from uvicorn.config import STARTUP_FAILURE  # uvicorn then stops, rather than restart it in a loop

        print(f"mnistflow: error: a server worker cannot load its model: {e}", file=sys.stderr, flush=True)
        sys.exit(STARTUP_FAILURE)


def _private_copy(model: str | Path) -> Path:
    """A copy, in a new private temporary folder, of the one file ``load_any`` reads for
    ``model``: what ``serve`` checks and every ``--workers`` process loads, so that all of them
    (a restarted one too) serve the same bytes even when the file is replaced meanwhile."""
    import shutil
    import tempfile

    from mnistflow.artifacts.load import resolve
    from mnistflow.core.fsutil import open_regular
    from mnistflow.core.limits import MAX_CHECKPOINT_BYTES

    src = resolve(model)
    folder = Path(tempfile.mkdtemp(prefix="mnistflow-serve-"))
    try:
        with open_regular(src, MAX_CHECKPOINT_BYTES, "model file") as f, open(folder / src.name, "xb") as out:
            shutil.copyfileobj(f, out, 1 << 20)
    except BaseException as e:
        shutil.rmtree(folder, ignore_errors=True)
        if isinstance(e, OSError):
            raise MnistflowError(f"cannot copy the model for the workers into {folder.parent} "
                                 f"({e.strerror or e})", src) from None
        raise
    return folder / src.name


def _quiet_bomb_warnings() -> None:
    """Pillow warns (a raw stderr line) about pictures past its own limit; the server refuses
    them itself right after reading their size, so the warning is noise in the server log."""
    import warnings

    from PIL import Image

    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


def _bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)  # proto TCP: asyncio then turns Nagle off
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)  # connections queue from now on, before uvicorn starts accepting
    except (OSError, UnicodeError) as e:
        raise MnistflowError(f"cannot listen on {host}:{port} ({getattr(e, 'strerror', None) or e})") from None
    sock.set_inheritable(True)
    return sock


def serve(model: str | Path, host: str = "127.0.0.1", port: int = 8000, *, workers: int = 1,
          threads: int | None = None, access_log: bool = False, limits: Limits | None = None,
          max_pixels: int | None = None) -> None:
    """Serve the page and the API until Ctrl-C. ``host`` other than this machine: a warning.

    ``threads``: intra-op threads per request (default ``$MNISTFLOW_THREADS``, else 1).
    ``limits``: the server's bounds (``guard.Limits``); ``max_pixels`` overrides its pixel cap
    (the CLI's ``--max-pixels``). With ``workers`` > 1, every worker loads a private copy of
    the model file, made and checked once here."""
    try:
        import uvicorn  # noqa: F401
    except ImportError:
        raise MnistflowError("serving needs starlette, uvicorn and python-multipart: "
                             "pip install 'mnistflow[serve]'") from None
    from mnistflow.runtime.cpu import env_threads

    threads = (env_threads() or 1) if threads is None else threads  # a bad $MNISTFLOW_THREADS: one line
    if workers < 1 or threads < 1:
        raise MnistflowError("--workers and --threads must be at least 1")
    if not 0 <= port <= 65535:
        raise MnistflowError(f"--port must be in 0..65535 (0: any free port), got {port}")
    limits = limits or Limits()
    if max_pixels is not None:
        if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
            raise MnistflowError(f"--max-pixels must be a positive integer, got {max_pixels!r}")
        limits = Limits(**{**limits.to_dict(), "max_pixels": max_pixels})
    copy = _private_copy(model) if workers > 1 else None
    try:
        _serve(copy or model, host, port, workers, threads, access_log, limits)
    finally:
        if copy is not None:
            import shutil

            shutil.rmtree(copy.parent, ignore_errors=True)
    print("stopped", flush=True)


def _serve(model: str | Path, host: str, port: int, workers: int, threads: int, access_log: bool,
           limits: Limits) -> None:
    import uvicorn

    hosts = LOCAL_HOSTS if host in LOCAL_HOSTS else None  # another address: names unknown
    app = create_app(model, threads=threads, limits=limits, allowed_hosts=hosts)  # a bad model: one line
    if host not in LOCAL_HOSTS:
        warn(f"--host {host} lets other machines reach this server; "
             "it has no authentication (the default, 127.0.0.1, is this machine only)")
    _quiet_bomb_warnings()
    sock = _bind(host, port)
    shown = f"[{host}]" if ":" in host else host
    pred = app.state.predictor
    print(f"serving {pred.info.model} ({pred.backend}) at http://{shown}:{sock.getsockname()[1]}/"
          f"  ({workers} worker{'s' * (workers > 1)}; Ctrl-C to stop)", flush=True)
    common = dict(log_level="warning", access_log=access_log, timeout_graceful_shutdown=5)
    try:
        if workers == 1:
            uvicorn.Server(server_config(app, limits, **common)).run(sockets=[sock])
        else:
            from uvicorn.supervisors import Multiprocess

            os.environ["MNISTFLOW_SERVE_MODEL"] = str(Path(model).resolve())
            os.environ["MNISTFLOW_SERVE_THREADS"] = str(threads)
            os.environ["MNISTFLOW_SERVE_LIMITS"] = json.dumps(limits.to_dict())
            if hosts is not None:
                os.environ["MNISTFLOW_SERVE_HOSTS"] = json.dumps(list(hosts))
            # a worker answers uvicorn's health check once Python and uvicorn are up in it: on a
            # busy machine that can take over uvicorn's 5 s, and it would be killed and restarted
            config = server_config("mnistflow.server.app:app_from_env", limits, factory=True,
                                   workers=workers, timeout_worker_healthcheck=30, **common)
            Multiprocess(config, sockets=[sock]).run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown
        pass
    finally:
        sock.close()
