"""What one connection may cost the server, enforced where uvicorn reads it: its HTTP protocol.

    config = server_config(app, Limits())       # a uvicorn.Config with the guarded protocol
    uvicorn.Server(config).run(sockets=[sock])

* Header bytes: a request line plus headers over ``Limits.max_header_bytes`` is a 431 and a
  closed connection. The bytes are counted as they arrive, before the parser sees them: uvicorn
  keeps every header line until the headers end (a header flood grew a server by gigabytes).
* Header time: the headers must be complete ``Limits.header_timeout`` seconds after the
  connection opened or after the first byte of its next request, else it is closed.
* Pipelining: at most ``core.limits.MAX_PIPELINED`` requests may wait behind the one being
  answered; the connection of a client that sends more without reading the answers is closed.
* Capacity: a connection with no request in progress (nothing sent yet, headers still
  arriving, or idle between keep-alive requests) holds no capacity. At ``max_connections``
  open connections a new one closes the one idle the longest, so sockets held open without a
  word cannot lock anyone out; at ``max_connections`` requests in progress the next is a 503.
* The request head as RFC 9112 defines it, before the app's ``Host`` check (``guard``): one
  ``Host`` (two are a 400; HTTP/1.1 without one is a 400, HTTP/1.0 without one is for this
  server's own address), and an absolute-form target (``GET http://host/path``) has its
  authority as the ``Host``.
* Lingering close: when the server closes after refusing a request whose body is still
  arriving (413, 408, ...), it first stops sending, then reads and discards up to
  ``core.limits.LINGER_BYTES`` for up to ``LINGER_SECONDS``: a client that sends its whole body
  before reading (urllib, requests) gets the refusal instead of a connection reset.
* Every refusal is JSON, ``{"error", "status"}``, like the app's.

uvicorn's private API, and why uvicorn is pinned (``pyproject.toml``: ``uvicorn>=0.54,<0.55``,
the releases the server's tests passed on). None of this has a public uvicorn hook, so the
protocol subclasses ``uvicorn.protocols.http.httptools_impl.HttpToolsProtocol`` (httptools is
in the ``serve`` extra): it overrides ``connection_made``, ``data_received``,
``connection_lost``, ``shutdown``, ``send_400_response`` (what uvicorn calls on a request it
cannot parse, or when a parser callback raises), the parser callbacks ``on_headers_complete``,
``on_message_complete`` and ``on_response_complete``, and reads its ``cycle`` (``.more_body``,
``.response_complete``), ``pipeline``, ``headers``, ``url``, ``parser``, ``server``,
``tasks``, ``connections``, ``server_state``, ``app`` and ``loop`` attributes; it hands
uvicorn a wrapped transport (its ``close`` lingers). ``app.serve`` also starts ``--workers``
with ``uvicorn.supervisors.Multiprocess(config, sockets)``. None of these is documented API
and any uvicorn release may change them: move the pin only after
tests/integration/test_serve_api.py, test_hostile_serve.py and test_hostile_connections.py
pass on the new release (tests/unit/test_uvicorn_pin.py checks the installed uvicorn is within
the pin and that these names are there).
"""
from __future__ import annotations

import http
import json
from typing import TYPE_CHECKING, Awaitable, Callable

from mnistflow.core.errors import MnistflowError
from mnistflow.core.limits import LINGER_BYTES, LINGER_SECONDS, MAX_PIPELINED
from mnistflow.server.guard import Limits

if TYPE_CHECKING:
    import uvicorn

__all__ = ["server_config", "guarded", "refusal", "ConnectionGuard"]


def _json_body(status: int, message: str) -> bytes:
    return json.dumps({"error": message, "status": status}).encode()


def refusal(status: int, message: str, headers: tuple = ()) -> Callable[..., Awaitable[None]]:
    """An ASGI app that answers every request with this JSON error and closes the connection."""
    body = _json_body(status, message)
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"), *headers]

    async def refuse(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body})

    return refuse


def _raw_answer(status: int, message: str, default_headers) -> bytes:
    """A whole JSON error response, for refusals made before there is a request to answer."""
    body = _json_body(status, message)
    return b"".join([f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n".encode(),
                     *(n + b": " + v + b"\r\n" for n, v in default_headers),
                     b"content-type: application/json\r\n",
                     b"content-length: " + str(len(body)).encode() + b"\r\n",
                     b"connection: close\r\n\r\n", body])


class _Transport:
    """The connection's transport as uvicorn sees it: ``close`` goes through the protocol,
    which lingers when the request's body is still arriving."""

    __slots__ = ("_real", "_proto")

    def __init__(self, real, proto):
        self._real, self._proto = real, proto

    def __getattr__(self, name):
        return getattr(self._real, name)

    def write(self, data) -> None:
        self._real.write(data)

    def is_closing(self) -> bool:
        return self._proto._mf_linger is not None or self._real.is_closing()

    def close(self) -> None:
        self._proto._mf_close()


class _Refused(Exception):
    """Raised in a parser callback to stop the parser (the connection is closed first)."""


class ConnectionGuard:
    """The bounds of the module docstring, mixed into uvicorn's httptools protocol (``guarded``):
    every method that uvicorn's class also has calls it through ``super()``."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        self.limit_concurrency = None  # uvicorn's check counts idle sockets: ours replaces it
        self._mf_limits = getattr(config, "mnistflow_limits", None) or Limits()
        self._mf_real = None  # the event loop's transport (``self.transport`` wraps it)
        self._mf_timer = self._mf_cycle = None  # the header deadline, and the cycle it was armed in
        self._mf_head = 0  # bytes of the request head (line and headers) so far
        self._mf_in_body = False  # between a request's headers and the end of its body
        self._mf_linger = None  # [bytes still to discard, timer] while lingering

    # --- the connection --------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self._mf_real = transport
        super().connection_made(_Transport(transport, self))
        self._mf_idle(True)
        self._mf_evict()
        self._mf_arm()

    def data_received(self, data: bytes) -> None:
        if self._mf_linger is not None:  # an answer was sent: discard within the budget
            self._mf_linger[0] -= len(data)
            if self._mf_linger[0] < 0:
                self._mf_real.close()
            return
        self._mf_feed(data)
        if self._mf_waiting():
            if self._mf_timer is None:
                self._mf_arm()
        elif self._mf_timer is not None:
            self._mf_timer.cancel()
            self._mf_timer = None

    def connection_lost(self, exc) -> None:
        for timer in (self._mf_timer, self._mf_linger and self._mf_linger[1]):
            if timer is not None:
                timer.cancel()
        self._mf_timer = None
        self._mf_idle(False)
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if self._mf_linger is not None:
            self._mf_real.close()
        else:
            super().shutdown()

    def send_400_response(self, msg: str) -> None:
        """A request uvicorn cannot parse (bad framing: a negative Content-Length, a NUL in a
        header): a JSON error like every other refusal, and the connection closes (its
        framing cannot be trusted)."""
        self._mf_answer(400, f"malformed HTTP request: {msg}")

    def _mf_feed(self, data: bytes) -> None:
        """Give ``data`` to the parser in pieces of at most ``max_header_bytes``, counting the
        bytes of a request head: past the cap, a 431. (A piece that ends one request's body
        and starts the next head is not counted: a head is refused by twice the cap.)"""
        cap, i, n = self._mf_limits.max_header_bytes, 0, len(data)
        while i < n:
            if self._mf_real.is_closing() or self._mf_linger is not None:
                return
            size = cap if self._mf_in_body else cap - self._mf_head
            if size <= 0:
                self._mf_answer(431, f"the request line and headers are over {cap:,} bytes")
                return
            piece = data if i == 0 and size >= n else data[i:i + size]
            i += len(piece)
            if not self._mf_in_body:
                self._mf_head += len(piece)
            super().data_received(piece)

    def _mf_answer(self, status: int, message: str) -> None:
        """Answer before (or instead of) the app, then close, lingering; with an answer in
        progress (a pipelined request), only close: two answers cannot interleave."""
        if self._mf_real.is_closing() or self._mf_linger is not None:
            return
        if not self._mf_waiting():
            self._mf_real.close()
            return
        self._mf_real.write(_raw_answer(status, message, self.server_state.default_headers))
        self._mf_close(linger=True)

    def _mf_close(self, linger: bool | None = None) -> None:
        """Close; when the client may still be sending (``linger``, or by default when the
        request's body has not all arrived), stop writing first and discard what comes for a
        bounded time, so that the client reads the answer rather than a reset."""
        real = self._mf_real
        if real.is_closing() or self._mf_linger is not None:
            return
        if linger is None:
            linger = self.cycle is not None and self.cycle.more_body
        if not linger or not real.can_write_eof():
            real.close()
            return
        real.write_eof()
        self._mf_linger = [LINGER_BYTES, self.loop.call_later(LINGER_SECONDS, real.close)]
        self._mf_idle(True)
        if not real.is_reading():
            real.resume_reading()

    # --- requests --------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self._mf_head, self._mf_in_body = 0, True
        self._mf_idle(False)
        if len(self.pipeline) >= MAX_PIPELINED:  # sent without reading the answers: closed
            self._mf_real.close()
            raise _Refused
        problem = self._mf_check_head()
        if problem is None and len(self.tasks) >= self._mf_limits.max_connections:
            problem = (503, f"the server is busy ({len(self.tasks)} requests in progress); try again",
                       ((b"retry-after", b"1"),))
        if problem is None:
            super().on_headers_complete()
            return
        app, self.app = self.app, refusal(*problem)
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def on_message_complete(self) -> None:
        self._mf_in_body = False
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.pipeline and self.cycle.response_complete:
            self._mf_idle(True)

    def _mf_check_head(self) -> tuple[int, str] | None:
        """The ``Host`` rules of RFC 9112 (module docstring): None, or (status, why)."""
        import httptools

        if self.url[:1] not in (b"/", b"*"):  # absolute-form: its authority is the Host
            try:
                url = httptools.parse_url(self.url)
            except httptools.HttpParserInvalidURLError:
                return 400, "bad request target"
            if not url.host or url.userinfo is not None:
                return 400, "bad request target: an absolute URL names a host and no user"
            host = b"[" + url.host + b"]" if b":" in url.host else url.host
            self.headers[:] = [(k, v) for k, v in self.headers if k != b"host"]
            self.headers.append((b"host", host + (b":%d" % url.port if url.port else b"")))
            return None
        hosts = sum(k == b"host" for k, _ in self.headers)
        if hosts > 1:
            return 400, "more than one Host header"
        if hosts == 0:
            if self.parser.get_http_version() == "1.1":
                return 400, "no Host header (HTTP/1.1 requires one)"
            host, port = self.server or ("", None)  # HTTP/1.0: this server's own address
            host = f"[{host}]" if ":" in host else host
            self.headers.append((b"host", f"{host}:{port}".encode() if port else host.encode()))
        return None

    # --- idle connections and their deadline -----------------------------------------

    def _mf_idle(self, idle: bool) -> None:
        """Mark this connection idle (last in line to be closed) or busy."""
        registry = self.server_state.__dict__.setdefault("mnistflow_idle", {})
        registry.pop(self, None)
        if idle:
            registry[self] = None

    def _mf_evict(self) -> None:
        """Past ``max_connections`` open connections, close the one idle the longest."""
        if len(self.connections) <= self._mf_limits.max_connections:
            return
        for victim in self.server_state.mnistflow_idle:
            if victim is not self:
                victim._mf_idle(False)
                victim._mf_real.close()
                return

    def _mf_waiting(self) -> bool:  # no request in progress: headers are (to be) awaited
        cycle = self.cycle
        return cycle is None or cycle.response_complete

    def _mf_arm(self) -> None:
        self._mf_cycle = self.cycle
        self._mf_timer = self.loop.call_later(self._mf_limits.header_timeout, self._mf_expire)

    def _mf_expire(self) -> None:
        self._mf_timer = None
        if self.cycle is self._mf_cycle and self._mf_waiting() and not self._mf_real.is_closing():
            self._mf_real.close()


def guarded(base: type) -> type:
    """uvicorn's httptools protocol class ``base`` with ``ConnectionGuard``'s bounds."""
    return type(f"Guarded{base.__name__}", (ConnectionGuard, base), {})


def _protocol() -> type:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        raise MnistflowError("serving needs starlette, uvicorn, httptools and python-multipart: "
                             "pip install 'mnistflow[serve]'") from None
    return guarded(HttpToolsProtocol)


def server_config(app: str | Callable[..., Awaitable[None]], limits: Limits, **kwargs) -> uvicorn.Config:
    """A ``uvicorn.Config`` for ``app`` (an app or an import string) that enforces ``limits``
    with the guarded protocol (no WebSocket upgrades: they would leave it)."""
    import uvicorn

    _protocol()  # httptools missing: one line now, not a traceback in the server
    config = uvicorn.Config(app, http="mnistflow.server.connection:GuardedHTTPProtocol", ws="none", **kwargs)
    config.mnistflow_limits = limits  # travels to --workers processes
    return config


def __getattr__(name: str):
    if name == "GuardedHTTPProtocol":  # built on first use: uvicorn is an optional extra
        cls = _protocol()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
