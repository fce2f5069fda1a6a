"""Property: every model loader, fed random bytes or a mutated valid file (bit flips,
truncation, appended junk, overwrites, deletions), gives a model that works or raises
MnistflowError -- never another exception, a crash or a huge allocation -- and its peak memory
growth stays under ``helpers.memory.bound`` of the file's size (issue 19, D8 and D16: model
files whose metadata or weights lied made eval/predict/serve crash or try to allocate 400 GB).

The loaders: ``model.safetensors`` (``artifacts.model_file`` through ``load_any``), npz (whole
model through ``load_any``, and the selective restore ``load_npz_into`` of ``--init-from``),
checkpoints (``artifacts.checkpoint``), and ONNX (``artifacts.onnx``).
The seeds are a tiny model (3 classes of 4x4 pictures, 51 parameters) so that a mutation
lands in the header, the metadata or the structure as often as in the weights. Checkpoints
are checksummed, so most mutations stop at the checksum; a second target re-seals the mutated
payload, so that ``torch.load`` itself sees it.

Deterministic in CI (100 examples per target); MNISTFLOW_FUZZ_EXAMPLES=N runs a longer,
random hunt by hand.
"""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from helpers.memory import assert_bounded
from hypothesis import given
from hypothesis import strategies as st

from helpers.fuzz import FUZZ, mutated
from mnistflow.artifacts import checkpoint
from mnistflow.artifacts.load import load_any
from mnistflow.artifacts.model_file import save_model
from mnistflow.artifacts.model_info import ModelInfo
from mnistflow.artifacts.npz import load_npz_into, write_npz
from mnistflow.core.errors import MnistflowError
from mnistflow.models import create_model


SHAPE = (1, 4, 4)
INFO = ModelInfo("softmax", list(SHAPE), ["a", "b", "c"], [33.0], [78.0], dataset="synthetic")


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model(INFO.model, SHAPE, INFO.num_classes)





def inputs(seed: bytes, head: int | None = None):
    return st.one_of(st.binary(max_size=2048), mutated(seed, head))


def works(model) -> None:
    """What a loaded model must do: classify a batch of zeros into one score per class."""
    if hasattr(model, "predict"):  # an OnnxBackend
        out = model.predict(np.zeros((2, 4, 4, 1), np.uint8))
    else:
        with torch.no_grad():
            out = model(torch.zeros(2, *SHAPE)).numpy()
    assert out.shape == (2, INFO.num_classes), out.shape


def loads_or_fails(path, fn=load_any, *args):
    """The property: a working model, or MnistflowError, in bounded memory and without a raw
    Python warning; anything else propagates (and fails the example)."""
    size = path.stat().st_size

    def call():
        out = fn(path, *args)
        if isinstance(out, tuple):
            works(out[0])
        return out

    with warnings.catch_warnings(record=True) as seen:  # a raw warning would break the
        warnings.simplefilter("always")                 # one-line rule too
        try:
            return assert_bounded(call, size, f"{fn.__name__}({path.name})")
        except MnistflowError as e:
            assert str(e) and "\n" not in str(e), repr(str(e))
            return None
        finally:
            assert not seen, [f"{w.category.__name__}: {w.message}" for w in seen]


# --- seeds ---------------------------------------------------------------------------------

def _checkpoint_payload(version: int) -> dict:
    model = tiny_model()
    return {"format_version": version, "model": model.state_dict(), "optimizer": {}, "scheduler": None,
            "scaler": None, "rng": {}, "train_state": {"step": 3}, "config": {"model": INFO.model},
            "data": {}, "model_info": json.loads(INFO.to_json())}


def _onnx_bytes() -> bytes:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    sd = tiny_model().state_dict()
    w, b = (t.numpy() for t in sd.values())
    inits = [helper.make_tensor("W", TensorProto.FLOAT, w.T.shape, w.T.tobytes(), raw=True),
             helper.make_tensor("B", TensorProto.FLOAT, b.shape, b.tobytes(), raw=True)]
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["input"], ["flat"]), helper.make_node("MatMul", ["flat", "W"], ["mm"]),
         helper.make_node("Add", ["mm", "B"], ["logits"])],
        "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", *SHAPE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", INFO.num_classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {"mnistflow": INFO.to_json()})
    return model.SerializeToString()


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> dict[str, bytes]:
    tmp = tmp_path_factory.mktemp("seeds")
    model = tiny_model()
    save_model(tmp / "m.safetensors", model, INFO)
    write_npz(tmp / "m.npz", {k: v.numpy() for k, v in model.state_dict().items()}, INFO)
    body = checkpoint._serialize(_checkpoint_payload(checkpoint.FORMAT_VERSION))
    out = {"safetensors": (tmp / "m.safetensors").read_bytes(), "npz": (tmp / "m.npz").read_bytes(),
           "ckpt_body": body, "ckpt": checkpoint.seal(body, {"step": 3})}
    for name, suffix in (("safetensors", ".safetensors"), ("npz", ".npz"), ("ckpt", ".pt")):
        p = tmp / f"seed-{name}{suffix}"
        p.write_bytes(out[name])
        load_any(p)  # every seed loads (this first call, unmeasured, imports what loading needs)
        assert loads_or_fails(p) is not None, name
    return out


@pytest.fixture(scope="module")
def onnx_seed(tmp_path_factory) -> bytes:
    data = _onnx_bytes()
    p = tmp_path_factory.mktemp("onnx") / "m.onnx"
    p.write_bytes(data)
    load_any(p)  # imports onnx and onnxruntime, unmeasured
    assert loads_or_fails(p) is not None
    return data


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-models")


# --- safetensors -----------------------------------------------------------------------------

def test_safetensors(seeds, work):
    head = 8 + int.from_bytes(seeds["safetensors"][:8], "little")  # length + JSON header

    @FUZZ
    @given(inputs(seeds["safetensors"], head))
    def run(blob):
        (work / "m.safetensors").write_bytes(blob)
        loads_or_fails(work / "m.safetensors")

    run()


# --- npz: the whole model, and --init-from's selective restore ---------------------------------

def test_npz(seeds, work):
    @FUZZ
    @given(inputs(seeds["npz"]), st.sampled_from([None, "fc*", "*.bias", "nothing"]))
    def run(blob, only):
        p = work / "m.npz"
        p.write_bytes(blob)
        loads_or_fails(p)
        model = tiny_model()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        rep = loads_or_fails(p, lambda path: load_npz_into(model, path, only))
        if rep is not None:  # what it reports restored matches what it changed
            changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
            assert changed <= set(rep.loaded), (changed, rep.loaded)

    run()


# --- checkpoints ----------------------------------------------------------------------------

def test_checkpoint_files(seeds, work):
    @FUZZ
    @given(st.data())
    def run(data):
        blob = data.draw(inputs(seeds["ckpt"], 512))
        p = work / "step-000003.pt"
        p.write_bytes(blob)
        loads_or_fails(p)
        loads_or_fails(p, checkpoint.load)

    run()


def _reseal(body: bytes) -> bytes:
    """A mutated torch archive as a checkpoint whose checksum matches it, so that torch.load
    reads it; as it is when it is no zip any more (the reader refuses it)."""
    try:
        return checkpoint.seal(body, {"step": 3})
    except Exception:  # noqa: BLE001 -- not a zip any more (zipfile fails in many ways)
        return body


def test_checkpoint_payloads(seeds, work):
    """Mutated payloads with valid checksums: what ``torch.load(weights_only=True)`` and the
    payload checks see."""
    @FUZZ
    @given(mutated(seeds["ckpt_body"]))
    def run(body):
        p = work / "resealed.pt"
        p.write_bytes(_reseal(body))
        loads_or_fails(p)
        loads_or_fails(p, checkpoint.load)

    run()


# --- ONNX -----------------------------------------------------------------------------------

def test_onnx(onnx_seed, work):
    @FUZZ
    @given(inputs(onnx_seed))
    def run(blob):
        (work / "m.onnx").write_bytes(blob)
        loads_or_fails(work / "m.onnx")

    run()


def test_the_seeds_are_real_models(seeds, onnx_seed, work):
    """The fuzz starts from files that load and classify (else it would only test refusals)."""
    for name, suffix in (("safetensors", ".safetensors"), ("npz", ".npz"), ("ckpt", ".pt")):
        p = work / f"real-{name}{suffix}"
        p.write_bytes(seeds[name])
        model, info = load_any(p)
        assert info == INFO, name
        works(model)
    (work / "real.onnx").write_bytes(onnx_seed)
    backend, info = load_any(work / "real.onnx")
    assert info == INFO
    x = np.arange(16, dtype=np.uint8).reshape(1, 4, 4, 1)
    want = torch.softmax(tiny_model()(torch.from_numpy((x.astype(np.float32) - 33) / 78).permute(0, 3, 1, 2)), 1)
    np.testing.assert_allclose(backend.predict(x), want.detach().numpy(), atol=1e-5)
