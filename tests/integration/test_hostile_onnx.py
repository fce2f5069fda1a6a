"""Foreign ONNX graphs that carry mnistflow's metadata (issue 40, R7), built with onnx.helper:
control flow and run-time sized outputs are refused by the operator allow-list, a graph whose
sizes are unknown, grow faster than the batch or are too large by the inferred shapes, and a
graph that computes other than it declares (5 classes under 10 names, strings, integers, NaN)
by the check of its answers; a slow one is stopped at the deadline. Through ``eval``,
``predict`` and ``serve`` (refused at start), each one line and exit 2, in bounded time and
memory (the CLI runs under a 4 GB address-space limit)."""
from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers import inject
from helpers.cli import assert_one_line_error
from PIL import Image

from mnistflow.artifacts.load import load_any
from mnistflow.artifacts.model_info import ModelInfo
from mnistflow.core.errors import MnistflowError

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

INFO = ModelInfo("softmax", [1, 28, 28], [str(i) for i in range(10)], [33.3], [78.6], dataset="mnist")
AS = 4 * 10 ** 9  # the CLI's address space: an allocation of the sizes below fails instead of swapping


def _w(name: str, array: np.ndarray):
    return helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape,
                              array.tobytes(), raw=True)


def _model(path, nodes, inits=(), *, out="logits", out_type=TensorProto.FLOAT, classes=10, opset=17):
    """A model of ``nodes`` from ``input`` (N, 1, 28, 28) to ``out`` declared (N, classes), with
    the metadata of a real softmax export."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 28, 28])],
        [helper.make_tensor_value_info(out, out_type, ["batch", classes])], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    helper.set_model_props(model, {"mnistflow": INFO.to_json()})
    onnx.save(model, str(path))
    return path


def _linear(classes: int = 10, fill: float = 0.01):
    """Flatten -> MatMul by a (784, classes) weight: ``flat`` (N, 784), ``mm`` (N, classes)."""
    return ([helper.make_node("Flatten", ["input"], ["flat"]), helper.make_node("MatMul", ["flat", "W"], ["mm"])],
            [_w("W", np.full((784, classes), fill, np.float32))])


def loop(path):
    """A Loop with trip count 2**62 carrying the logits through a body that does nothing: it
    never ends."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Identity", ["v_in"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, None)])
    nodes, inits = _linear()
    nodes.append(helper.make_node("Loop", ["trips", "cond", "mm"], ["logits"], body=body))
    return _model(path, nodes, inits + [_w("trips", np.array(2 ** 62, np.int64)), _w("cond", np.array(True))])


def bigalloc(path):
    """ConstantOfShape 200000 x 200000 (160 GB of float32), added to the logits."""
    nodes, inits = _linear()
    nodes += [helper.make_node("ConstantOfShape", ["shape"], ["big"]),
              helper.make_node("ReduceMean", ["big"], ["m"], axes=[0, 1], keepdims=1),
              helper.make_node("Add", ["mm", "m"], ["logits"])]
    return _model(path, nodes, inits + [_w("shape", np.array([200000, 200000], np.int64))])


def bigpad(path):
    """An allowed operator asked for a huge output: Pad by 100,000 on each side of each image."""
    nodes, inits = _linear()
    nodes = [helper.make_node("Pad", ["input", "pads"], ["padded"]),
             helper.make_node("ReduceMean", ["padded"], ["m"], axes=[1, 2, 3], keepdims=0),
             helper.make_node("Reshape", ["m", "col"], ["mcol"]), *nodes,
             helper.make_node("Add", ["mm", "mcol"], ["logits"])]
    pads = np.array([0, 0, 100_000, 100_000, 0, 0, 100_000, 100_000], np.int64)
    return _model(path, nodes, inits + [_w("pads", pads), _w("col", np.array([-1, 1], np.int64))])


def square(path):
    """A tensor of (784 N) x (784 N) values: a batch of 1,000 would need 2.4 TB."""
    nodes = [helper.make_node("Reshape", ["input", "col"], ["a"]),
             helper.make_node("Reshape", ["input", "row"], ["b"]),
             helper.make_node("MatMul", ["a", "b"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["r"], axes=[1], keepdims=0),
             helper.make_node("Reshape", ["r", "img"], ["flat"]),
             helper.make_node("MatMul", ["flat", "W"], ["logits"])]
    inits = [_w("col", np.array([-1, 1], np.int64)), _w("row", np.array([1, -1], np.int64)),
             _w("img", np.array([-1, 784], np.int64)), _w("W", np.zeros((784, 10), np.float32))]
    return _model(path, nodes, inits)


def lies5(path):
    """Declares (N, 10) and 10 class names, computes (N, 5): reshaped to a shape computed at run
    time, so that onnxruntime keeps the declared one."""
    nodes, inits = _linear(5)
    nodes += [helper.make_node("Shape", ["mm"], ["shape"]),
              helper.make_node("Reshape", ["mm", "shape"], ["logits"])]
    return _model(path, nodes, inits)


def lies5static(path):
    """Declares (N, 10), computes (N, 5) with allowed operators: the inferred shapes tell."""
    nodes, inits = _linear(5)
    return _model(path, nodes + [helper.make_node("Identity", ["mm"], ["logits"])], inits)


def strout(path):
    """Logits cast to strings."""
    nodes, inits = _linear()
    return _model(path, nodes + [helper.make_node("Cast", ["mm"], ["logits"], to=TensorProto.STRING)], inits,
                  out_type=TensorProto.STRING)


def int64out(path):
    """The class index as int64 (ArgMax) under the logits' name."""
    nodes, inits = _linear()
    return _model(path, nodes + [helper.make_node("ArgMax", ["mm"], ["logits"], axis=1, keepdims=1)], inits,
                  out_type=TensorProto.INT64)


def uint8out(path):
    """Allowed operators only, ending in QuantizeLinear: uint8 logits."""
    nodes, inits = _linear()
    nodes.append(helper.make_node("QuantizeLinear", ["mm", "scale"], ["logits"]))
    return _model(path, nodes, inits + [_w("scale", np.array(0.1, np.float32))], out_type=TensorProto.UINT8)


def nan_blank(path):
    """0 / 0: NaN logits for a blank image (the check made at load)."""
    nodes, inits = _linear()
    nodes.append(helper.make_node("Div", ["mm", "zero"], ["logits"]))
    return _model(path, nodes, inits + [_w("zero", np.zeros(10, np.float32))])


def nan_ink(path):
    """log(1 - sum of the image): finite for a blank image, NaN for most real ones."""
    nodes, inits = _linear(fill=1.0)
    nodes += [helper.make_node("Sub", ["one", "mm"], ["d"]), helper.make_node("Log", ["d"], ["logits"])]
    return _model(path, nodes, inits + [_w("one", np.ones(10, np.float32))])


def slow(path):
    """Allowed and within the size limits, but 300 products by a 1024 x 1024 weight an image."""
    nodes = [helper.make_node("Flatten", ["input"], ["flat"]), helper.make_node("MatMul", ["flat", "W0"], ["h0"])]
    nodes += [helper.make_node("MatMul", [f"h{i}", "W"], [f"h{i + 1}"]) for i in range(300)]
    nodes.append(helper.make_node("MatMul", ["h300", "W10"], ["logits"]))
    inits = [_w("W0", np.zeros((784, 1024), np.float32)), _w("W", np.eye(1024, dtype=np.float32)),
             _w("W10", np.zeros((1024, 10), np.float32))]
    return _model(path, nodes, inits)


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (AS, AS))


def cli(*args, env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mnistflow", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})},
                          preexec_fn=_limited, check=False)


@pytest.fixture(scope="module")
def png(tmp_path_factory):
    p = tmp_path_factory.mktemp("onnx-png") / "d.png"
    a = np.zeros((28, 28), np.uint8)
    a[2:26, 2:26] = 255  # much ink: nan_ink's log of a negative number
    Image.fromarray(a).save(p)
    return p


# --- the reproductions, through the three verbs ----------------------------------------------

CASES = {  # builder: what the one line says
    "loop": "uses the operator 'Loop'",
    "bigalloc": "uses the operator 'ConstantOfShape'",
    "lies5": "uses the operator 'Shape'",
    "strout": "uses the operator 'Cast'",
    "int64out": "uses the operator 'ArgMax'",
    "nan_blank": "computed NaN or infinite logits for 1 of 1 image(s)",
}
RUNS = [("loop", "eval"), ("loop", "predict"), ("loop", "serve"), ("bigalloc", "eval"), ("bigalloc", "predict"),
        ("lies5", "eval"), ("lies5", "predict"), ("lies5", "serve"), ("strout", "predict"), ("int64out", "eval"),
        ("nan_blank", "eval"), ("nan_blank", "serve")]


@pytest.mark.parametrize("name,verb", RUNS, ids=[f"{n}-{v}" for n, v in RUNS])
def test_eval_predict_and_serve_refuse_in_one_line(name, verb, tmp_path, synthetic_records, png):
    """O-eval-loop (hung, killed at 60 s), O-eval-bigalloc (traceback), O-eval-lies5 (traceback),
    O-pred-lies5 (rc 0, 0.2 under 10 names), O-pred-strout (traceback), O-serve-loop (every slot
    held for good), and the int64 / NaN outputs that gave rc 0 with 9.8% / nan. ``serve`` is
    refused at start, before its "serving" line."""
    path = globals()[name](tmp_path / f"{name}.onnx")
    args = {"eval": ("--data", synthetic_records), "predict": (png,), "serve": ("--port", "0")}[verb]
    proc = cli(verb, path, *args)
    assert_one_line_error(proc, f"{name}.onnx", CASES[name])
    assert proc.stdout == "", proc.stdout


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_case_is_refused_at_load(name, tmp_path):
    path = globals()[name](tmp_path / f"{name}.onnx")
    with pytest.raises(MnistflowError, match=re.escape(CASES[name])):
        load_any(path)


@pytest.mark.parametrize("verb", ["eval", "predict"])
def test_nan_for_real_images_is_one_line(verb, tmp_path, synthetic_records, png):
    """NaN only for images with ink: a blank one is answered (the model loads), the first real
    batch is refused."""
    path = nan_ink(tmp_path / "nan_ink.onnx")
    if verb == "eval":
        load_any(path)
        assert_one_line_error(cli("eval", path, "--data", synthetic_records), "NaN or infinite logits for")
    else:
        assert_one_line_error(cli("predict", path, png), "NaN or infinite logits for 1 of 1 image(s)")


def test_a_slow_graph_is_stopped_at_the_deadline(tmp_path, synthetic_records):
    """Allowed operators, sizes within the limits: only time tells. eval is stopped at the
    deadline (here 1 s by fault injection; MAX_ONNX_RUN_SECONDS otherwise), in one line."""
    path = slow(tmp_path / "slow.onnx")
    t0 = time.monotonic()
    proc = cli("eval", path, "--data", synthetic_records, env=inject.env(onnx_deadline=1.0))
    assert_one_line_error(proc, "slow.onnx: the model took over 1 s for", "image(s); stopped")
    assert time.monotonic() - t0 < 30


def test_the_server_stops_a_run_at_its_work_deadline(tmp_path):
    """O-serve-loop's other half: a request past the work deadline kept its thread running for
    good. The server's ONNX runs now stop at its work deadline, and the thread ends."""
    from mnistflow.server import create_app
    from mnistflow.server.guard import Limits

    app = create_app(slow(tmp_path / "slow.onnx"), limits=Limits(work_timeout=0.5))
    pred = app.state.predictor
    assert pred.deadline == 0.5
    before = threading.active_count()
    t0 = time.monotonic()
    with pytest.raises(MnistflowError, match="took over 0.5 s"):
        pred.predict(np.zeros((300, 28, 28, 1), np.uint8))
    assert time.monotonic() - t0 < 5 and threading.active_count() == before


# --- variants, in process ------------------------------------------------------------------

@pytest.mark.parametrize("name,fragment", [
    ("bigpad", "refused: the graph needs"),
    ("square", "grows faster than the batch"),
    ("uint8out", "ONNX output is tensor(uint8), not float logits"),
    ("lies5static", "ONNX output shape ['batch', 5] does not match the metadata's 10 classes"),
])
def test_variants_are_refused_before_running(name, fragment, tmp_path):
    path = globals()[name](tmp_path / f"{name}.onnx")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(MnistflowError, match=re.escape(fragment)):
        load_any(path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200_000  # KiB


@pytest.mark.parametrize("op", ["Scan", "If", "Range", "Expand", "Tile", "NonZero", "Resize"])
def test_other_unlisted_operators_are_refused_by_name(op, tmp_path):
    nodes, inits = _linear()
    nodes.append(helper.make_node(op, ["mm"], ["logits"]))
    path = tmp_path / "m.onnx"
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 28, 28])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    helper.set_model_props(model, {"mnistflow": INFO.to_json()})
    onnx.save(model, str(path))  # (not checked: the operators' own inputs are not the point)
    with pytest.raises(MnistflowError, match=f"uses the operator '{op}'"):
        load_any(path)
