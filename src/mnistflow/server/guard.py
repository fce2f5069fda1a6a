"""What keeps the server bounded: its limits, the checks a POST passes before any work, the
cap on concurrent decodes with a per-request deadline, and a connection that must send its
request headers in time.

    limits = Limits(max_pixels=8_000_000, work_timeout=60)   # defaults are in the fields
    app = create_app("runs/fast-1", limits=limits)

* Memory: a body is at most ``max_body`` bytes (413 past it); an image at most ``max_pixels``
  decoded pixels, checked from its header before decoding (JPEGs decode at up to 1/8 scale
  first), then reduced to ``work_side`` pixels a side before it becomes a numpy array; at
  most ``max_concurrent`` requests decode and run the model at once; at most
  ``max_connections`` connections are served (uvicorn answers 503 past it).
* Time: request headers must arrive within ``header_timeout`` seconds of a connection's first
  byte (or of its opening), else it is closed (a slowloris client holds nothing for long); a
  body within ``body_timeout`` (408); waiting for a slot plus decoding plus inference within
  ``work_timeout`` (503). Idle keep-alive connections close after uvicorn's 5 s.
* Who may POST: a browser page from another origin may send a "simple" request (a form
  post: text/plain, urlencoded or multipart/form-data, no preflight) to a server on
  127.0.0.1. Browsers send ``Origin`` with every POST (and ``Sec-Fetch-Site``), so a POST
  whose ``Origin`` is not this server's (``null`` included) or whose ``Sec-Fetch-Site`` is
  not same-origin is refused (403) before its body is read. A request with neither header
  comes from a script (curl, requests), not from a page: it may POST. The ``Content-Type``
  must be ``image/*``, ``application/json``, ``application/octet-stream`` or
  ``multipart/form-data`` (an upload: ``curl -F file=@digit.png``); anything else is a 415.
  Served on this machine only, a ``Host`` header other than a local name is refused too
  (403; DNS rebinding).

uvicorn's private API, and why uvicorn is pinned (``pyproject.toml``: ``uvicorn>=0.54,<0.55``,
the releases the server's tests passed on). The header deadline and the JSON answer to malformed HTTP
need the connection itself, which no public uvicorn hook gives, so :func:`guarded` subclasses
uvicorn's HTTP protocol class (``uvicorn.protocols.http.auto.AutoHTTPProtocol``: its httptools
or h11 implementation), overrides ``send_400_response`` (what it calls on a request it cannot
parse) and reads its ``cycle`` (``.response_complete``), ``server_state.default_headers``,
``loop`` and ``transport`` attributes. ``app.serve`` also starts ``--workers`` with
``uvicorn.supervisors.Multiprocess(config, sockets)``, whose signature has changed within 0.x.
None of these is documented API and any uvicorn release may change them: move the pin only
after tests/integration/test_serve_api.py and test_hostile_serve.py pass on the new release
(tests/unit/test_uvicorn_pin.py checks the installed uvicorn is within the pin).
httptools and h11 are reached only through uvicorn's protocol classes (none of their internals
is used here), so they need no pin of their own.
"""
from __future__ import annotations

import asyncio
import json
import os
import threading
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Awaitable, Callable, Mapping, TypeVar
from urllib.parse import urlsplit

from mnistflow.core.errors import MnistflowError
from mnistflow.core.limits import MAX_BODY_BYTES, MAX_REQUEST_PIXELS

if TYPE_CHECKING:
    import uvicorn

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def _slots() -> int:
    """Concurrent decodes + inferences: the usable cores (one intra-op thread each), at least
    4 (a request also waits on I/O) and at most 16 (each may hold ~40 MB while decoding)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return min(max(4, cpus), 16)


@dataclass(frozen=True)
class Limits:
    """The server's bounds (see the module docstring); every field has a documented default."""

    max_body: int = MAX_BODY_BYTES  # bytes of one request body
    max_pixels: int = MAX_REQUEST_PIXELS  # decoded pixels of one image (after JPEG draft scaling)
    work_side: int = 1024  # larger images are reduced (box filter) to this many pixels a side
    min_side: int = 4  # smaller images (unless at the model's exact size) are refused (400)
    max_concurrent: int = field(default_factory=_slots)  # decodes + inferences at once
    max_connections: int = 256  # uvicorn's limit_concurrency: 503 past it
    header_timeout: float = 10.0  # seconds for a request's headers to arrive
    body_timeout: float = 10.0  # seconds for its body
    work_timeout: float = 30.0  # seconds for a slot, the decode and the model

    def __post_init__(self):
        for name in ("max_body", "max_pixels", "work_side", "min_side", "max_concurrent", "max_connections"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise MnistflowError(f"server limit {name} must be a positive integer, got {v!r}")
        for name in ("header_timeout", "body_timeout", "work_timeout"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < float("inf"):
                raise MnistflowError(f"server limit {name} must be a positive number of seconds, got {v!r}")

    def to_dict(self) -> dict:
        return asdict(self)


class BadInput(Exception):
    """A request the server refuses: ``status`` (4xx/5xx) and a message for the JSON error."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


# --- who may POST ---------------------------------------------------------------------------

def _split(netloc: str) -> tuple[str | None, int | None]:
    """``host[:port]`` -> (lower-case host name without brackets, port or None); bad -> Nones."""
    try:
        u = urlsplit("//" + netloc.strip())
        return u.hostname, u.port
    except ValueError:
        return None, None


def check_host(headers: Mapping[str, str], allowed_hosts: frozenset[str] | None) -> None:
    """Refuse a ``Host`` that is not one of ``allowed_hosts`` (None: any)."""
    if allowed_hosts is not None and _split(headers.get("host", ""))[0] not in allowed_hosts:
        raise BadInput(403, f"Host {headers.get('host', '')[:100]!r} is not this server "
                           f"(it answers to {', '.join(sorted(allowed_hosts))})")


def check_origin(headers: Mapping[str, str]) -> None:
    """Refuse a request a page of another origin made: ``Origin`` other than this server's
    ``Host`` (``null`` included), or ``Sec-Fetch-Site`` other than same-origin/none."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise BadInput(403, f"cross-origin request refused (Sec-Fetch-Site: {site[:40]})")
    origin = headers.get("origin")
    if origin is None:
        return
    scheme, _, netloc = origin.strip().partition("://")
    default = {"http": 80, "https": 443}.get(scheme.lower())
    o_host, o_port = _split(netloc) if default else (None, None)
    h_host, h_port = _split(headers.get("host", ""))
    if o_host is None or (o_host, o_port or default) != (h_host, h_port or default):
        raise BadInput(403, f"cross-origin request refused (Origin {origin[:100]!r} is not this server)")


def body_kind(content_type: str) -> str:
    """``json``, ``image``, ``sniff`` (octet-stream: JSON when it starts like JSON) or
    ``multipart`` (an upload) for an accepted ``Content-Type``; anything else is a 415."""
    ct = content_type.split(";")[0].strip().lower()
    if ct == "application/json" or (ct.startswith("application/") and ct.endswith("+json")):
        return "json"
    if ct.startswith("image/"):
        return "image"
    if ct == "application/octet-stream":
        return "sniff"
    if ct == "multipart/form-data":
        return "multipart"
    raise BadInput(415, f"Content-Type {ct[:60] or '(none)'!r} refused: send an image as image/png, "
                       "image/jpeg, ... (or application/octet-stream, or a multipart/form-data "
                       "upload: curl -F file=@digit.png), or JSON pixels as application/json")


# --- bounded work -----------------------------------------------------------------------------

class Deadline:
    """Cancel the current task ``seconds`` from now unless ``expired()`` is called first: one
    timer per request, no extra task (``asyncio.wait_for`` would add one)."""

    __slots__ = ("task", "handle", "fired")

    def __init__(self, seconds: float):
        self.task, self.fired = asyncio.current_task(), False
        self.handle = asyncio.get_running_loop().call_later(seconds, self._fire)

    def _fire(self) -> None:
        if self.handle is not None:
            self.fired = True
            self.task.cancel()

    def expired(self) -> bool:
        """Disarm; True when the deadline passed (its cancellation is then taken back)."""
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
            if self.fired and hasattr(self.task, "uncancel"):  # Python 3.11+
                self.task.uncancel()
        return self.fired


_T = TypeVar("_T")


class Slots:
    """At most ``n`` calls of ``run`` at once in the thread pool, each answered within
    ``timeout`` seconds (waiting included) or refused with 503. A call that overran keeps its
    slot until its thread really finishes, so the bound holds."""

    def __init__(self, n: int, timeout: float):
        self.n, self.timeout = n, timeout
        self._sem: asyncio.Semaphore | None = None

    async def run(self, fn: Callable[..., _T], *args) -> _T:
        from anyio import to_thread

        if self._sem is None:  # created in the serving event loop
            self._sem = asyncio.Semaphore(self.n)
        sem, loop = self._sem, asyncio.get_running_loop()
        lock, state = threading.Lock(), ["queued"]  # queued -> running | dropped

        def work():
            with lock:
                if state[0] == "dropped":
                    return None
                state[0] = "running"
            try:
                return fn(*args)
            finally:
                loop.call_soon_threadsafe(sem.release)

        deadline = Deadline(self.timeout)
        acquired = False
        try:
            await sem.acquire()
            acquired = True
            return await to_thread.run_sync(work, abandon_on_cancel=True)
        except asyncio.CancelledError:
            if not deadline.expired():
                raise
            if not acquired:
                raise BadInput(503, f"the server is busy (no free slot within {self.timeout:g} s); "
                                    "try again", {"Retry-After": "1"}) from None
            raise BadInput(503, f"the request took over {self.timeout:g} s", {"Retry-After": "1"}) from None
        finally:
            deadline.expired()
            with lock:
                if acquired and state[0] == "queued":  # cancelled before its thread started
                    state[0] = "dropped"
                    sem.release()


# --- connections that must send their headers in time --------------------------------------------

def guarded(base: type) -> type:
    """A uvicorn HTTP protocol class that closes a connection whose request headers are not
    complete ``config.mnistflow_header_timeout`` seconds after it opened or after the first
    byte of its next request (uvicorn itself only times out idle keep-alive connections)."""

    class Guarded(base):
        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            self._mf_timeout = float(getattr(config, "mnistflow_header_timeout", Limits.header_timeout))
            self._mf_timer = None
            self._mf_cycle = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._mf_arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._mf_waiting():
                if self._mf_timer is None:
                    self._mf_arm()
            elif self._mf_timer is not None:
                self._mf_timer.cancel()
                self._mf_timer = None

        def connection_lost(self, exc) -> None:
            if self._mf_timer is not None:
                self._mf_timer.cancel()
                self._mf_timer = None
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            """A request uvicorn cannot parse (bad framing: a negative Content-Length, a NUL in a
            header) gets a JSON error like every other refusal, not uvicorn's plain text; the
            connection closes (its framing cannot be trusted), the server keeps serving."""
            body = json.dumps({"error": f"malformed HTTP request: {msg}", "status": 400}).encode()
            state = getattr(self, "server_state", None)  # httptools adds the server's default headers
            head = [b"HTTP/1.1 400 Bad Request\r\n",
                    *(n + b": " + v + b"\r\n" for n, v in getattr(state, "default_headers", ())),
                    b"content-type: application/json\r\n",
                    b"content-length: " + str(len(body)).encode() + b"\r\n", b"connection: close\r\n\r\n"]
            self.transport.write(b"".join(head) + body)
            self.transport.close()

        def _mf_waiting(self) -> bool:  # no request in progress: headers are (to be) awaited
            cycle = getattr(self, "cycle", None)
            return cycle is None or cycle.response_complete

        def _mf_arm(self) -> None:
            self._mf_cycle = getattr(self, "cycle", None)
            self._mf_timer = self.loop.call_later(self._mf_timeout, self._mf_expire)

        def _mf_expire(self) -> None:
            self._mf_timer = None
            if getattr(self, "cycle", None) is self._mf_cycle and self._mf_waiting() \
                    and not self.transport.is_closing():
                self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def _auto_protocol() -> type:
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return guarded(AutoHTTPProtocol)


def server_config(app: str | Callable[..., Awaitable[None]], limits: Limits, **kwargs) -> uvicorn.Config:
    """A ``uvicorn.Config`` for ``app`` (an app or an import string) that enforces ``limits``:
    the header deadline and the connection cap."""
    import uvicorn

    config = uvicorn.Config(app, http="mnistflow.server.guard:GuardedHTTPProtocol",
                            limit_concurrency=limits.max_connections, **kwargs)
    config.mnistflow_header_timeout = limits.header_timeout  # travels to --workers processes
    return config


def __getattr__(name: str):
    if name == "GuardedHTTPProtocol":  # built on first use: uvicorn is an optional extra
        cls = _auto_protocol()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
