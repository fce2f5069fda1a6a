"""``mnistflow.train(model=...)``: a name, a spec, a class, a factory or an instance, and how
the run records a user's model so that later verbs can rebuild it."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import mnistflow
from helpers import custom_models as cm
from mnistflow.artifacts.model_file import load_model
from mnistflow.core import log
from mnistflow.core.errors import MnistflowError
from mnistflow.training.user_model import build_user_model, cannot_rebuild, import_path, own_config
from mnistflow.training.config import TrainConfig

QUICK = dict(quiet=True, threads=1, tensorboard=False, keep_checkpoints=0, batch_size=50, max_steps=3,
             validate=False)
MOD = "helpers.custom_models"


@pytest.fixture
def cfg(synthetic_records) -> TrainConfig:
    return TrainConfig(data=str(synthetic_records), seed=3)


# --- what is recorded -------------------------------------------------------------------------

def test_a_class_records_its_import_path_kwargs_and_the_data_arguments(cfg):
    m, rec = build_user_model(cm.TinyNet, {"width": 4}, cfg)
    assert isinstance(m, cm.TinyNet) and m.conv.out_channels == 4
    # in_shape and num_classes come from the data when the class takes them
    assert rec["factory"] == f"{MOD}:TinyNet"
    assert rec["kwargs"] == {"width": 4, "in_shape": [1, 28, 28], "num_classes": 10}
    assert cannot_rebuild(rec, m) is None


def test_given_data_arguments_win(cfg):
    _, rec = build_user_model(cm.tiny_net, {"num_classes": 12}, cfg)
    assert rec == {"factory": f"{MOD}:tiny_net", "kwargs": {"num_classes": 12, "in_shape": [1, 28, 28]},
                   "unrecorded": []}


def test_a_factory_is_seeded_like_a_registered_model(cfg):
    a, _ = build_user_model(cm.TinyNet, None, cfg)
    torch.manual_seed(123)  # the global stream does not matter, and is not changed
    state = torch.random.get_rng_state()
    b, _ = build_user_model(cm.TinyNet, None, cfg)
    assert torch.equal(state, torch.random.get_rng_state())
    assert torch.equal(a.conv.weight, b.conv.weight)


@pytest.mark.parametrize("cls", [cm.ConfiguredNet, cm.KwargsNet])
def test_an_instance_records_its_own_arguments(cls, cfg):
    m = cls(width=5)
    assert own_config(m) == {"width": 5}
    got, rec = build_user_model(m, None, cfg)
    assert got is m and rec["factory"] == f"{MOD}:{cls.__name__}" and rec["kwargs"] == {"width": 5}
    assert cannot_rebuild(rec, m) is None


def test_why_a_model_cannot_be_rebuilt(cfg):
    # an instance whose arguments are not recorded: its default rebuild has other shapes
    _, rec = build_user_model(cm.TinyNet(width=4), None, cfg)
    why = cannot_rebuild(rec, cm.TinyNet(width=4))
    assert "different model" in why and "conv.weight" in why
    # a required argument that nothing records
    why = cannot_rebuild(build_user_model(cm.NeedsWidth(3), None, cfg)[1], cm.NeedsWidth(3))
    assert "NeedsWidth" in why and "width" in why

    class Local(nn.Module):  # defined inside a function
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(784, 10)

    assert "inside a function" in cannot_rebuild(build_user_model(Local, None, cfg)[1], Local())
    lam = lambda: nn.Linear(784, 10)  # noqa: E731
    assert "lambda" in cannot_rebuild(build_user_model(lam, None, cfg)[1], lam())
    Main = type("Main", (nn.Linear,), {"__module__": "__main__"})
    assert "__main__" in cannot_rebuild({"factory": import_path(Main), "kwargs": {}}, Main(1, 1))
    _, rec = build_user_model(cm.tiny_net, {"width": torch.tensor(4)}, cfg)  # not JSON
    assert rec["kwargs"] == {"in_shape": [1, 28, 28], "num_classes": 10}
    assert "width" in cannot_rebuild(rec, cm.tiny_net(4))


@pytest.mark.parametrize("model, kwargs, match", [
    (42, None, "registered name, a layer spec, a torch.nn.Module"),
    (cm.TinyNet, {"depth": 3}, "model_kwargs do not fit TinyNet"),
    (cm.TinyNet(), {"width": 3}, "model_kwargs are the arguments of a model class"),
    (lambda: "not a module", None, "returned a str, not a torch.nn.Module"),
    (cm.TinyNet, [("width", 3)], "model_kwargs must be a dict"),
])
def test_bad_model_arguments_are_one_clear_error(model, kwargs, match, cfg):
    with pytest.raises(MnistflowError, match=match):
        build_user_model(model, kwargs, cfg)


def test_model_kwargs_with_a_name_are_refused(synthetic_records):
    with pytest.raises(MnistflowError, match="--model-kwargs are the arguments of a model class or factory"):
        mnistflow.train("fast", synthetic_records, model_kwargs={"width": 3}, **QUICK)
    with pytest.raises(MnistflowError, match="loss must be a function"):
        mnistflow.train("fast", synthetic_records, loss="mse", **QUICK)


# --- training a user's model ------------------------------------------------------------------

def test_train_a_class_then_load_it_back(synthetic_records, tmp_path):
    s = mnistflow.train(cm.TinyNet, synthetic_records, model_kwargs={"width": 4}, run_dir=tmp_path / "run",
                        **QUICK)
    assert s["steps"] == 3 and s["model"] == f"{MOD}:TinyNet"
    model, info = load_model(tmp_path / "run")  # rebuilt from the recorded factory
    assert isinstance(model, cm.TinyNet) and model.conv.out_channels == 4
    assert info.factory == f"{MOD}:TinyNet" and info.factory_kwargs["width"] == 4


def test_train_an_instance_in_place_with_a_custom_loss(synthetic_records, tmp_path):
    m = cm.KwargsNet(width=4)
    before = m.fc.weight.detach().clone()
    calls = []

    def loss(logits, targets):
        calls.append(tuple(logits.shape))
        return nn.functional.cross_entropy(logits, targets)

    mnistflow.train(m, synthetic_records, loss=loss, run_dir=tmp_path / "run", **QUICK)
    assert calls and calls[0] == (50, 10)
    assert not torch.equal(before, m.fc.weight.detach().cpu())  # the instance itself was trained
    loaded, _ = load_model(tmp_path / "run")
    assert torch.equal(loaded.fc.weight, m.fc.weight.detach().cpu())


def test_an_unrebuildable_model_trains_with_one_warning(synthetic_records, tmp_path):
    class Local(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(784, 10)

        def forward(self, x):
            return self.fc(x.flatten(1))

    with log.quiet():
        s = mnistflow.train(Local, synthetic_records, run_dir=tmp_path / "run", **QUICK)
    assert s["steps"] == 3
    mine = [w for w in s["warnings"] if "cannot rebuild" in w]  # said once, recorded in the summary
    assert len(mine) == 1 and "model_kwargs" in mine[0] and "module level" in mine[0]


def test_a_model_that_cannot_take_the_input_is_one_clear_error(synthetic_records, tmp_path):
    with pytest.raises(MnistflowError) as e:
        mnistflow.train(cm.flat_only, synthetic_records, run_dir=tmp_path / "run", **QUICK)
    assert "1, 28, 28" in str(e.value)


def test_a_users_model_resumes_from_its_checkpoint(synthetic_records, tmp_path):
    q = {**QUICK, "keep_checkpoints": 2, "checkpoint_every": 2}
    first = mnistflow.train(cm.TinyNet, synthetic_records, run_dir=tmp_path / "run", **{**q, "max_steps": 4})
    s = mnistflow.train(cm.TinyNet, synthetic_records, run_dir=tmp_path / "run", resume=True,
                        **{**q, "max_steps": 6})
    assert s["resumed_from"] == first["checkpoint"] and s["steps"] == 6
    assert s["model"] == f"{MOD}:TinyNet"


def test_a_runs_config_file_replays_it(synthetic_records, tmp_path):
    """``train(config="RUN/config.toml")``: the settings of that run, changed by those given."""
    mnistflow.train("conv3x3x4-relu,maxpool4,fc10", synthetic_records, run_dir=tmp_path / "a", **QUICK)
    s = mnistflow.train(config=tmp_path / "a" / "config.toml", run_dir=tmp_path / "b", max_steps=2)
    assert s["model"] == "conv3x3x4-relu,maxpool4,fc10" and s["steps"] == 2
