"""Exports: ONNX verified in onnxruntime on real test images (+ int8), npz by name (selective,
reported), safetensors; eval/predict accept every format."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers.cli import assert_one_line_error, run_cli
from mnistflow.artifacts import checkpoint
from mnistflow.core.errors import MnistflowError
from mnistflow.inference import evaluate
from mnistflow.artifacts.npz import NPZ_META_KEY, load_npz_into, read_npz
from mnistflow.exporting import export, format_export
from mnistflow.models import create_model, list_models
from mnistflow.training.api import train


@pytest.fixture(scope="module")
def trained(mnist_records, tmp_path_factory):
    """A conv net (conv, batch norm, pooling, linear) trained briefly on real MNIST."""
    run = tmp_path_factory.mktemp("export") / "run"
    s = train(model="fast", data=str(mnist_records), run_dir=str(run), max_steps=120, batch_size=128,
              optimizer="momentum", nesterov=True, lr=0.05, schedule="onecycle", quiet=True, threads=1,
              tensorboard=False)
    assert s["test_acc"] > 0.9, s
    return run


def _logits(path, n: int = 500, **kw) -> torch.Tensor:
    """The model's logits for the first ``n`` real test images, loaded by ``load_any``."""
    from mnistflow.artifacts.load import load_any
    from mnistflow.data.records import open_records

    model, info = load_any(path, **kw)
    x, _ = open_records(info.records).split("test")
    xb = torch.from_numpy(np.array(x[:n])).permute(0, 3, 1, 2).float()
    xb = (xb - torch.tensor(info.mean).view(1, -1, 1, 1)) / torch.tensor(info.std).view(1, -1, 1, 1)
    with torch.inference_mode():
        return model(xb)




def test_onnx_is_verified_against_pytorch_and_int8_is_compared(trained):
    import onnx
    import onnxruntime as ort

    proc = run_cli("export", str(trained), "--format", "onnx", "--quantize", "int8", "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # the exporter's chatter is not shown
    res = json.loads(proc.stdout)
    print("onnx export:", json.dumps(res))
    assert res["out"] == str(trained / "model.onnx") and res["n_images"] == 10_000
    assert res["max_abs_diff"] < 1e-4 and res["label_agreement"] >= 0.999
    q = res["int8"]
    assert q["out"] == str(trained / "model.int8.onnx")
    assert q["bytes"] < 0.45 * res["bytes"]  # int8 weights: about a quarter, plus the graph
    assert abs(q["acc"] - res["onnx_acc"]) < 0.01 and q["label_agreement"] > 0.98
    text = format_export(res)
    for fragment in ("max abs diff", "labels agree", "10,000 images", "int8", "test acc"):
        assert fragment in text

    m = onnx.load(str(trained / "model.onnx"))
    meta = json.loads({p.key: p.value for p in m.metadata_props}["mnistflow"])
    assert meta["model"] == "fast" and meta["class_names"] == [str(i) for i in range(10)]
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # a named, dynamic batch
    sess = ort.InferenceSession(str(trained / "model.onnx"), providers=["CPUExecutionProvider"])
    for n in (1, 7):
        assert sess.run(None, {"input": np.zeros((n, 1, 28, 28), np.float32)})[0].shape == (n, 10)
    # eval runs the ONNX files in onnxruntime; the float one agrees with PyTorch's accuracy
    proc = run_cli("eval", str(trained / "model.onnx"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["acc"] == pytest.approx(res["onnx_acc"], abs=1e-12)


def test_npz_export_subset_and_restore_by_name_with_reports(trained, mnist_records, tmp_path, capsys):
    full = export(trained, "npz", tmp_path / "full.npz")
    sd = create_model("fast").state_dict()
    with np.load(tmp_path / "full.npz", allow_pickle=False) as z:
        assert set(z.files) == set(sd) | {NPZ_META_KEY}
        assert z["features.0.weight"].shape == (32, 4, 3, 3)  # space-to-depth input: 1 x (2x2) channels
    assert full["names"] == len(sd) == 19
    export(trained, "npz", tmp_path / "sub.npz", only=["features.0.*", "head.*"])
    arrays, info = read_npz(tmp_path / "sub.npz")
    assert set(arrays) == {"features.0.weight", "head.weight"} and info.model == "fast"
    trained_sd = load_file(str(trained / "model.safetensors"))

    m = create_model("fast")
    rep = load_npz_into(m, tmp_path / "full.npz")
    assert rep.complete and len(rep.loaded) == 19
    assert all(torch.equal(m.state_dict()[k], trained_sd[k]) for k in trained_sd)
    # selective: only the first conv; everything else keeps its initial value
    fresh = create_model("fast")
    init = {k: v.clone() for k, v in fresh.state_dict().items()}
    rep = load_npz_into(fresh, tmp_path / "full.npz", only="features.0.*")
    assert rep.loaded == ["features.0.weight"] and rep.complete and len(rep.skipped) == 18
    assert torch.equal(fresh.features[0].weight, trained_sd["features.0.weight"])
    assert torch.equal(fresh.head.weight, init["head.weight"])
    # mismatches are reported by name, not raised from deep inside torch
    rep = load_npz_into(create_model("fast", (1, 28, 28), 5), tmp_path / "full.npz")
    assert rep.mismatched == [("head.weight", (10, 192), (5, 192))] and len(rep.loaded) == 18
    assert "head.weight (file 10x192, model 5x192)" in rep.format()
    rep = load_npz_into(create_model("conv3x3x24-bn-relu,fc10"), tmp_path / "full.npz")
    assert "conv1.weight" in rep.missing and "features.0.weight" in rep.unexpected and not rep.loaded
    # train --init-from: restore the convolutions by name, then fine-tune
    s = train(model="fast", data=str(mnist_records), run_dir=str(tmp_path / "ft"), init_from=str(tmp_path / "full.npz"),
              init_only="features.*", max_steps=1, threads=1, tensorboard=False, keep_checkpoints=0)
    assert "restored 18 of 18 selected tensors" in capsys.readouterr().out
    assert s["steps"] == 1

    # the npz (info inside) loads as the run's model; a bare npz needs --model and --data
    ref = _logits(trained)
    assert torch.equal(_logits(tmp_path / "full.npz"), ref)
    np.savez(tmp_path / "bare.npz", **{k: v.numpy() for k, v in trained_sd.items()})
    assert_one_line_error(run_cli("eval", str(tmp_path / "bare.npz")), "bare.npz", "pass the model name")
    assert torch.equal(_logits(tmp_path / "bare.npz", model_name="fast", data=mnist_records), ref)
    res = evaluate(tmp_path / "full.npz", "val", device="cpu", threads=1)  # the eval verb's path
    assert res["n"] == 5000 and res["acc"] > 0.9 and res["model"] == "fast"
    with pytest.raises(MnistflowError, match="missing: features.2.weight"):
        evaluate(tmp_path / "sub.npz", device="cpu")


def test_safetensors_from_a_checkpoint_and_predict_on_every_format(trained, tmp_path):
    from PIL import Image

    from mnistflow.artifacts.model_file import load_model
    from mnistflow.data.records import open_records
    from mnistflow.inference import predict

    ckpt = checkpoint.find_latest(trained / "checkpoints")
    res = export(ckpt, "safetensors", tmp_path / "w.safetensors")
    w = load_file(str(tmp_path / "w.safetensors"))
    payload = checkpoint.load(ckpt)
    assert set(w) == set(payload["model"]) and all(torch.equal(w[k], payload["model"][k]) for k in w)
    assert res["names"] == 19
    export(trained, "npz", tmp_path / "m.npz")
    if not (trained / "model.onnx").exists():
        export(trained, "onnx", trained / "model.onnx")

    x, y = open_records(load_model(trained)[1].records).split("test")
    paths = []
    for i in range(6):
        p = tmp_path / f"digit{i}.png"
        Image.fromarray(np.asarray(x[i])[..., 0]).save(p)
        paths.append(p)
    labels = {}
    for src in (trained, ckpt, tmp_path / "w.safetensors", tmp_path / "m.npz", trained / "model.onnx"):
        preds = predict(src, paths)
        labels[str(src)] = [p["label"] for p in preds]
        assert all(abs(sum(p["probabilities"]) - 1) < 1e-4 for p in preds)
    assert len({tuple(v) for v in labels.values()}) == 1, labels
    assert sum(a == b for a, b in zip(next(iter(labels.values())), y[:6])) >= 5
    proc = run_cli("predict", str(trained / "model.onnx"), str(paths[0]), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)[0]["label"] == labels[str(trained)][0]


@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_exports_to_onnx_with_a_dynamic_batch(name):
    import onnx

    from mnistflow.artifacts.model_info import ModelInfo
    from mnistflow.artifacts.onnx import session, to_onnx
    from mnistflow.core import limits

    torch.manual_seed(0)
    model = create_model(name).eval()
    info = ModelInfo(name, [1, 28, 28], [str(i) for i in range(10)], [33.3], [78.6])
    data = to_onnx(model, info)
    sess = session(data)
    # every operator of every export is one mnistflow runs (the allow-list is derived from these)
    ops = {n.op_type for n in onnx.load_from_string(data).graph.node}
    assert ops <= limits.ONNX_OPS, ops - limits.ONNX_OPS
    for n in (1, 3):
        x = torch.randn(n, 1, 28, 28)
        with torch.inference_mode():
            ref = model(x).numpy()
        got = sess.run(None, {"input": x.numpy()})[0]
        assert got.shape == (n, 10) and np.abs(got - ref).max() < 1e-4


SPEC = ("conv4x4x8-s2-same-gelu,bn,maxpool3s2-same,conv3x3x8-valid-sigmoid,avgpool2-same,tanh,relu,"
        "dropout0.3,gap,fc20-tanh,bn,fc10")  # every token of a layer spec


@pytest.mark.parametrize("name", ["lenet5-x2", SPEC], ids=["ensemble", "spec"])
def test_ensemble_spec_and_int8_exports_pass_the_graph_checks(name, tmp_path):
    """The ONNX operator allow-list (``limits.ONNX_OPS``) and size checks hold for what ensembles,
    layer specs and int8 quantization export too: each loads through ``load_onnx``."""
    import onnx

    from mnistflow.artifacts.model_info import ModelInfo
    from mnistflow.artifacts.onnx import load_onnx, to_onnx
    from mnistflow.core import limits
    from mnistflow.exporting import quantize_int8

    torch.manual_seed(0)
    info = ModelInfo(name, [1, 28, 28], [str(i) for i in range(10)], [33.3], [78.6])
    data = to_onnx(create_model(name).eval(), info)
    int8 = quantize_int8(data, np.random.default_rng(0).standard_normal((64, 1, 28, 28), np.float32))
    for tag, blob in (("f", data), ("int8", int8)):
        ops = {n.op_type for n in onnx.load_from_string(blob).graph.node}
        assert ops <= limits.ONNX_OPS, (tag, ops - limits.ONNX_OPS)
        (tmp_path / f"{tag}.onnx").write_bytes(blob)
        backend, _ = load_onnx(tmp_path / f"{tag}.onnx")
        assert backend.run(np.zeros((3, 1, 28, 28), np.float32)).shape == (3, 10)


def test_missing_onnx_packages_and_bad_requests_are_one_line(trained, tmp_path):
    blocker = tmp_path / "blocked"
    blocker.mkdir()
    (blocker / "onnxscript.py").write_text("raise ImportError('blocked for this test')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])}
    proc = run_cli("export", str(trained), "--format", "onnx", "--out", str(tmp_path / "x.onnx"), env=env)
    assert_one_line_error(proc, "onnxscript", "pip install 'mnistflow[onnx]'")
    assert not (tmp_path / "x.onnx").exists()
    assert_one_line_error(run_cli("export", str(trained), "--format", "onnx", "--only", "head.*"),
                          "--only selects parameters for npz/safetensors")
    assert_one_line_error(run_cli("export", str(trained), "--format", "npz", "--only", "nothing*",
                                  "--out", str(tmp_path / "n.npz")), "matches no name")
    for blank in (",,,", "", " , "):  # a selection with no pattern in it is not "everything"
        assert_one_line_error(run_cli("export", str(trained), "--format", "npz", "--only", blank,
                                      "--out", str(tmp_path / "n.npz")), "holds no name pattern")
    assert not (tmp_path / "n.npz").exists()
