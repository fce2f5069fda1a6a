"""``mnistflow train --target-acc T`` without a recipe: the cheapest recipe measured to reach
T on every seed on this dataset (``recipes.MEASURED``), said in one note; an error when none is."""
from __future__ import annotations

import pytest

from mnistflow.core.errors import MnistflowError
from mnistflow.training import recipes
from mnistflow.training.configure import configure

REAL = recipes.MEASURED  # the shipped tables (the fixture swaps in TABLE)
REAL_BF16, REAL_GPU = recipes.MEASURED_BF16, recipes.MEASURED_GPU
TABLE = {"mnist": {"fast": (0.9893, 0.9910, 0.9918, 1.0), "fast-plus": (0.9930, 0.9936, 0.9941, 3.0),
                   "seed-cnn": (0.9930, 0.9940, 0.9945, 40.0),
                   "mid": (0.9950, 0.9955, 0.9958, 20.0), "best": (0.9960, 0.9961, 0.9966, 50.0)}}


@pytest.fixture(autouse=True)
def _table(monkeypatch):
    monkeypatch.setattr(recipes, "MEASURED", TABLE)
    monkeypatch.setattr(recipes, "MEASURED_GPU", {})  # on a GPU machine too: TABLE
    monkeypatch.setattr(recipes, "MEASURED_BF16", {})  # and on a bf16 CPU


def test_a_run_on_a_bf16_cpu_picks_by_the_bf16_cpus_figures(monkeypatch, caplog):
    # On the Zen 4 (bf16) fast-plus's worst seed reached 99.36%; on the fp32 CPU (TABLE) 99.30%.
    from mnistflow.runtime import device

    monkeypatch.setattr(recipes, "MEASURED_BF16", {"mnist": {"fast": (0.9905, 0.9911, 0.9912, 1.4),
                                                             "fast-plus": (0.9936, 0.9937, 0.9937, 4.3),
                                                             "best": (0.9961, 0.9962, 0.9966, 55.0)}})
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: True)
    assert configure(target_acc=0.9935, dataset="mnist", device="cpu")[0].recipe == "fast-plus"
    assert f"4.3 s on {recipes.MEASURED_BF16_ON}" in caplog.text
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: False)  # fp32: TABLE's figures
    assert configure(target_acc=0.9935, dataset="mnist", device="cpu")[0].recipe == "mid"
    # a dataset the bf16 CPU has no figures for: the fp32 CPU's
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: True)
    monkeypatch.setattr(recipes, "MEASURED", {**TABLE, "fashion-mnist": {"mid": (0.92, 0.925, 0.93, 130.0)}})
    caplog.clear()
    assert configure(target_acc=0.92, dataset="fashion-mnist", device="cpu")[0].recipe == "mid"
    assert f"130 s on {recipes.MEASURED_ON}" in caplog.text


def test_a_run_on_a_gpu_picks_by_the_gpus_figures(monkeypatch, caplog):
    # The GPU's own seeds and numerics: there mid's worst seed reached 99.55%, on the CPU 99.50%.
    monkeypatch.setattr(recipes, "MEASURED_GPU", {"mnist": {"fast": (0.9903, 0.9903, 0.9905, 0.1),
                                                            "mid": (0.9956, 0.9960, 0.9961, 1.0),
                                                            "best": (0.9961, 0.9961, 0.9962, 2.6)}})
    assert configure(target_acc=0.9955, dataset="mnist", device="cuda")[0].recipe == "mid"
    assert f"1 s on {recipes.MEASURED_GPU_ON}" in caplog.text
    assert configure(target_acc=0.9955, dataset="mnist", device="cpu")[0].recipe == "best"
    # a dataset the GPU has no figures for: the CPU's
    assert configure(target_acc=0.9955, dataset="mnist", device="cuda:0")[0].recipe == "mid"
    monkeypatch.setattr(recipes, "MEASURED_GPU", {"fashion-mnist": {}})
    assert configure(target_acc=0.9955, dataset="mnist", device="cuda")[0].recipe == "best"


@pytest.mark.parametrize("target,recipe,split", [(0.98, "fast", "test"), (0.9893, "fast", "test"),
                                                 (0.9894, "fast-plus", "test"), (0.993, "fast-plus", "test"),
                                                 (0.9931, "mid", "test"), (0.995, "mid", "test"),
                                                 (0.9951, "best", "test")])
def test_the_cheapest_recipe_whose_every_seed_reaches_the_target(target, recipe, split, caplog):
    cfg = configure(target_acc=target, dataset="mnist")[0]
    assert (cfg.recipe, cfg.target_acc, cfg.target_split) == (recipe, target, split)
    assert cfg.model == recipes.RECIPES[recipe]["model"]
    # fast, fast-plus, mid and best have no validation pass: the final test pass judges the target
    assert f"recipe {recipe}, the cheapest measured to reach it on mnist" in caplog.text


def test_a_picked_recipe_with_a_validation_pass_judges_the_target_on_val(monkeypatch, caplog):
    # without fast-plus and mid in the table, seed-cnn (which validates every epoch) is the
    # cheapest at 99.3%
    monkeypatch.setattr(recipes, "MEASURED", {"mnist": {k: v for k, v in TABLE["mnist"].items()
                                                        if k not in ("fast-plus", "mid")}})
    cfg = configure(target_acc=0.993, dataset="mnist")[0]
    assert (cfg.recipe, cfg.target_split) == ("seed-cnn", "val")
    assert "recipe seed-cnn, the cheapest measured" in caplog.text


@pytest.mark.parametrize("given", [{"validate": False}, {"train_on": "train+val"}])
def test_a_picked_recipe_the_flags_keep_from_validating_judges_the_target_on_test(monkeypatch, given):
    # seed-cnn validates, the flags say it will not: the final test pass judges the target
    monkeypatch.setattr(recipes, "MEASURED", {"mnist": {k: v for k, v in TABLE["mnist"].items()
                                                        if k not in ("fast-plus", "mid")}})
    cfg = configure(target_acc=0.993, dataset="mnist", **given)[0]
    assert (cfg.recipe, cfg.target_split) == ("seed-cnn", "test")


def test_no_recipe_reaches_it_is_one_error_with_what_each_reaches():
    with pytest.raises(MnistflowError, match=r"no recipe reaches it on mnist .*best 99.60-99.66%"):
        configure(target_acc=0.999, dataset="mnist")[0]


def test_data_nobody_measured_is_an_error_asking_for_a_recipe(tmp_path):
    with pytest.raises(MnistflowError, match="no recipe is measured on kmnist.*--recipe"):
        configure(target_acc=0.9, dataset="kmnist")[0]
    with pytest.raises(MnistflowError, match="no recipe is measured on this data"):
        configure(target_acc=0.9, data=str(tmp_path))[0]


def test_a_recipe_or_a_model_given_is_kept_and_the_target_only_stops_it():
    cfg = configure(target_acc=0.995, dataset="mnist", recipe="seed-cnn")[0]
    assert (cfg.recipe, cfg.target_split) == ("seed-cnn", "val")
    cfg = configure(target_acc=0.995, dataset="mnist", model="mlp")[0]
    assert (cfg.recipe, cfg.model) == (None, "mlp")


def test_a_bad_target_is_the_usual_value_error():
    with pytest.raises(MnistflowError, match="target_acc|target-acc"):
        configure(target_acc=1.5, dataset="mnist")[0]


@pytest.mark.parametrize("table", [REAL, REAL_BF16, REAL_GPU])
def test_every_measured_entry_names_a_recipe_and_a_known_dataset(table):
    from mnistflow.data import known

    assert table and table is not TABLE
    for ds, by_recipe in table.items():
        assert known.lookup(ds) is not None and set(by_recipe) <= set(recipes.RECIPES)
        for lo, med, hi, secs in by_recipe.values():
            assert 0 < lo <= med <= hi <= 1 and secs > 0


def test_on_fashion_mnist_the_shipped_figures_pick_mid_with_its_clothing_settings(monkeypatch, caplog):
    # mid (fast-deep, no augmentation on clothing) beats seed-cnn's accuracy in less time
    monkeypatch.setattr(recipes, "MEASURED", REAL)
    cfg = configure(target_acc=0.92, dataset="fashion-mnist")[0]
    assert (cfg.recipe, cfg.model, cfg.augment, cfg.epochs) == ("mid", "fast-deep", "off", 3)
    assert "recipe mid, the cheapest measured to reach it on fashion-mnist" in caplog.text
    assert configure(target_acc=0.93, dataset="fashion-mnist")[0].recipe == "best"
    assert configure(target_acc=0.90, dataset="fashion-mnist")[0].recipe == "fast-plus"


def test_on_a_bf16_cpu_fashion_mnist_picks_by_that_cpus_own_fashion_figures(monkeypatch, caplog):
    # The shipped bf16 table measured Fashion-MNIST too: there mid takes 63.9 s, not the fp32 CPU's 134
    from mnistflow.runtime import device

    monkeypatch.setattr(recipes, "MEASURED", REAL)
    monkeypatch.setattr(recipes, "MEASURED_BF16", REAL_BF16)
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: True)
    assert configure(target_acc=0.92, dataset="fashion-mnist", device="cpu")[0].recipe == "mid"
    lo, _, _, secs = REAL_BF16["fashion-mnist"]["mid"]
    assert f"{secs:.3g} s on {recipes.MEASURED_BF16_ON}" in caplog.text
    assert configure(target_acc=lo + 1e-4, dataset="fashion-mnist", device="cpu")[0].recipe == "best"
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: False)
    caplog.clear()
    assert configure(target_acc=0.92, dataset="fashion-mnist", device="cpu")[0].recipe == "mid"
    assert f"on {recipes.MEASURED_ON}" in caplog.text
