"""``mnistflow export --format web`` without a browser: the traced graph (``artifacts.web``) run
in PyTorch against the model for the operations users' models call, the one-line refusals of
what the page cannot run, and the folder's rules (what it holds, where it may be written).
The page itself, in Chromium against PyTorch: tests/integration/test_web_export.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from mnistflow import cli
from mnistflow.artifacts.model_info import ModelInfo
from mnistflow.artifacts.web.folder import FILES, model_json, page_html
from mnistflow.artifacts.web.run import check, run_graph
from mnistflow.artifacts.web.trace import trace
from mnistflow.core.errors import MnistflowError



def one_line_error(capsys, argv: list[str], *fragments: str) -> None:
    """``mnistflow ARGV`` (in this process) fails with exit 2 and one line holding ``fragments``."""
    assert cli.main(argv) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("mnistflow: error: "), lines
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def info_for(name: str, shape=(1, 28, 28), **kw) -> ModelInfo:
    return ModelInfo(model=name, in_shape=list(shape), class_names=[str(i) for i in range(10)],
                     mean=[33.3] * shape[0], std=[78.6] * shape[0], dataset="mnist", **kw)


def images(n: int, shape=(1, 28, 28), seed: int = 0) -> np.ndarray:
    c, h, w = shape
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, c), dtype=np.uint8)


def traced(model: nn.Module, shape=(1, 28, 28)):
    from mnistflow.data.normalize import normalize

    info = info_for(type(model).__name__, shape)
    return trace(model.eval(), normalize(images(1, shape), info.mean, info.std)), info


def test_a_users_forward_of_functional_operations_runs_in_the_graph():
    from helpers.custom_models import Everything

    torch.manual_seed(0)
    model = Everything().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.3, 0.3)
        model.bn.running_var.uniform_(0.5, 2.0)
    g, info = traced(model)
    res = check(g, model, info, images(3, seed=1))
    assert res["max_prob_diff"] < 1e-6 and res["max_layer_diff"] < 1e-5
    ops = {n["op"] for n in g.nodes}
    assert {"conv2d", "affine", "unary", "binary", "concat", "pad", "avgpool2d", "adaptivepool2d",
            "reduce", "softmax", "permute", "reshape", "linear", "const"} <= ops
    assert [d["name"] for d in g.layers] == ["conv", "bn", "act", "drop", "conv2", "bn1"]
    values = run_graph(g, torch.zeros(1, 1, 28, 28))
    assert values[g.layers[3]["node"]] is values[g.layers[2]["node"]]  # dropout: its input, unchanged


class Sorting(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        return torch.sort(self.fc(x.flatten(1)), 1).values


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(784, 10, batch_first=True)

    def forward(self, x):
        return self.rnn(x.flatten(2))[0].flatten(1)


class Branching(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        y = self.fc(x.flatten(1))
        return y if float(y.max()) > 0 else -y


class Reflecting(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect")
        self.fc = nn.Linear(2 * 784, 10)

    def forward(self, x):
        return self.fc(self.conv(x).flatten(1))


class InPlace(nn.Module):
    """Changes its input in place, adds a constant made like it, calls a layer twice."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        x.sub_(0.5)
        y = self.act(x.flatten(1)) + torch.ones_like(x.flatten(1))
        return self.act(self.fc(y)) - 1


def test_in_place_changes_constants_and_repeated_layers():
    model = InPlace().eval()
    g, info = traced(model)
    assert check(g, model, info, images(2))["max_prob_diff"] < 1e-6
    assert [d["name"] for d in g.layers] == ["act", "fc", "act#2"]


class Doubled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10).double()

    def forward(self, x):
        return self.fc(x.double().flatten(1)).float()


@pytest.mark.parametrize("model, fragments", [
    (Sorting(), ["the model (Sorting)", "calls sort", "which the web page cannot run"]),
    (Recurrent(), ["layer 'rnn' (LSTM)", "calls lstm"]),
    (Branching(), ["the model (Branching)", "reads the values back into Python"]),
    (Reflecting(), ["layer 'conv' (Conv2d)", "reflect padding"]),
    (Doubled(), ["the model (Doubled)", "float64", "float32"]),
    (nn.Sequential(nn.Flatten(), nn.Linear(10, 10)), ["the model's forward fails on a 1x28x28 input"]),
], ids=["sort", "lstm", "item", "reflect", "float64", "shape"])
def test_what_the_page_cannot_run_is_one_line_naming_the_layer(model, fragments):
    with pytest.raises(MnistflowError) as e:
        traced(model)
    msg = str(e.value)
    assert "\n" not in msg
    for f in fragments:
        assert f in msg, (f, msg)


@pytest.fixture
def user_run(tmp_path, synthetic_records):
    """A run directory holding a user's model (``helpers.custom_models``), with records."""
    from helpers.custom_models import SortNet, TinyNet

    from mnistflow.artifacts.model_file import save_model
    from mnistflow.artifacts.rundir import RunDir

    def make(cls) -> str:
        run = tmp_path / cls.__name__
        run.mkdir()
        info = info_for(cls.__name__, records=str(synthetic_records), factory=f"helpers.custom_models:{cls.__name__}")
        torch.manual_seed(0)
        save_model(RunDir(run).model, cls(), info)
        return str(run)

    return {"sort": make(SortNet), "tiny": make(TinyNet)}


def test_the_cli_refuses_in_one_line_and_writes_nothing(user_run, tmp_path, capsys):
    out = tmp_path / "page"
    one_line_error(capsys, ["export", user_run["sort"], "--format", "web", "--out", str(out)],
                   "the model (SortNet)", "calls sort")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["SortNet", "TinyNet"]


def test_the_folder_is_written_whole_and_replaced_only_when_it_may_be(user_run, tmp_path, capsys):
    from mnistflow.exporting import export, format_export

    out = tmp_path / "page"
    res = export(user_run["tiny"], "web", out)
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES) and res["bytes"] == sum(res["files"].values())
    assert res["max_prob_diff"] < 1e-5 and "verified on" in format_export(res)
    assert b"window.mnistflowModel = {" in (out / "model.js").read_bytes()
    assert b"window.mnistflowForward" in (out / "backend.js").read_bytes()
    with pytest.raises(MnistflowError, match="already exists; --force replaces it"):
        export(user_run["tiny"], "web", out)
    (out / "model.js").write_text("old")
    export(user_run["tiny"], "web", out, force=True)
    assert (out / "model.js").read_bytes() != b"old" and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    for where, fragment in ((mine, "other files than a web export's; not replaced"),
                            (tmp_path / "notes.txt", "is a file, not a folder")):
        (tmp_path / "notes.txt").write_text("x")
        with pytest.raises(MnistflowError, match=fragment):
            export(user_run["tiny"], "web", where, force=True)
    assert (mine / "notes.txt").read_text() == "keep"
    default = export(user_run["tiny"], "web")  # next to the model, made again from the run
    assert default["out"].endswith("model-web") and export(user_run["tiny"], "web")["out"] == default["out"]


@pytest.mark.parametrize("args, fragment", [
    (["--out", "m.onnx"], "the name of an onnx file; --format web writes a folder"),
    (["--out", ""], "--out is empty"),
    (["--only", "conv*"], "--only selects parameters for npz/safetensors; a web page needs the whole model"),
    (["--quantize", "int8"], "--quantize int8 applies to --format onnx"),
])
def test_bad_requests_are_one_line(user_run, args, fragment, capsys):
    one_line_error(capsys, ["export", user_run["tiny"], "--format", "web", *args], fragment)


def test_info_is_the_servers_model_json_with_the_browser_backend():
    from mnistflow.artifacts.predictor import TorchBackend
    from mnistflow.data.picture import Target
    from mnistflow.models import create_model
    from mnistflow.server.app import describe

    info = info_for("lenet5", metrics={"test_acc": 0.99, "val_acc": float("nan")})
    pred = TorchBackend(create_model("lenet5"), info)
    got = model_json(info, pred.params)
    assert got == {**describe(pred), "backend": "browser", "picture": got["picture"]}
    assert got["picture"] == Target.of(info.in_shape, info.mean, info.dataset).style == "mnist"


def test_the_page_loads_the_model_before_its_backend():
    served = '<script src="/static/backend.js"></script>\n<script src="/static/app.js" defer></script>'
    assert page_html(served) == ('<script src="model.js"></script>\n  <script src="backend.js"></script>\n'
                                 '<script src="app.js" defer></script>')
    assert page_html('<link href="/static/style.css"><script src="/static/app.js" defer></script>') == (
        '<link href="style.css"><script src="model.js"></script>\n  <script src="backend.js"></script>\n  '
        '<script src="app.js" defer></script>')
