"""model.safetensors, the one strict weight loader, and rebuilding a user's model from its
recorded factory (never from code inside the run directory)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn as nn
from safetensors.torch import save_file

from mnistflow.artifacts.load import load_any
from mnistflow.artifacts.model_file import build_model, load_model, load_weights, save_model
from mnistflow.artifacts.model_info import ModelInfo
from mnistflow.artifacts.npz import NPZ_META_KEY, load_npz_into, read_npz, write_npz
from mnistflow.artifacts.rundir import RunDir
from mnistflow.core.errors import MnistflowError
from mnistflow.models import create_model

NAMES = [str(i) for i in range(10)]


def _info(model: str = "mlp", **kw) -> ModelInfo:
    return ModelInfo(model, [1, 28, 28], NAMES, [33.0], [78.0], dataset="synthetic", **kw)


def _same(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_strict_loader_names_missing_unexpected_and_mismatched():
    model = create_model("mlp")
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    target = create_model("mlp")
    assert load_weights(target, sd) is target and _same(target, model)
    bad = dict(sd)
    bad.pop("fc1.bias")
    bad["extra.weight"] = torch.zeros(1)
    bad["fc3.weight"] = torch.zeros(3, 3)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(MnistflowError) as e:
        load_weights(create_model("mlp"), bad, "w.safetensors", what="mlp")
    msg = str(e.value)
    assert msg.startswith("w.safetensors: weights do not fit model 'mlp'")
    for fragment in ("missing: fc1.bias", "unexpected: extra.weight",
                     "shape mismatch: fc3.weight (file 3x3, model 10x"):
        assert fragment in msg, msg
    with pytest.raises(MnistflowError):
        load_weights(target, bad)
    assert all(torch.equal(target.state_dict()[k], v) for k, v in before.items())  # nothing loaded


def test_the_strict_loader_sees_through_ddp_and_compile_wrappers():
    class DDPLike(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.module = m

    class CompiledLike(nn.Module):  # what torch.compile wraps a module in (without compiling)
        def __init__(self, m):
            super().__init__()
            self._orig_mod = m

    src, dst = create_model("mlp"), create_model("mlp")
    wrapped = DDPLike(CompiledLike(dst))
    assert next(iter(wrapped.state_dict())).startswith("module._orig_mod.")
    load_weights(wrapped, src.state_dict())
    assert _same(src, dst)


def test_model_file_round_trip_and_old_files_without_factory(tmp_path):
    model = create_model("mlp")
    path = save_model(RunDir(tmp_path).model, model, _info())
    back, info = load_model(tmp_path)
    assert _same(back, model) and not back.training and info.factory == "" and info.factory_kwargs == {}
    old = {k: v for k, v in json.loads(json.dumps(info.__dict__)).items()
           if k not in ("factory", "factory_kwargs")}
    old["from_the_future"] = 1  # unknown keys are ignored
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path),
              metadata={"mnistflow": json.dumps(old)})
    back, info = load_model(path)
    assert _same(back, model) and info.model == "mlp"
    save_model(path, create_model("mlp", (1, 28, 28), 5), _info())
    with pytest.raises(MnistflowError, match="shape mismatch: fc3.weight"):
        load_model(path)


def test_a_users_model_is_rebuilt_from_its_factory(tmp_path):
    from helpers.custom_models import TinyNet, tiny_net

    model = tiny_net(width=4)
    info = _info("tiny-net", factory="helpers.custom_models:tiny_net", factory_kwargs={"width": 4})
    save_model(RunDir(tmp_path).model, model, info)
    back, got = load_any(tmp_path)
    assert isinstance(back, TinyNet) and _same(back, model) and got.factory_kwargs == {"width": 4}
    cls = _info("TinyNet", factory="helpers.custom_models:TinyNet", factory_kwargs={"width": 6})
    assert build_model(cls).conv.out_channels == 6
    for factory, fragment in (("helpers.custom_models:nothing_here", "has no 'nothing_here'"),
                              ("no_such_module_xyz:f", "is not importable"),
                              ("not a path", "is not of the form"),
                              ("helpers.custom_models:NeedsWidth", "failed (TypeError")):
        with pytest.raises(MnistflowError, match=fragment.replace("(", r"\(")):
            build_model(_info("x", factory=factory))


def test_code_inside_the_run_directory_is_never_imported(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    marker = tmp_path / "executed"
    (run / "planted_factory.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "import torch.nn as nn\n\ndef make():\n    return nn.Linear(784, 10)\n")
    monkeypatch.syspath_prepend(str(run))  # even when it is importable
    info = _info("planted", factory="planted_factory:make")
    save_model(RunDir(run).model, nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), info)
    with pytest.raises(MnistflowError, match="refused: the model factory 'planted_factory:make'"):
        load_any(run)
    (run / "checkpoints").mkdir()
    with pytest.raises(MnistflowError, match="refused"):
        build_model(info, run / "checkpoints" / "step-000001.pt")  # a checkpoint's run, too
    assert not marker.exists()


def test_npz_round_trip_partial_restore_and_strict_whole_model_load(tmp_path, synthetic_records):
    model = create_model("mlp")
    arrays = {k: v.numpy() for k, v in model.state_dict().items()}
    write_npz(tmp_path / "m.npz", arrays, _info())
    with np.load(tmp_path / "m.npz", allow_pickle=False) as z:
        assert set(z.files) == set(arrays) | {NPZ_META_KEY}
    back, info = load_any(tmp_path / "m.npz")
    assert _same(back, model) and info.model == "mlp"
    fresh = create_model("mlp")
    rep = load_npz_into(fresh, tmp_path / "m.npz", only="fc1.*")
    assert rep.loaded == ["fc1.weight", "fc1.bias"] and rep.complete and len(rep.skipped) == 4
    assert torch.equal(fresh.fc1.weight, model.fc1.weight) and not torch.equal(fresh.fc2.weight, model.fc2.weight)
    rep = load_npz_into(create_model("mlp", (1, 28, 28), 5), tmp_path / "m.npz")
    assert [n for n, _, _ in rep.mismatched] == ["fc3.weight", "fc3.bias"] and "missing in file" not in rep.format()
    write_npz(tmp_path / "sub.npz", {k: a for k, a in arrays.items() if k != "fc2.bias"}, _info())
    with pytest.raises(MnistflowError, match="missing: fc2.bias"):
        load_any(tmp_path / "sub.npz")
    np.savez(tmp_path / "bare.npz", **arrays)
    assert read_npz(tmp_path / "bare.npz")[1] is None
    with pytest.raises(MnistflowError, match="pass the model name"):
        load_any(tmp_path / "bare.npz")
    back, info = load_any(tmp_path / "bare.npz", "mlp", data=synthetic_records)
    assert _same(back, model) and info.dataset == "synthetic" and info.num_classes == 10


# --- values: real and finite -----------------------------------------------------------------

def _softmax_file(path, change=None) -> str:
    """A softmax model.safetensors whose ``fc1.weight`` went through ``change``."""
    sd = {k: v.clone() for k, v in create_model("softmax").state_dict().items()}
    if change is not None:
        sd["fc1.weight"] = change(sd["fc1.weight"])
    save_file(sd, str(path), metadata={"mnistflow": _info("softmax").to_json()})
    return str(path)


def _nan(t):
    t[0, 0] = float("nan")
    return t


def _inf(t):
    t[3, 5] = float("-inf")
    t[4, 5] = float("inf")
    return t


NAN_TAIL = "(NaN or infinity); refusing weights that would make every prediction NaN"


@pytest.mark.parametrize("change, fragment", [
    (_nan, f"tensor 'fc1.weight' holds 1 non-finite value(s) {NAN_TAIL}"),
    (_inf, f"tensor 'fc1.weight' holds 2 non-finite value(s) {NAN_TAIL}"),
    (lambda t: t.to(torch.complex64),
     "tensor 'fc1.weight' holds complex64 values; weights must be real numbers (bool, int or float)"),
])
def test_the_strict_loader_refuses_non_finite_and_non_real_weights(tmp_path, change, fragment):
    import warnings

    path = _softmax_file(tmp_path / "m.safetensors", change)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no raw UserWarning line (e.g. "Casting complex values")
        for load in (load_model, load_any):
            with pytest.raises(MnistflowError) as e:
                load(path)
            assert str(e.value) == f"{path}: {fragment}"
    model = create_model("softmax")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    bad = {k: v.clone() for k, v in before.items()}
    bad["fc1.weight"] = change(bad["fc1.weight"])
    with pytest.raises(MnistflowError, match="fc1.weight"):
        load_weights(model, bad, "ckpt")  # a checkpoint's weights: the same loader
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())  # nothing loaded


def test_a_partial_npz_restore_refuses_non_finite_values(tmp_path):
    model = create_model("softmax")
    arrays = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    arrays["fc1.bias"][2] = np.nan
    write_npz(tmp_path / "w.npz", arrays, _info("softmax"))
    with pytest.raises(MnistflowError, match=r"tensor 'fc1.bias' holds 1 non-finite value"):
        load_npz_into(create_model("softmax"), tmp_path / "w.npz")
    with pytest.raises(MnistflowError, match=r"tensor 'fc1.bias' holds 1 non-finite value"):
        load_any(tmp_path / "w.npz")


def test_finite_weights_of_every_real_dtype_still_load():
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))  # float weights, int64 counter
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    assert load_weights(model, sd) is model
    assert load_weights(model, {k: v.to(torch.float16) if v.is_floating_point() else v
                                for k, v in sd.items()}) is model
