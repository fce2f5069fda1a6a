"""``server/connection.py`` subclasses uvicorn's HTTP protocol and uses its private API, so
pyproject.toml pins uvicorn to the releases the server tests passed on (connection.py's docstring).
The uvicorn these tests run on must be one of them, and what the guard uses must be there."""
from __future__ import annotations

import inspect
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from mnistflow.core.compat import tomllib

REPO = Path(__file__).resolve().parents[2]


def _pin() -> Requirement:
    with open(REPO / "pyproject.toml", "rb") as f:
        serve = tomllib().load(f)["project"]["optional-dependencies"]["serve"]
    (req,) = [r for r in map(Requirement, serve) if r.name == "uvicorn"]
    return req


def test_uvicorn_is_pinned_below_an_untested_release_and_the_installed_one_is_in_the_pin():
    req = _pin()
    assert any(s.operator == "<" for s in req.specifier), f"{req}: no upper bound"
    pytest.importorskip("uvicorn")
    assert req.specifier.contains(version("uvicorn")), (version("uvicorn"), str(req))


def test_the_private_uvicorn_api_the_guard_uses_is_there():
    pytest.importorskip("uvicorn")
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
    from uvicorn.supervisors import Multiprocess

    from mnistflow.server.connection import GuardedHTTPProtocol

    assert issubclass(GuardedHTTPProtocol, HttpToolsProtocol)
    for name in ("send_400_response", "on_headers_complete", "on_message_complete", "on_response_complete",
                 "shutdown", "connection_made", "data_received", "connection_lost"):
        assert callable(getattr(HttpToolsProtocol, name, None)), name
    assert list(inspect.signature(HttpToolsProtocol.__init__).parameters)[:4] == ["self", "config", "server_state",
                                                                                "app_state"]
    # what the protocol reads of a request cycle: set in __init__ (source, since they are plain attributes)
    cycle_init = inspect.getsource(RequestResponseCycle.__init__)
    assert "self.more_body" in cycle_init and "self.response_complete" in cycle_init
    proto_init = inspect.getsource(HttpToolsProtocol.__init__)
    for attr in ("self.pipeline", "self.tasks", "self.connections", "self.server_state", "self.limit_concurrency",
                 "self.cycle", "self.parser", "self.app", "self.loop"):
        assert attr in proto_init, attr
    assert list(inspect.signature(Multiprocess.__init__).parameters) == ["self", "config", "sockets"]
