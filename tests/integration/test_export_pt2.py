"""``export --format pt2``: a torch.export program, verified against PyTorch on the real test
images before it is written; loaded back by eval / predict / serve; a model torch.export cannot
trace, and a broken or foreign .pt2, are one error line."""
from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.cli import REPO, assert_one_line_error, run_cli
from mnistflow.artifacts.load import load_any
from mnistflow.artifacts.model_file import save_model
from mnistflow.artifacts.model_info import info_from_records
from mnistflow.artifacts.pt2 import INFO_FILE, ExportedModel
from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError
from mnistflow.data.normalize import normalize_np
from mnistflow.data.records import open_records
from mnistflow.exporting import export, format_export
from mnistflow.models import create_model
from mnistflow.training.api import train

TESTS_ON_PATH = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")]))}


@pytest.fixture(autouse=True)
def trusted(monkeypatch):
    """These tests load .pt2 files they wrote themselves: trusted (the subprocesses inherit it)."""
    monkeypatch.setenv("MNISTFLOW_TRUST_PT2", "1")


@pytest.fixture(scope="module")
def runs(mnist_records, tmp_path_factory) -> dict[str, Path]:
    """A softmax and a conv net (``fast``: conv, batch norm, pooling, linear), each trained
    briefly on real MNIST in fp32 (so that ``eval RUN`` and the fp32 program compare alike)."""
    out = {}
    for name in ("softmax", "fast"):
        run = tmp_path_factory.mktemp("pt2") / name
        s = train(model=name, data=str(mnist_records), run_dir=str(run), max_steps=120, batch_size=128,
                  precision="fp32", quiet=True, threads=1, tensorboard=False, keep_checkpoints=0)
        assert s["test_acc"] > 0.85, s
        out[name] = run
    return out


def _test_images(records: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = open_records(records).split("test")
    return np.asarray(x[:n]), np.asarray(y[:n])


@pytest.mark.parametrize("name", ["softmax", "fast"])
def test_pt2_is_verified_and_equals_the_model_on_real_images(runs, name):
    run = runs[name]
    proc = run_cli("export", str(run), "--format", "pt2", "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # torch.export's chatter is not shown
    res = json.loads(proc.stdout)
    print(f"pt2 export of {name}:", json.dumps(res))
    assert res["out"] == str(run / "model.pt2") and res["n_images"] == 10_000
    assert res["max_abs_diff"] < 1e-5 and res["label_agreement"] == 1.0
    assert res["pt2_acc"] == res["torch_acc"] and res["bytes"] == (run / "model.pt2").stat().st_size
    text = format_export(res)
    for fragment in ("model.pt2", "10,000 images (mnist test), loaded back, vs PyTorch", "max abs diff",
                     "labels agree    100.00%", "test accuracy"):
        assert fragment in text, text

    # PyTorch alone reads it: the program and mnistflow's info beside it
    info_json = {INFO_FILE: ""}
    program = torch.export.load(run / "model.pt2", extra_files=info_json)
    assert json.loads(info_json[INFO_FILE])["model"] == name
    # load_any gives a module whose outputs are the model's, for any batch size
    model, info = load_any(run)
    exported, info2 = load_any(run / "model.pt2")
    assert isinstance(exported, ExportedModel) and info2 == info and not exported.training
    x_u8, _ = _test_images(info.records, 37)
    x = torch.from_numpy(normalize_np(x_u8, info.mean, info.std))
    with torch.inference_mode():
        for n in (1, 37):
            ref = model(x[:n])
            for got in (exported(x[:n]), program.module()(x[:n])):
                assert got.shape == (n, 10)
                assert (got - ref).abs().max().item() <= 1e-5, (n, (got - ref).abs().max().item())


def test_eval_predict_and_serve_take_the_pt2(runs, tmp_path):
    from PIL import Image

    run = runs["fast"]
    if not (run / "model.pt2").exists():
        export(run, "pt2")
    results = {}
    for src in (run, run / "model.pt2"):
        proc = run_cli("eval", str(src), "--json")
        assert proc.returncode == 0, proc.stderr
        results[src] = json.loads(proc.stdout)
    ref, got = results[run], results[run / "model.pt2"]
    assert got["n"] == ref["n"] == 10_000 and got["precision"] == ref["precision"] == "fp32"
    assert got["acc"] == ref["acc"] and got["loss"] == pytest.approx(ref["loss"], abs=1e-5)
    assert got["confusion"] == ref["confusion"]

    x_u8, y = _test_images(load_any(run)[1].records, 4)
    pictures = []
    for i in range(4):
        pictures.append(tmp_path / f"digit{i}.png")
        Image.fromarray(x_u8[i][..., 0]).save(pictures[-1])
    labels = {}
    for src in (run, run / "model.pt2"):
        proc = run_cli("predict", str(src), *map(str, pictures), "--json")
        assert proc.returncode == 0, proc.stderr
        labels[src] = [p["label"] for p in json.loads(proc.stdout)]
    assert labels[run] == labels[run / "model.pt2"] and sum(a == b for a, b in zip(labels[run], y)) >= 3

    httpx = pytest.importorskip("httpx")
    import uvicorn

    from helpers.serving import uvicorn_thread
    from mnistflow.server import create_app

    app = create_app(run / "model.pt2")
    with uvicorn_thread(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2)) as port, \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        m = client.get("/api/model").json()
        assert m["model"] == "fast" and m["backend"] == "pytorch" and m["params"] > 10_000
        r = client.post("/api/predict", json={"pixels": x_u8[0][..., 0].tolist()})
        assert r.status_code == 200, r.text
        assert r.json()["label"] == labels[run][0]


def test_an_ensemble_exports(mnist_records, tmp_path):
    """``NAME-xK`` (the members' averaged probabilities) is one program too."""
    torch.manual_seed(0)
    info = info_from_records("fast-wide-x4", open_records(mnist_records))
    save_model(tmp_path / "model.safetensors", create_model("fast-wide-x4").eval(), info)
    res = export(tmp_path, "pt2", verify_images=500)
    assert res["out"] == str(tmp_path / "model.pt2") and res["n_images"] == 500
    assert res["max_abs_diff"] < 1e-5 and res["label_agreement"] == 1.0
    model, _ = load_any(tmp_path / "model.pt2")
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in create_model("fast-wide-x4").parameters())


def test_a_model_torch_export_cannot_trace_is_one_line(mnist_records, tmp_path):
    """A user's model that branches on tensor values: one line, exit 2, nothing written."""
    factory = "helpers.custom_models:ValueBranchNet"
    info = info_from_records(factory, open_records(mnist_records))
    info.factory = factory
    from helpers.custom_models import ValueBranchNet

    model_dir = tmp_path / "m"
    model_dir.mkdir()
    save_model(model_dir / "model.safetensors", ValueBranchNet(), info)
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("export", str(model_dir / "model.safetensors"), "--format", "pt2",
                   "--out", str(out / "v.pt2"), env=TESTS_ON_PATH)
    assert_one_line_error(proc, f"torch.export of '{factory}' failed", "data-dependent")
    proc = run_cli("export", str(model_dir / "model.safetensors"), "--format", "pt2", env=TESTS_ON_PATH)
    assert_one_line_error(proc, "failed")
    assert os.listdir(out) == [] and sorted(os.listdir(model_dir)) == ["model.safetensors"]


def test_export_rules_hold_for_pt2(runs, tmp_path):
    run = runs["softmax"]
    with pytest.raises(MnistflowError, match="--only selects parameters for npz/safetensors; pt2 needs"):
        export(run, "pt2", tmp_path / "m.pt2", only="fc*")
    with pytest.raises(MnistflowError, match=r"m\.onnx: the name of an onnx file, not pt2: name it \*\.pt2"):
        export(run, "pt2", tmp_path / "m.onnx")
    with pytest.raises(MnistflowError, match=r"m\.pt2: the name of a pt2 file, not npz"):
        export(run, "npz", tmp_path / "m.pt2")
    with pytest.raises(MnistflowError, match="--quantize int8 applies to --format onnx"):
        export(run, "pt2", tmp_path / "m.pt2", quantize="int8")
    export(run, "pt2", tmp_path / "m.pt2", verify_images=100)
    with pytest.raises(MnistflowError, match="already an exported program; export from the run directory"):
        export(tmp_path / "m.pt2", "onnx", tmp_path / "m.onnx")
    assert sorted(os.listdir(tmp_path)) == ["m.pt2"]


# --- hostile and foreign .pt2 files ----------------------------------------------------------

def _program(model: torch.nn.Module, batch=None) -> torch.export.ExportedProgram:
    dyn = None if batch is None else ({0: batch},)
    return torch.export.export(model.eval(), (torch.zeros(2, 1, 28, 28),), dynamic_shapes=dyn)


def test_broken_and_foreign_pt2_files_are_one_line(runs, tmp_path):
    """Refused in one line each: before torch reads the file (not a zip, no or bad mnistflow
    info) or after (a damaged graph, a program unlike its info, non-finite weights)."""
    run = runs["softmax"]
    if not (run / "model.pt2").exists():
        export(run, "pt2")
    blob = (run / "model.pt2").read_bytes()
    info = json.loads(zipfile.ZipFile(io.BytesIO(blob)).read(f"archive/extra/{INFO_FILE}"))
    batch = torch.export.Dim("batch")
    softmax = _program(create_model("softmax"), batch)
    (tmp_path / "truncated.pt2").write_bytes(blob[: len(blob) // 2])
    (tmp_path / "tail-cut.pt2").write_bytes(blob[:-30])  # only the nested sample-inputs zip is found
    (tmp_path / "text.pt2").write_bytes(b"hello\n")
    torch.export.save(softmax, tmp_path / "no-info.pt2")
    torch.export.save(softmax, tmp_path / "huge-info.pt2",
                      extra_files={INFO_FILE: " " * (limits.MAX_MODEL_META_CHARS + 1)})
    torch.export.save(softmax, tmp_path / "bad-info.pt2", extra_files={INFO_FILE: '{"model": "softmax"'})
    with zipfile.ZipFile(io.BytesIO(blob)) as src, zipfile.ZipFile(tmp_path / "bad-graph.pt2", "w") as dst:
        for m in src.infolist():
            dst.writestr(m.filename, b'{"graph_module": 3}' if m.filename.endswith("models/model.json")
                         else src.read(m))
    five = {**info, "class_names": list("abcde"), "label_values": None}
    torch.export.save(softmax, tmp_path / "other-classes.pt2", extra_files={INFO_FILE: json.dumps(five)})
    torch.export.save(_program(create_model("softmax")), tmp_path / "fixed-batch.pt2",
                      extra_files={INFO_FILE: json.dumps(info)})
    bad = create_model("softmax")
    with torch.no_grad():
        bad.fc1.weight[0, 0] = float("nan")
    torch.export.save(_program(bad, batch), tmp_path / "nan.pt2", extra_files={INFO_FILE: json.dumps(info)})

    on_the_cli = {  # exit 2 and one line: torch's own warnings and tracebacks stay hidden
        "truncated.pt2": "not a readable .pt2 archive (BadZipFile",
        "no-info.pt2": "has no mnistflow info",
        "huge-info.pt2": f"its mnistflow info declares {limits.MAX_MODEL_META_CHARS + 1:,} bytes",
        "bad-graph.pt2": "not a loadable torch.export program",
        "other-classes.pt2": "the program's output (s",  # (s.., 10), not (N, 5)
        "fixed-batch.pt2": "the program's input (2, 1, 28, 28) is not (N, 1, 28, 28) with a dynamic N",
    }
    for name, fragment in on_the_cli.items():
        assert_one_line_error(run_cli("eval", str(tmp_path / name)), f"{name}: ", fragment)
    in_process = {
        "tail-cut.pt2": "not a torch.export archive",
        "text.pt2": "not a readable .pt2 archive",
        "bad-info.pt2": "unreadable mnistflow metadata",
        "nan.pt2": "non-finite",
    }
    for name, fragment in in_process.items():
        with pytest.raises(MnistflowError, match=fragment):
            load_any(tmp_path / name)


def test_a_pt2_is_loaded_only_when_the_user_trusts_it_as_code(runs, monkeypatch):
    """A .pt2 is a program: eval, predict and serve refuse it in one line until the user sets
    MNISTFLOW_TRUST_PT2=1, before torch reads a byte of it."""
    run = runs["softmax"]
    if not (run / "model.pt2").exists():
        export(run, "pt2")
    monkeypatch.delenv("MNISTFLOW_TRUST_PT2")
    why = "a .pt2 is a program, not data"
    for verb in ("eval", "predict"):
        args = [verb, str(run / "model.pt2")] + ([str(run / "model.pt2")] if verb == "predict" else [])
        assert_one_line_error(run_cli(*args), why, "set MNISTFLOW_TRUST_PT2=1")
    from mnistflow.server import create_app

    with pytest.raises(MnistflowError, match=why):
        create_app(run / "model.pt2")
    monkeypatch.setenv("MNISTFLOW_TRUST_PT2", "0")
    with pytest.raises(MnistflowError, match=why):
        load_any(run / "model.pt2")
