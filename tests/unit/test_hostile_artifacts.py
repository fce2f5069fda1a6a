"""Hostile model files (issue 19, HOSTILE-INPUTS.md D8 and D16): metadata, shapes and dtypes
are validated against what the file declares before anything is allocated, and every failure
is one ``MnistflowError``, never a traceback or a huge allocation."""
from __future__ import annotations

import io
import json
import os
import struct
import tracemalloc
import zipfile

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from helpers.blocking import deadline
from mnistflow.artifacts.load import load_any
from mnistflow.artifacts.model_file import save_model
from mnistflow.artifacts.model_info import ModelInfo, check_model_info
from mnistflow.artifacts.npz import read_npz, write_npz
from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError
from mnistflow.models import create_model

NAMES = [str(i) for i in range(10)]
INFO = ModelInfo("softmax", [1, 28, 28], NAMES, [33.0], [78.0], dataset="synthetic")
BASE = json.loads(INFO.to_json())


def _weights() -> dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in create_model("softmax", (1, 28, 28), 10).state_dict().items()}


def _safetensors(path, meta: object, weights=None) -> str:
    text = meta if isinstance(meta, str) else json.dumps(meta)
    save_file(weights if weights is not None else _weights(), str(path), metadata={"mnistflow": text})
    return str(path)


def _peak_mb(fn) -> float:
    """Peak Python-tracked allocation (numpy and torch CPU buffers included) while ``fn`` runs."""
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak / 2 ** 20


def test_a_valid_model_file_still_loads(tmp_path):
    path = tmp_path / "m.safetensors"
    save_model(path, create_model("softmax", (1, 28, 28), 10), INFO)
    model, info = load_any(path)
    assert info == INFO and model(torch.zeros(1, 1, 28, 28)).shape == (1, 10)
    extra = _safetensors(tmp_path / "extra.safetensors", dict(BASE, evil=1))  # D8: extra keys
    assert load_any(extra)[1] == INFO  # a newer mnistflow's keys are ignored, not a TypeError


# (name, metadata, fragment of the one-line error) -- the D8 variants
BAD_META = [
    ("invalid json", "{not json", "unreadable mnistflow metadata"),
    ("a json list", [1, 2], "expected a JSON object, got list"),
    ("missing keys", {k: v for k, v in BASE.items() if k not in ("mean", "std")}, "missing mean, std"),
    ("in_shape huge", dict(BASE, in_shape=[1, 100000, 100000]), "in_shape 1x100000x100000 is too large"),
    ("65 channels", dict(BASE, in_shape=[65, 28, 28], mean=[0.0] * 65, std=[1.0] * 65),
     "in_shape 65x28x28 is too large (at most 64 channels"),  # as the CLI's --channels (core.limits)
    ("in_shape text", dict(BASE, in_shape="1x28x28"), "in_shape must be 3 positive integers"),
    ("in_shape negative", dict(BASE, in_shape=[1, -28, 28]), "in_shape must be 3 positive integers"),
    ("in_shape bools", dict(BASE, in_shape=[True, 28, 28]), "in_shape must be 3 positive integers"),
    ("no classes", dict(BASE, class_names=[]), "class_names must be a list of 1 to 100,000"),
    ("200k classes", dict(BASE, class_names=["c"] * 200_000), "got 200,000"),
    ("class names not text", dict(BASE, class_names=list(range(10))), "class_names must be strings"),
    ("mean of the wrong length", dict(BASE, mean=[1.0, 2.0]), "mean must be 1 finite number"),
    ("std of the wrong length", dict(BASE, std=[]), "std must be 1 finite number"),
    ("std zero", dict(BASE, std=[0.0]), "std must be positive"),
    ("model not text", dict(BASE, model=5), "model must be a non-empty name"),
    ("metrics a list", dict(BASE, metrics=[1]), "metrics has the wrong type"),
]


@pytest.mark.parametrize("name,meta,fragment", BAD_META, ids=[b[0] for b in BAD_META])
def test_bad_metadata_is_one_error(tmp_path, name, meta, fragment):
    path = _safetensors(tmp_path / "m.safetensors", meta)
    with pytest.raises(MnistflowError) as e:
        load_any(path)
    assert fragment in str(e.value) and str(e.value).startswith(path), str(e.value)


def test_metadata_over_the_size_cap_is_refused_unparsed(tmp_path):
    """Like 3M class names (the D8 row that tried to allocate 9.4 GB): refused by its size."""
    path = _safetensors(tmp_path / "m.safetensors", dict(BASE, dataset="x" * (16 * 2 ** 20)))
    with pytest.raises(MnistflowError, match="at most 16,777,216 characters"):
        load_any(path)


def test_wrong_tensor_shapes_are_named(tmp_path):
    """D8 'wrong.safetensors': every name present, every shape 3x3."""
    path = _safetensors(tmp_path / "w.safetensors", BASE, {k: torch.zeros(3, 3) for k in _weights()})
    with pytest.raises(MnistflowError, match=r"weights do not fit model 'softmax' \(shape mismatch: "
                                             r"fc1.weight \(file 3x3, model 10x784\)"):
        load_any(path)


@pytest.mark.parametrize("meta", [dict(BASE, model="fc100000000"),  # a 313 GB spec
                                  dict(BASE, model="fc1000000,fc10"),  # 3 GB, fits the classes
                                  dict(BASE, class_names=["c"] * 90_000)])  # 282 MB final layer
def test_a_huge_model_description_is_refused_before_allocating(tmp_path, meta):
    """The model a file describes is planned on the meta device and checked against the tensors
    the file declares: nothing near the described size is ever allocated."""
    path = _safetensors(tmp_path / "h.safetensors", meta)
    errors = []

    def run():
        with pytest.raises(MnistflowError) as e:
            load_any(path)
        errors.append(str(e.value))

    assert _peak_mb(run) < 50
    assert errors[0].startswith(path) and "model" in errors[0], errors


def test_safetensors_header_length_is_checked_first(tmp_path):
    path = tmp_path / "h.safetensors"
    path.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")  # claims a 1 TB header
    with pytest.raises(MnistflowError, match="not a safetensors model \\(header of 1,099,511,627,776 bytes"):
        load_any(path)
    path.write_bytes(b"\x01\x02")
    with pytest.raises(MnistflowError, match="shorter than its 8-byte header length"):
        load_any(path)


def test_check_model_info_round_trips_what_training_writes():
    assert check_model_info(json.loads(INFO.to_json())) == INFO
    with pytest.raises(MnistflowError, match="invalid mnistflow metadata: missing model"):
        check_model_info({})


# --- npz (D16) ----------------------------------------------------------------------------

def test_npz_of_strings_is_one_error(tmp_path):
    """D16: text arrays under the parameter names were a TypeError from torch."""
    path = tmp_path / "s.npz"
    np.savez(path, **{"fc1.weight": np.full((10, 784), "x"), "fc1.bias": np.full(10, "x")})
    with pytest.raises(MnistflowError, match="'fc1.weight' holds <U1 values; parameters must be numbers"):
        load_any(path, "softmax")


def test_npz_object_arrays_random_bytes_and_lies(tmp_path):
    np.savez(tmp_path / "o.npz", a=np.array([{}], dtype=object))
    with pytest.raises(MnistflowError, match="refused: the npz holds pickled objects"):
        read_npz(tmp_path / "o.npz")
    (tmp_path / "r.npz").write_bytes(b"\0garbage" * 10)  # not 'pickled data' (a minor finding)
    with pytest.raises(MnistflowError, match="not an npz \\(it is not a zip archive"):
        read_npz(tmp_path / "r.npz")
    buf = io.BytesIO()
    np.save(buf, np.zeros((2, 2), np.float32))
    with zipfile.ZipFile(tmp_path / "lie.npz", "w") as z:  # the header claims more than is stored
        z.writestr("a.npy", buf.getvalue().replace(b"(2, 2)", b"(9, 9)"))
    with pytest.raises(MnistflowError, match="'a' declares 9x9 float32 \\(324 bytes\\) but stores 16"):
        read_npz(tmp_path / "lie.npz")


def test_npz_bomb_is_refused_from_its_headers(tmp_path):
    """A few MB of deflated zeros declaring 8 GiB: refused before inflating anything."""
    from numpy.lib import format as npf

    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z, z.open("a.npy", "w", force_zip64=True) as f:
        npf.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (1 << 31,)})
        f.write(b"\0" * (1 << 20))
    errors = []

    def run():
        with pytest.raises(MnistflowError) as e:
            read_npz(path)
        errors.append(str(e.value))

    assert _peak_mb(run) < 20
    assert "'a' declares 2147483648 float32 (8,589,934,592 bytes) but stores 1,048,576" in errors[0]


def test_npz_total_size_cap(tmp_path, monkeypatch):
    np.savez(tmp_path / "big.npz", a=np.zeros(300, np.float32), b=np.zeros(300, np.float32))
    monkeypatch.setattr(limits, "MAX_NPZ_BYTES", 2000)
    with pytest.raises(MnistflowError, match="the arrays declare over 2,000 bytes"):
        read_npz(tmp_path / "big.npz")


def test_npz_with_metadata_round_trips_and_bad_metadata_is_refused(tmp_path):
    sd = {k: v.numpy() for k, v in _weights().items()}
    write_npz(tmp_path / "ok.npz", sd, INFO)
    model, info = load_any(tmp_path / "ok.npz")
    assert info == INFO and torch.equal(model.fc1.weight, torch.from_numpy(sd["fc1.weight"]))
    bad = ModelInfo("softmax", [1, 28, 28], NAMES, [33.0, 1.0], [78.0], dataset="x")
    write_npz(tmp_path / "bad.npz", sd, bad)
    with pytest.raises(MnistflowError, match="mean must be 1 finite number"):
        load_any(tmp_path / "bad.npz")


# --- ONNX ---------------------------------------------------------------------------------

def _onnx(path, meta: object, *, classes: int = 10, stored: int | None = None, external: bool = False) -> str:
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    w = np.zeros((784, classes), np.float32)
    init = helper.make_tensor("W", TensorProto.FLOAT, w.shape, w.tobytes(), raw=True)
    if stored is not None:
        init.raw_data = init.raw_data[:stored]
    if external:
        init.ClearField("raw_data")
        init.data_location = TensorProto.EXTERNAL
        init.external_data.add(key="location", value="../../etc/passwd")
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["input"], ["flat"]), helper.make_node("MatMul", ["flat", "W"], ["logits"])],
        "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 28, 28])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])], [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if meta is not None:
        helper.set_model_props(model, {"mnistflow": meta if isinstance(meta, str) else json.dumps(meta)})
    onnx.save(model, str(path))
    return str(path)


def test_onnx_good_file_loads(tmp_path):
    backend, info = load_any(_onnx(tmp_path / "m.onnx", BASE))
    assert info == INFO and backend.predict(np.zeros((2, 28, 28, 1), np.uint8)).shape == (2, 10)


@pytest.mark.parametrize("kw,fragment", [
    (dict(meta=dict(BASE, class_names=[])), "class_names must be a list"),  # no classes
    (dict(meta=dict(BASE, in_shape=[3, 32, 32], mean=[1.0] * 3, std=[1.0] * 3)),
     "ONNX input shape ['batch', 1, 28, 28] does not match the metadata's in_shape 3x32x32"),
    (dict(meta=BASE, classes=7), "ONNX output shape ['batch', 7] does not match the metadata's 10 classes"),
    (dict(meta=None), "ONNX model has no mnistflow metadata"),
    (dict(meta=BASE, stored=100), "initializer 'W' declares 784x10 values but stores 100 bytes"),
    (dict(meta=BASE, external=True), "refused: initializer 'W' keeps its data outside the file"),
], ids=["no classes", "wrong in_shape", "wrong classes", "no metadata", "short initializer", "external data"])
def test_onnx_bad_files_are_one_error(tmp_path, kw, fragment):
    path = _onnx(tmp_path / "m.onnx", **kw)
    with pytest.raises(MnistflowError) as e:
        load_any(path)
    assert fragment in str(e.value), str(e.value)


@pytest.mark.parametrize("out,fragment", [
    (np.zeros((2, 5), np.float32), "computed float32 (2, 5) for 2 image(s), not float logits (2, 10)"),
    (np.full((2, 10), "7"), "computed <U1 (2, 10) for 2 image(s), not float logits"),
    (np.zeros((2, 10), np.int64), "computed int64 (2, 10) for 2 image(s), not float logits"),
    (np.zeros((2, 10, 1), np.float32), "computed float32 (2, 10, 1)"),
    ([1, 2], "computed list for 2 image(s)"),
    (np.array([[0.0] * 10, [np.nan] + [0.0] * 9], np.float32), "NaN or infinite logits for 1 of 2 image(s)"),
], ids=["lies5", "strings", "int64", "3-d", "not an array", "nan"])
def test_onnx_answers_are_checked_on_every_call(out, fragment):
    """Issue 40, R7: what onnxruntime returns is checked before anything uses it (a graph that
    computes other than it declares gave tracebacks, or rc 0 with 0.2 under 10 names, or nan)."""
    from types import SimpleNamespace

    from mnistflow.artifacts.onnx import OnnxBackend

    class Session:
        def get_inputs(self):
            return [SimpleNamespace(name="input")]

        def run(self, names, feed, options=None):
            return [out]

    backend = OnnxBackend(Session(), INFO)
    with pytest.raises(MnistflowError) as e:
        backend.predict(np.zeros((2, 28, 28, 1), np.uint8))
    assert fragment in str(e.value), str(e.value)


def test_npz_without_metadata_says_what_predict_and_serve_can_use(tmp_path):
    """Minor finding: predict/serve told the user to pass --data, which they do not have."""
    path = tmp_path / "plain.npz"
    np.savez(path, **{k: v.numpy() for k, v in _weights().items()})
    with pytest.raises(MnistflowError) as e:
        load_any(path)
    msg = str(e.value)
    assert "use an npz written by 'mnistflow export'" in msg and "eval --model NAME --data RECORDS" in msg, msg


def test_onnx_metadata_that_is_not_utf8_is_one_error(tmp_path):
    """Found by the fuzz hunt: onnxruntime raised UnicodeDecodeError on metadata bytes that are
    not UTF-8 (protobuf strings are not checked when the file is parsed)."""
    path = tmp_path / "m.onnx"
    _onnx(path, "@@@@@@@@")
    data = path.read_bytes()
    assert data.count(b"@@@@@@@@") == 1
    path.write_bytes(data.replace(b"@@@@@@@@", b"\xff\xfe\xfd\xfc\xff\xfe\xfd\xfc"))
    with pytest.raises(MnistflowError, match="ONNX model metadata is not UTF-8 text"):
        load_any(path)


# --- model files that must not be read: FIFOs, devices, files over the cap ------------------------


@pytest.mark.parametrize("name", ["m.safetensors", "m.onnx", "m.pt", "m.ckpt", "m.npz", "m.bin", "m.weights"])
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_device_model_file_is_one_error_at_once(tmp_path, name, kind):
    p = tmp_path / name
    os.mkfifo(p) if kind == "fifo" else p.symlink_to("/dev/zero")
    with deadline(5), pytest.raises(MnistflowError) as e:
        load_any(p, "softmax", data=tmp_path)
    assert str(e.value) == (f"{p}: not a regular file ({'a FIFO' if kind == 'fifo' else 'a device'}); "
                            "refusing to read it")


def test_a_run_directorys_fifo_model_file_is_refused_not_skipped(tmp_path):
    os.mkfifo(tmp_path / "model.safetensors")
    with deadline(5), pytest.raises(MnistflowError, match=r"model.safetensors: not a regular file \(a FIFO\)"):
        load_any(tmp_path)


@pytest.mark.parametrize("name", ["m.onnx", "m.safetensors", "m.pt"])
def test_a_sparse_model_file_over_the_cap_is_refused_unread(tmp_path, name):
    p = tmp_path / name
    cap = limits.MAX_CHECKPOINT_BYTES if name.endswith(".pt") else limits.MAX_MODEL_BYTES
    with open(p, "wb") as f:
        f.truncate(cap + 1)
    errors = []

    def attempt():
        with pytest.raises(MnistflowError) as e:
            load_any(p)
        errors.append(str(e.value))

    peak = _peak_mb(attempt)
    assert f"of {cap + 1:,} bytes is over the {cap:,}-byte limit" in errors[0], errors
    assert "\n" not in errors[0] and peak < 64, (errors, peak)


def test_onnx_initializers_that_are_not_finite_are_refused(tmp_path):
    onnx = pytest.importorskip("onnx")
    path = _onnx(tmp_path / "m.onnx", BASE)
    m = onnx.load(path)
    w = np.zeros((784, 10), np.float32)
    w[5, 5] = np.inf
    m.graph.initializer[0].raw_data = w.tobytes()
    onnx.save(m, path)
    with pytest.raises(MnistflowError, match=r"m.onnx: initializer 'W' holds non-finite values"):
        load_any(path)
