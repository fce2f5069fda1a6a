"""What keeps the server bounded: its limits, the checks a POST passes before any work, and the
cap on concurrent decodes with a per-request deadline. What one connection may cost (header
bytes and time, pipelining, idle sockets, the close after a refusal) is ``server.connection``'s.

    limits = Limits(max_pixels=8_000_000, work_timeout=60)   # defaults are in the fields
    app = create_app("runs/fast-1", limits=limits)

* Memory: a body is at most ``max_body`` bytes (413 past it); an image at most ``max_pixels``
  decoded pixels, checked from its header before decoding (JPEGs decode at up to 1/8 scale
  first; a progressive JPEG keeps every coefficient of its full size while decoding, so its
  full size is held to ``core.limits.MAX_PIXELS``), then reduced to ``work_side`` pixels a side
  before it becomes a numpy array; at most ``max_concurrent`` requests decode and run the model
  at once; a request's line and headers are at most ``max_header_bytes`` (431 past it); at most
  ``max_connections`` requests are in progress (503 past it) and connections open (past it,
  the one idle the longest is closed: sockets that send nothing cannot lock anyone out).
* Decode time: a JPEG of more than ``core.limits.MAX_JPEG_SCANS`` scans is refused before
  decoding (``data.formats.image.decode_cost_problem``: each scan is a pass over the image).
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
  (403; DNS rebinding). A ``Host`` (or ``Origin``) is ``host[:port]`` and nothing else: a
  user name (``evil@127.0.0.1``) or a path is no host. The request head reaches these checks
  as RFC 9112 defines it (one ``Host``; an absolute-form target's authority as the ``Host``):
  ``server.connection`` sees to that.
"""
from __future__ import annotations

import asyncio
import os
import re
import threading
from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping, TypeVar

from mnistflow.core.errors import MnistflowError
from mnistflow.core.limits import MAX_BODY_BYTES, MAX_HEADER_BYTES, MAX_REQUEST_PIXELS

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
    max_connections: int = 256  # requests in progress (503 past it) and open connections (see above)
    max_header_bytes: int = MAX_HEADER_BYTES  # a request's line and headers (431 past it)
    header_timeout: float = 10.0  # seconds for a request's headers to arrive
    body_timeout: float = 10.0  # seconds for its body
    work_timeout: float = 30.0  # seconds for a slot, the decode and the model

    def __post_init__(self):
        for name in ("max_body", "max_pixels", "work_side", "min_side", "max_concurrent", "max_connections",
                     "max_header_bytes"):
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

# host[:port] and nothing else: a name or IPv4 address, or an IPv6 literal in brackets
_AUTHORITY = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]+)(?::([0-9]{0,5}))?")


def _split(netloc: str) -> tuple[str | None, int | None]:
    """``host[:port]`` -> (lower-case host name without brackets, port or None); anything else
    (a user name, a path, a port past 65535, two values) -> Nones."""
    m = _AUTHORITY.fullmatch(netloc.strip())
    if m is None or (m.group(2) and int(m.group(2)) > 65535):
        return None, None
    return m.group(1).strip("[]").lower(), int(m.group(2)) if m.group(2) else None


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
