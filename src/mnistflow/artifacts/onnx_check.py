"""What an ONNX file must be before onnxruntime runs it: a foreign or hostile file (one that
carries mnistflow's metadata but not a graph mnistflow wrote) is one error line, not a hang, a
crash or an allocation that takes the machine.

    cost = check_onnx_file(path)      # raises MnistflowError naming what is wrong
    cost.max_batch                     # images per onnxruntime call within the batch bounds

The file: a regular file of at most ``limits.MAX_MODEL_BYTES``; its initializers' declared
shapes and types against the bytes they carry, all together at most ``limits.MAX_ONNX_VALUES``,
finite, never external. The graph: only the operators of ``limits.ONNX_OPS`` (what mnistflow's
exports and common layers use: no control flow, no operator sized at run time by a tensor's
values), no functions of its own; every tensor's shape is inferred (onnx's shape inference, the
a batch of one image and of two) and must be known before anything runs, grow no faster than
the batch, and one image may need at most
``limits.MAX_ONNX_IMAGE_VALUES`` values and ``limits.MAX_ONNX_IMAGE_OPS`` operations. What the
graph computes at run time (the type and shape of the logits, NaN) is checked by
``artifacts.onnx.OnnxBackend`` on every batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError, import_optional
from mnistflow.core.fsutil import regular_file

_KEEP_DATA = 1024  # initializers this small keep their values for the inference (shapes, axes)


@dataclass(frozen=True)
class GraphCost:
    """What one image costs the graph: tensor values and operations (multiply-adds)."""

    values: int
    ops: int

    @property
    def max_batch(self) -> int:
        """The most images one onnxruntime call may take (``limits.MAX_ONNX_BATCH_*``)."""
        return max(1, min(limits.MAX_ONNX_BATCH_VALUES // max(self.values, 1),
                          limits.MAX_ONNX_BATCH_OPS // max(self.ops, 1)))


def check_onnx_file(path: Path) -> GraphCost:
    """The checks of the module docstring, in order, before onnxruntime reads the file;
    returns what one image costs."""
    path = regular_file(path, limits.MAX_MODEL_BYTES, "ONNX model")
    onnx = import_optional("onnx")  # the graph is checked before it runs, or it does not run
    try:
        m = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # a protobuf decode error
        raise MnistflowError(f"not a loadable ONNX model ({e.__class__.__name__})", path) from None
    _check_initializers(m, path)
    _check_operators(m, path)
    return _check_shapes(m, path)


def _check_initializers(m, path: Path) -> None:
    """Each initializer's declared shape and type against the bytes it carries; all together
    at most ``limits.MAX_ONNX_VALUES``; finite weights; no external data."""
    from onnx import TensorProto, helper, numpy_helper

    typed = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")
    total = 0
    for t in m.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL or t.external_data:
            raise MnistflowError(f"refused: initializer '{t.name[:80]}' keeps its data outside the "
                                 "file (mnistflow exports never do)", path)
        if any(d < 0 for d in t.dims):
            raise MnistflowError(f"initializer '{t.name[:80]}' has a negative dimension", path)
        n = math.prod(t.dims)
        total += n
        if total > limits.MAX_ONNX_VALUES:
            raise MnistflowError(f"the initializers declare over {limits.MAX_ONNX_VALUES:,} values", path)
        try:
            size = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        except Exception:
            raise MnistflowError(f"initializer '{t.name[:80]}' has an unknown data type "
                                 f"{t.data_type}", path) from None
        stored = len(t.raw_data) if t.raw_data else sum(len(getattr(t, f)) for f in typed)
        want = n * size if t.raw_data else n
        if t.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16) and not t.raw_data:
            want = n  # stored one value per int32
        if stored != want:
            raise MnistflowError(f"initializer '{t.name[:80]}' declares {'x'.join(map(str, t.dims))} "
                                 f"values but stores {stored:,} {'bytes' if t.raw_data else 'values'}",
                                 path)
        if t.data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
            raise MnistflowError(f"initializer '{t.name[:80]}' holds complex values; weights must be "
                                 "real numbers", path)
        if t.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16) and n:
            if not np.isfinite(numpy_helper.to_array(t)).all():  # as the strict weight loader
                raise MnistflowError(f"initializer '{t.name[:80]}' holds non-finite values (NaN or "
                                     "infinity); refusing weights that would make every prediction "
                                     "NaN", path)


def _check_operators(m, path: Path) -> None:
    """Only ``limits.ONNX_OPS`` of the standard domain; no functions, no subgraphs."""
    from onnx import AttributeProto

    if len(m.functions):
        raise MnistflowError(f"refused: the model defines {len(m.functions)} function(s) of its own "
                             f"('{m.functions[0].name[:60]}'); mnistflow exports never do", path)
    for node in m.graph.node:
        op = f"{node.domain}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
        where = f" (node '{node.name[:60]}')" if node.name else ""
        if op not in limits.ONNX_OPS:
            raise MnistflowError(f"refused: the graph uses the operator '{op[:80]}'{where}, which mnistflow "
                                 "does not run: its exports and common layers use none (no control flow, "
                                 "no output sized at run time)", path)
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) or a.HasField("g") or len(a.graphs)
               for a in node.attribute):
            raise MnistflowError(f"refused: the graph's {op}{where} carries a subgraph", path)


def _check_shapes(m, path: Path) -> GraphCost:
    """Every tensor's shape inferred for a batch of one image and of two: known, each tensor's
    size the same for both (computed from the weights alone) or twice as large (a size that
    grows faster with the batch, N x N, is refused); one image's values and operations, and
    those of the batch-free tensors, within the limits."""
    weights = {t.name for t in m.graph.initializer}
    inputs = [i for i in m.graph.input if i.name not in weights]
    if len(inputs) != 1 or not inputs[0].type.tensor_type.HasField("shape") \
            or not inputs[0].type.tensor_type.shape.dim:
        raise MnistflowError(f"the ONNX model has {len(inputs)} inputs (besides its weights); "
                             "expected one image input, with a shape", path)
    batch = inputs[0].type.tensor_type.shape.dim[0]
    if batch.HasField("dim_value"):
        raise MnistflowError(f"the ONNX model's input has a fixed batch of {batch.dim_value}; "
                             "mnistflow runs models with a dynamic batch (as it exports them)", path)
    del m.graph.value_info[:]  # every shape inferred from the input's, none taken from the file
    for out in m.graph.output:
        out.type.tensor_type.ClearField("shape")
    for t in m.graph.initializer:  # shapes are what the inference needs, not the weights
        if math.prod(t.dims) > _KEEP_DATA:
            for f in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                t.ClearField(f)
    one, two = (_costs(m, batch, n, path) for n in (1, 2))
    values = ops = fixed_values = fixed_ops = 0  # per image; then those of the batch-free tensors
    for name, (v1, o1) in one.items():
        v2, o2 = two[name]
        if v2 not in (v1, 2 * v1) or o2 > 2 * o1:
            raise MnistflowError(f"refused: the size of '{name[:60]}' grows faster than the batch "
                                 f"({v1:,} values for one image, {v2:,} for two)", path)
        values, ops = values + v2 - v1, ops + o2 - o1
        if v2 == v1:  # computed from the weights alone: once, whatever the batch
            fixed_values, fixed_ops = fixed_values + v1, fixed_ops + o1
    if max(values, fixed_values) > limits.MAX_ONNX_IMAGE_VALUES or max(ops, fixed_ops) > limits.MAX_ONNX_IMAGE_OPS:
        raise MnistflowError(f"refused: the graph needs {values:,} tensor values and {ops:,} operations "
                             f"an image, and {fixed_values:,} and {fixed_ops:,} for its weights (at most "
                             f"{limits.MAX_ONNX_IMAGE_VALUES:,} and {limits.MAX_ONNX_IMAGE_OPS:,})", path)
    return GraphCost(values, ops)


def _costs(m, batch, n: int, path: Path) -> dict[str, tuple[int, int]]:
    """{tensor: (values, operations)} of every node output for a batch of ``n`` images."""
    from onnx import shape_inference

    batch.dim_value = n
    try:
        inferred = shape_inference.infer_shapes(m, strict_mode=True, data_prop=True).graph
    except Exception as e:  # onnx's InferenceError, ValidationError, ...
        raise MnistflowError("the graph does not hold together (onnx's shape inference: "
                             f"{' '.join(str(e).split())[:200]})", path) from None
    shapes = {v.name: v.type for v in (*inferred.input, *inferred.value_info, *inferred.output)}
    shapes.update({t.name: _initializer_type(t) for t in m.graph.initializer})
    out: dict[str, tuple[int, int]] = {}
    for node in inferred.node:
        for name in filter(None, node.output):
            dims = _dims(shapes.get(name))
            if dims is None or not all(isinstance(d, int) for d in dims):
                raise MnistflowError(f"refused: the size of '{name[:60]}' ({node.op_type}) cannot be told "
                                     f"before running the model (inferred shape {dims}); mnistflow runs "
                                     "graphs whose every size follows from the input's", path)
            values = math.prod(dims)
            out[name] = (values, _ops(node, values, shapes))
    return out


def _initializer_type(t):
    """An initializer's type as a TypeProto (its dims)."""
    from onnx import helper

    return helper.make_tensor_type_proto(t.data_type, list(t.dims))


def _dims(tp) -> list[int | str | None] | None:
    """A tensor type's dimensions (an int, a symbol, or None: unknown; None: no shape)."""
    if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in tp.tensor_type.shape.dim]


def _ops(node, out_values: int, shapes: dict) -> int:
    """Operations of ``node``: multiply-adds of convolutions and products, the window of a
    pool, else the larger of its outputs and inputs (elementwise, reductions)."""
    def dims(i: int) -> list:
        d = _dims(shapes.get(node.input[i])) if i < len(node.input) and node.input[i] else None
        return [x for x in d or [] if isinstance(x, int)]

    if node.op_type == "Conv":
        return out_values * math.prod(dims(1)[1:])
    if node.op_type in ("Gemm", "MatMul"):
        a = dims(0) or [1]
        trans = any(x.name == "transA" and x.i for x in node.attribute)
        return out_values * (a[0] if trans else a[-1])
    if node.op_type in ("MaxPool", "AveragePool"):
        kernel = next((list(x.ints) for x in node.attribute if x.name == "kernel_shape"), [1])
        return out_values * math.prod(kernel)
    return max([out_values] + [math.prod(dims(i)) for i in range(len(node.input))])
