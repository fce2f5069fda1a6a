"""The draw-a-digit web page and its server for a trained model.

    mnistflow serve runs/fast-20250101-120000      # then open http://127.0.0.1:8000/

    from mnistflow.server import create_app, serve
    serve("runs/fast-20250101-120000", port=8000)  # blocks until Ctrl-C
    app = create_app("runs/fast-20250101-120000")  # an ASGI app, e.g. for starlette's TestClient

Needs the ``serve`` extra (starlette, uvicorn; onnxruntime for ONNX exports).
"""
from __future__ import annotations

from mnistflow.server.app import create_app, serve
from mnistflow.server.predictor import Predictor, load_predictor

__all__ = ["create_app", "serve", "load_predictor", "Predictor"]
