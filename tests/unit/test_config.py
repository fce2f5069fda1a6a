"""TrainConfig: its layers (defaults < recipe < TOML file < flags), its checks, and config.toml."""
from __future__ import annotations

import dataclasses
import re

import pytest

import mnistflow.models  # noqa: F401  (resolve checks model names: torch is imported at collection)
from mnistflow.core.errors import MnistflowError
from mnistflow.training import config as configmod
from mnistflow.training.config import TrainConfig, load_toml, resolve, save_toml
from mnistflow.training.recipes import RECIPES, get_recipe


def test_layers_later_wins_and_none_means_not_given():
    cfg = resolve({"lr": 0.1, "epochs": 2, "model": "softmax"}, {"lr": 0.2, "seed": 5},
                  {"lr": 0.3, "epochs": None})
    assert (cfg.lr, cfg.epochs, cfg.seed, cfg.model) == (0.3, 2, 5, "softmax")
    assert cfg.batch_size == TrainConfig.batch_size  # untouched: the field's default


@pytest.mark.parametrize("layer", ["recipe", "file", "flags"])
def test_unknown_keys_are_errors_naming_their_layer(layer):
    with pytest.raises(MnistflowError, match="learning_rate") as e:
        resolve(**{layer: {"learning_rate": 0.1}})
    assert {"recipe": "recipe", "file": "config file", "flags": "flags"}[layer] in str(e.value)


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_resolves(name):
    cfg = resolve(get_recipe(name))
    for key, value in RECIPES[name].items():
        assert getattr(cfg, key) == value, key


def test_get_recipe_is_a_copy_and_unknown_names_list_the_known():
    get_recipe("fast")["epochs"] = 99
    assert RECIPES["fast"]["epochs"] == 0.45
    with pytest.raises(MnistflowError, match="unknown recipe 'nope'.*fast"):
        get_recipe("nope")


@pytest.mark.parametrize("settings, fragment", [
    ({"lr": 0}, "--lr must be in (0, 1000]"),
    ({"batch_size": "big"}, "--batch-size"),
    ({"batch_size": 0}, "--batch-size"),
    ({"target_split": "train"}, "--target-split"),
    ({"train_on": "train", "target_acc": 1.5}, "--target-acc"),
    ({"train_on": "train+val", "target_acc": 0.99}, "--target-split test"),
    ({"validate": False, "target_acc": 0.99}, "never evaluates: add --target-split test"),
    ({"tta": 3}, "--tta"),
    ({"resident": "maybe"}, "--resident"),
    ({"keep_checkpoints": -1}, "--keep-checkpoints must be an integer >= 0, got -1"),
    ({"optimizer": "momentum", "nesterov": True, "momentum": 0.0}, "--nesterov needs a --momentum above 0"),
    ({"gpu_memory_fraction": 1.5}, "--gpu-memory-fraction"),
    ({"optimizer": "nope"}, "--optimizer must be one of sgd, momentum, adadelta, adagrad, adam, adamw, "
                            "rmsprop, muon, got 'nope'"),
    ({"schedule": "nope"}, "--schedule must be one of constant, step, cosine, onecycle, linear"),
])
def test_impossible_settings_are_errors(settings, fragment):
    with pytest.raises(MnistflowError, match=re.escape(fragment)):
        resolve(flags=settings)


def test_a_model_the_registry_does_not_know_is_refused_before_any_work():
    from mnistflow.training.setup import check_run_inputs

    cfg = resolve(flags={"model": "nope"})  # the config is torch-free: the registry is checked by the run
    with pytest.raises(MnistflowError, match="unknown model 'nope'"):
        check_run_inputs(cfg)


def test_a_target_without_validation_passes_is_judged_where_the_run_evaluates():
    # on test (the final pass), or on val every --eval-every steps (which validate even with it off)
    assert resolve(flags={"validate": False, "target_acc": 0.99, "target_split": "test"}).target_split == "test"
    assert resolve(flags={"validate": False, "target_acc": 0.99, "eval_every": 5}).eval_every == 5


def test_config_toml_round_trip_leaves_out_resume_and_nones(tmp_path):
    cfg = resolve(get_recipe("fast"), flags={"seed": 7, "resume": "latest", "data": "somewhere"})
    save_toml(cfg, tmp_path / "config.toml")
    text = (tmp_path / "config.toml").read_text()
    assert "resume" not in text and "None" not in text and "null" not in text
    back = load_toml(tmp_path / "config.toml")
    assert resolve(file=back) == dataclasses.replace(cfg, resume=None)


def test_load_toml_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("lr = = 1\n")
    with pytest.raises(MnistflowError, match="not valid TOML") as e:
        load_toml(bad)
    assert "bad.toml" in str(e.value)
    with pytest.raises(MnistflowError, match="cannot read"):
        load_toml(tmp_path / "missing.toml")
    bad.write_text('learning_rate = 0.1\n')
    with pytest.raises(MnistflowError, match="learning_rate"):
        load_toml(bad)


def test_a_setting_must_name_a_known_help_group():
    with pytest.raises(ValueError, match="unknown help group 'misc'"):
        configmod.setting(0, "misc", "a setting in no section")
    f = configmod.setting(3, "logging", "some help", at_least=1)
    assert f.default == 3 and dict(f.metadata) == {"group": "logging", "help": "some help",
                                                   "rule": configmod.Rule(int, at_least=1), "parse": int,
                                                   "flag": {}, "optional": False}


def test_a_resolved_config_cannot_change():
    cfg = resolve(get_recipe("softmax"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.batch_size = 7
    assert dataclasses.replace(cfg, batch_size=7).batch_size == 7 and cfg.batch_size == 100
