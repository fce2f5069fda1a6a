"""``mnistflow train --target-acc T`` without a recipe: the cheapest recipe measured to reach
T on every seed on this dataset (``recipes.measured()``, the shipped results file), said in one
note; an error when none is."""
from __future__ import annotations

import re

import pytest

from mnistflow.core.errors import MnistflowError
from mnistflow.training import recipes
from mnistflow.training.configure import configure

REAL = recipes.measured()  # the shipped results file (the fixture swaps in TABLE's)
TABLE = {"mnist": {"fast": (0.9893, 0.9910, 0.9918, 1.0), "fast-plus": (0.9930, 0.9936, 0.9941, 3.0),
                   "seed-cnn": (0.9930, 0.9940, 0.9945, 40.0),
                   "mid": (0.9950, 0.9955, 0.9958, 20.0), "best": (0.9960, 0.9961, 0.9966, 50.0)}}
ON = {"cpu": "test CPU, fp32, 2026-01-01", "cpu-bf16": "bf16 test CPU, bf16, 2026-01-02",
      "gpu": "test GPU, bf16, 2026-01-03"}


def results(cpu: dict, bf16: dict | None = None, gpu: dict | None = None) -> dict:
    """A results file holding, per kind of machine, {dataset: {recipe: (lowest, median, highest
    test accuracy, seconds)}}: three seeds at those accuracies, each taking those seconds."""
    def kind(name: str, tables: dict) -> dict:
        machine, precision, date = ON[name].split(", ")
        return {"precision": precision, "datasets": {ds: {"recipes": {
            r: {"machine": machine, "torch": "2.13.0+cpu", "commit": "0" * 40, "date": date, "seeds": [0, 1, 2],
                "test_acc": [med, lo, hi], "wall_s": [secs] * 3}
            for r, (lo, med, hi, secs) in by.items()}} for ds, by in tables.items()}}

    return {"version": 1, "machines": {"cpu": kind("cpu", cpu), "cpu-bf16": kind("cpu-bf16", bf16 or {}),
                                       "gpu": kind("gpu", gpu or {})}}


def use(monkeypatch, data: dict) -> None:
    monkeypatch.setattr(recipes, "measured", lambda: data)


@pytest.fixture(autouse=True)
def _table(monkeypatch):
    use(monkeypatch, results(TABLE))  # on a GPU machine and a bf16 CPU too: TABLE, the fp32 CPU's


def test_a_run_on_a_bf16_cpu_picks_by_the_bf16_cpus_figures(monkeypatch, caplog):
    # On the Zen 4 (bf16) fast-plus's worst seed reached 99.36%; on the fp32 CPU (TABLE) 99.30%.
    from mnistflow.runtime import device

    bf16 = {"mnist": {"fast": (0.9905, 0.9911, 0.9912, 1.4), "fast-plus": (0.9936, 0.9937, 0.9937, 4.3),
                      "best": (0.9961, 0.9962, 0.9966, 55.0)}}
    use(monkeypatch, results(TABLE, bf16))
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: True)
    assert configure(target_acc=0.9935, dataset="mnist", device="cpu")[0].recipe == "fast-plus"
    assert f"4.3 s on {ON['cpu-bf16']}" in caplog.text
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: False)  # fp32: TABLE's figures
    assert configure(target_acc=0.9935, dataset="mnist", device="cpu")[0].recipe == "mid"
    # a dataset the bf16 CPU has no figures for: the fp32 CPU's
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: True)
    use(monkeypatch, results({**TABLE, "fashion-mnist": {"mid": (0.92, 0.925, 0.93, 130.0)}}, bf16))
    caplog.clear()
    assert configure(target_acc=0.92, dataset="fashion-mnist", device="cpu")[0].recipe == "mid"
    assert f"130 s on {ON['cpu']}" in caplog.text


def test_a_run_on_a_gpu_picks_by_the_gpus_figures(monkeypatch, caplog):
    # The GPU's own seeds and numerics: there mid's worst seed reached 99.55%, on the CPU 99.50%.
    use(monkeypatch, results(TABLE, gpu={"mnist": {"fast": (0.9903, 0.9903, 0.9905, 0.1),
                                                   "mid": (0.9956, 0.9960, 0.9961, 1.0),
                                                   "best": (0.9961, 0.9961, 0.9962, 2.6)}}))
    assert configure(target_acc=0.9955, dataset="mnist", device="cuda")[0].recipe == "mid"
    assert f"1 s on {ON['gpu']}" in caplog.text
    assert configure(target_acc=0.9955, dataset="mnist", device="cpu")[0].recipe == "best"
    # a dataset the GPU has no figures for: the CPU's
    assert configure(target_acc=0.9955, dataset="mnist", device="cuda:0")[0].recipe == "mid"
    use(monkeypatch, results(TABLE, gpu={"fashion-mnist": {"mid": (0.9956, 0.9960, 0.9961, 1.0)}}))
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
    use(monkeypatch, results({"mnist": {k: v for k, v in TABLE["mnist"].items() if k not in ("fast-plus", "mid")}}))
    cfg = configure(target_acc=0.993, dataset="mnist")[0]
    assert (cfg.recipe, cfg.target_split) == ("seed-cnn", "val")
    assert "recipe seed-cnn, the cheapest measured" in caplog.text


@pytest.mark.parametrize("given", [{"validate": False}, {"train_on": "train+val"}])
def test_a_picked_recipe_the_flags_keep_from_validating_judges_the_target_on_test(monkeypatch, given):
    # seed-cnn validates, the flags say it will not: the final test pass judges the target
    use(monkeypatch, results({"mnist": {k: v for k, v in TABLE["mnist"].items() if k not in ("fast-plus", "mid")}}))
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


def test_the_shipped_results_file_names_known_recipes_datasets_and_machines():
    from mnistflow.data import known

    assert REAL["version"] == 1 and set(REAL["machines"]) == set(recipes.MACHINES)
    for kind in REAL["machines"].values():
        assert kind["precision"] in ("fp32", "bf16") and kind["datasets"]
        for ds, entry in kind["datasets"].items():
            assert known.lookup(ds) is not None and set(entry["recipes"]) <= set(recipes.RECIPES)
            for run in [*entry["recipes"].values(), *entry.get("baselines", {}).values()]:
                assert re.fullmatch(r"[0-9a-f]{40}", run["commit"]) and re.fullmatch(r"\d{4}-\d\d-\d\d", run["date"])
                assert run["machine"] and run["torch"]
            for run in entry["recipes"].values():
                assert len(run["seeds"]) == len(run["test_acc"]) >= 3
                assert all(0 < a <= 1 for a in run["test_acc"])
                # every seed's seconds, or (recorded before the file) the median alone
                assert (len(run["wall_s"]) == len(run["seeds"]) and all(s > 0 for s in run["wall_s"])
                        if run["wall_s"] is not None else run["median_wall_s"] > 0)


def test_on_fashion_mnist_the_shipped_figures_pick_mid_with_its_clothing_settings(monkeypatch, caplog):
    # mid (fast-deep, no augmentation on clothing) beats seed-cnn's accuracy in less time
    use(monkeypatch, REAL)
    cfg = configure(target_acc=0.92, dataset="fashion-mnist")[0]
    assert (cfg.recipe, cfg.model, cfg.augment, cfg.epochs) == ("mid", "fast-deep", "off", 3)
    assert "recipe mid, the cheapest measured to reach it on fashion-mnist" in caplog.text
    assert configure(target_acc=0.93, dataset="fashion-mnist")[0].recipe == "best"
    assert configure(target_acc=0.90, dataset="fashion-mnist")[0].recipe == "fast-plus"


def test_on_a_bf16_cpu_fashion_mnist_picks_by_that_cpus_own_fashion_figures(monkeypatch, caplog):
    # The shipped file measured Fashion-MNIST on the bf16 CPU too: there mid takes its own time
    from mnistflow.runtime import device

    use(monkeypatch, REAL)
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: True)
    assert configure(target_acc=0.92, dataset="fashion-mnist", device="cpu")[0].recipe == "mid"
    lo, _, _, secs = recipes.summary("cpu-bf16", "fashion-mnist")["mid"]
    assert secs != recipes.summary("cpu", "fashion-mnist")["mid"][3]
    assert f"{secs:.3g} s on {recipes.measured_on('cpu-bf16', 'fashion-mnist', 'mid')}" in caplog.text
    assert configure(target_acc=lo + 1e-4, dataset="fashion-mnist", device="cpu")[0].recipe == "best"
    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: False)
    caplog.clear()
    assert configure(target_acc=0.92, dataset="fashion-mnist", device="cpu")[0].recipe == "mid"
    assert f"on {recipes.measured_on('cpu', 'fashion-mnist', 'mid')}" in caplog.text


def test_the_summary_is_each_recipes_lowest_median_and_highest_seed_and_median_seconds(monkeypatch):
    run = {"seeds": [0, 1, 2], "test_acc": [0.9907, 0.9903, 0.9912], "wall_s": [2.17, 2.15, 2.3]}
    data = {"version": 1, "machines": {"cpu": {"precision": "fp32", "datasets": {"mnist": {"recipes": {
        "fast": run, "best": {"seeds": [0, 1, 2], "test_acc": [0.996, 0.995, 0.997], "wall_s": None,
                              "median_wall_s": 170.0}}}}}}}
    use(monkeypatch, data)
    assert recipes.summary("cpu", "mnist") == {"fast": (0.9903, 0.9907, 0.9912, 2.17),
                                               "best": (0.995, 0.996, 0.997, 170.0)}
    assert recipes.summary("gpu", "mnist") == {} and recipes.summary("cpu", "kmnist") == {}
