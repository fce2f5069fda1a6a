"""Recipes that know their data (``recipes.FOR_DATA``): on clothing ``best`` and ``mid`` take the
deeper net and ``mid`` and ``fast-plus`` drop the augmentation, only where nothing the user gave
says otherwise (a flag, a config file)."""
from __future__ import annotations

from pathlib import Path

import pytest

from mnistflow.data.formats.raw import RawDataset, RawSplit
from mnistflow.data.open import policy_of
from mnistflow.data.write_records import write_records
from mnistflow.training.recipes import FOR_DATA, RECIPES, for_data
from mnistflow.training.configure import configure
from tests.helpers.synthetic import digits


def _records(out: Path, name: str) -> Path:
    """A small record set whose meta names the dataset ``name`` (synthetic images)."""
    xtr, ytr = digits(300, seed=0)
    xte, yte = digits(100, seed=1)
    raw = RawDataset(name, [str(k) for k in range(10)], RawSplit(xtr, ytr), RawSplit(xte, yte))
    return write_records(raw, out, key=name, options={}, source_checksums={}, val_size=50)


@pytest.mark.parametrize("dataset,model", [("fashion-mnist", "fast-deep"), ("mnist", "fast-wide"),
                                           ("kmnist", "fast-wide"), ("emnist-letters", "fast-wide")])
def test_best_takes_the_deeper_net_for_clothing_only(dataset, model):
    assert configure(recipe="best", dataset=dataset)[0].model == model
    assert configure(recipe="best", data=dataset)[0].model == model  # a bare known name as --data


@pytest.mark.parametrize("dataset,augment,tta", [("fashion-mnist", "off", 0), ("mnist", "auto", 4)])
def test_fast_plus_drops_augmentation_and_views_for_clothing_only(dataset, augment, tta):
    cfg = configure(recipe="fast-plus", dataset=dataset)[0]
    assert (cfg.augment, cfg.tta) == (augment, tta)
    assert configure(recipe="fast-plus", dataset=dataset, tta=2)[0].tta == 2  # a flag keeps its own


@pytest.mark.parametrize("dataset,model,augment", [("fashion-mnist", "fast-deep", "off"), ("mnist", "fast-wide", "auto")])
def test_mid_takes_bests_net_without_augmentation_for_clothing_only(dataset, model, augment):
    cfg = configure(recipe="mid", dataset=dataset)[0]
    assert (cfg.model, cfg.augment, cfg.epochs, cfg.tta) == (model, augment, 3, 4)
    assert configure(recipe="mid", dataset=dataset, augment="clothing")[0].augment == "clothing"


def test_a_flag_or_a_config_file_keeps_its_own_value(tmp_path):
    # the flag equals the recipe's own base value: still the user's choice, not the recipe's
    assert configure(recipe="best", dataset="fashion-mnist", model="fast-wide")[0].model == "fast-wide"
    toml = tmp_path / "c.toml"
    toml.write_text('model = "fast"\n')
    assert configure(toml, recipe="best", dataset="fashion-mnist")[0].model == "fast"


def test_records_and_raw_folders_are_told_by_their_names(tmp_path, monkeypatch):
    assert policy_of(None, _records(tmp_path / "any-name", "fashion-mnist")) == "clothing"
    assert policy_of(None, _records(tmp_path / "fashion-mnist-copy", "mine")) is None
    raw = tmp_path / "fashion-mnist"
    raw.mkdir()
    assert policy_of(None, raw) == "clothing"  # an IDX folder's records take the folder's name
    assert policy_of(None, tmp_path / "missing") is None  # the run itself reports a bad input
    monkeypatch.delenv("MNISTFLOW_DATA")
    assert policy_of(None, None) == "glyphs"  # no input: MNIST


def test_only_existing_settings_and_known_policies():
    from dataclasses import fields

    from mnistflow.data.augment import POLICIES
    from mnistflow.training.config import TrainConfig

    names = {f.name for f in fields(TrainConfig)}
    for recipe, kinds in FOR_DATA.items():
        assert recipe in RECIPES and set(kinds) <= set(POLICIES)
        for kind in kinds:
            assert set(for_data(recipe, kind)) <= names


@pytest.mark.parametrize("recipe,augment", [("best", "clothing"), ("mid", "off")])
def test_a_run_and_its_resume_train_the_recipes_model(tmp_path, recipe, augment):
    """The records decide it at every start: a resumed run rebuilds the model it saved."""
    from mnistflow.training.config import load_toml
    from mnistflow.training.api import train

    rec = _records(tmp_path / "fm", "fashion-mnist")
    run = tmp_path / "run"
    common = dict(recipe=recipe, data=str(rec), quiet=True, threads=1, tensorboard=False, tta=2,
                  batch_size=50, eval_batch_size=100)
    first = train(run_dir=str(run), max_steps=1, checkpoint_every=1, **common)
    assert first["model"] == "fast-deep" and first["tta_mirror"]  # clothing: the mirror is a view
    assert load_toml(run / "config.toml")["augment"] == augment
    again = train(run_dir=str(run), resume=True, max_steps=2, **common)
    assert again["model"] == "fast-deep" and again["steps"] == 2 and again["resumed_from"]
    assert load_toml(run / "config.toml")["augment"] == augment


def test_eval_of_a_clothing_model_mirrors_and_says_so(tmp_path):
    from mnistflow.inference import evaluate, format_eval
    from mnistflow.training.api import train

    rec = _records(tmp_path / "fm", "fashion-mnist")
    train(recipe="fast", data=str(rec), run_dir=str(tmp_path / "r"), quiet=True, threads=1,
          tensorboard=False, max_steps=1, batch_size=50)
    res = evaluate(tmp_path / "r", data=str(rec), tta=4)
    assert res["tta_mirror"] and "the image, its mirror and 3 shifts" in format_eval(res)
    assert not evaluate(tmp_path / "r", data=str(rec))["tta_mirror"]
