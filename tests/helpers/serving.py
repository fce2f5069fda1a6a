"""A real uvicorn server in a thread of the test process, on a free 127.0.0.1 port."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Iterator


@contextlib.contextmanager
def uvicorn_thread(config) -> Iterator[int]:
    """Run ``uvicorn.Server(config)`` until the block ends; yields the port it listens on."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(config)
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert t.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        t.join(10)
        sock.close()




def softmax_predictor():
    """An untrained softmax model on MNIST's shape, as a server's predictor."""
    from mnistflow.artifacts.model_info import ModelInfo
    from mnistflow.artifacts.predictor import TorchBackend
    from mnistflow.models import create_model

    info = ModelInfo("softmax", [1, 28, 28], [str(i) for i in range(10)], [33.0], [78.0], dataset="synthetic")
    return TorchBackend(create_model("softmax", (1, 28, 28), 10).eval(), info)


@contextlib.contextmanager
def guarded_server(pred=None, *, hosts=..., log_level: str = "warning", **limits) -> Iterator[int]:
    """``mnistflow serve``'s server (guarded protocol, connection cap; ``limits`` as
    ``server.guard.Limits`` takes them) for ``pred`` (default: ``softmax_predictor()``) on a
    free 127.0.0.1 port; yields the port. ``hosts``: the allowed Host names (default: the
    local ones; None: any, as ``--host 0.0.0.0``)."""
    from mnistflow.server import create_app
    from mnistflow.server.connection import server_config
    from mnistflow.server.guard import LOCAL_HOSTS, Limits

    lim = Limits(**limits)
    app = create_app(pred or softmax_predictor(), limits=lim, allowed_hosts=LOCAL_HOSTS if hosts is ... else hosts)
    with uvicorn_thread(server_config(app, lim, log_level=log_level, timeout_graceful_shutdown=1)) as port:
        yield port
