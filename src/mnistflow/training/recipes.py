"""Recipes: named bundles of model + optimizer + schedule + epochs + batch.

A recipe holds no dataset's constants: channels, size, classes and normalization come from the
records, ``augment="auto"`` takes the dataset's own augmentation policy, and what a recipe
changes for a kind of data is declared in ``FOR_DATA``. Any flag overrides a recipe value;
``mnistflow train --recipe NAME --help`` shows a recipe's values as the defaults. Every key is a
``TrainConfig`` field (checked when resolved).

What each recipe reaches, on each kind of machine, is in ``measured.json`` beside this file
(written by benchmarks/frontier.py and benchmarks/family.py); ``--target-acc`` without a recipe
picks from it. How each recipe was chosen is in BENCHMARKS.md.
"""
from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path

from mnistflow.core.errors import MnistflowError

# The wide fast net with the dataset's augmentation, Muon, all 60,000 labelled images and 8
# extra test views (one-pixel shifts).
_BEST = dict(model="fast-wide", optimizer="muon", muon_lr=0.1, muon_momentum=0.8, nesterov=True,
             lr=0.5, weight_decay=5e-4, batch_size=256, epochs=7, schedule="onecycle", warmup=0.2,
             label_smoothing=0.1, augment="auto", channels_last=True, drop_last=True,
             log_every=50, eval_batch_size=1000, train_on="train+val", tta=8, validate=False,
             cuda_graphs="auto")

# The fast net (models/fast.py): first convolution whitened, hidden convolutions trained by Muon,
# the rest by Nesterov SGD, no augmentation. No validation pass: the final test pass is the figure.
_FAST = dict(model="fast", optimizer="muon", muon_lr=0.13, muon_momentum=0.8, nesterov=True,
             lr=1.3, momentum=0.9, weight_decay=5e-4, batch_size=384, epochs=0.45,
             schedule="onecycle", warmup=0.3, label_smoothing=0.1, channels_last=True,
             drop_last=True, log_every=50, eval_batch_size=2000, validate=False, whiten=True,
             augment="off", cuda_graphs="auto")  # a GPU replays the step as one CUDA graph

RECIPES: dict[str, dict] = {
    # The tutorial's softmax regression (~92%): SGD, batch 100, a linearly decaying rate.
    "softmax": dict(model="softmax", optimizer="sgd", lr=0.3, batch_size=100, epochs=1,
                    schedule="linear", precision="fp32", log_every=100),
    # The tutorial's deep CNN (~99.2% in the tutorial) in a few epochs: Adam, one-cycle.
    "seed-cnn": dict(model="seed-cnn", optimizer="adam", lr=2e-3, batch_size=128, epochs=4,
                     schedule="onecycle", warmup=0.15, channels_last=True, log_every=100, augment="off"),
    # Time to accuracy: 99.0% on MNIST on every seed in the least time.
    "fast": dict(_FAST),
    # 99.3% on MNIST cheaply: fast for one epoch on train + val, augmented, 4 extra test views.
    "fast-plus": {**_FAST, "epochs": 1, "augment": "auto", "tta": 4, "train_on": "train+val"},
    # 99.5% on MNIST at a fraction of best's time: best for 3 epochs, 4 extra test views.
    "mid": {**_BEST, "epochs": 3, "tta": 4},
    # The most accurate.
    "best": dict(_BEST),
}

# What a recipe changes for a kind of data, keyed by the dataset's augmentation policy
# (``data.datasets``). Applied when the records are open, to each value the run still has from
# the recipe: a flag or a config file that set it keeps its own. Chosen on Fashion-MNIST's
# validation split (BENCHMARKS.md, "How the recipes were chosen").
FOR_DATA: dict[str, dict[str, dict]] = {
    # Clothing needs depth: a second convolution per stage, and more epochs.
    "best": {"clothing": dict(model="fast-deep", epochs=10)},
    # In one epoch the clothing augmentation and the test views (mirror + shifts) both cost.
    "fast-plus": {"clothing": dict(augment="off", tta=0)},
    # best's deeper net for mid's 3 epochs; the augmentation costs a short run.
    "mid": {"clothing": dict(model="fast-deep", augment="off")},
}

MACHINES = ("cpu", "cpu-bf16", "gpu")  # the kinds of machine measured.json has figures for
MEASURED_FILE = Path(__file__).with_name("measured.json")


@functools.cache
def measured() -> dict:
    """The results file: ``{"version": 1, "machines": {kind: {"precision", "datasets": {name:
    {"recipes": {recipe: run}, "baselines": {...}}}}}}``, where a run is ``{"machine", "torch",
    "commit", "date", "seeds", "test_acc", "wall_s"}`` (one entry per seed; ``wall_s`` is null
    and ``median_wall_s`` given where only the median time was recorded)."""
    return json.loads(MEASURED_FILE.read_text())


def median_wall_s(run: dict) -> float:
    """A measured run's median wall seconds over its seeds."""
    return statistics.median(run["wall_s"]) if run["wall_s"] else run["median_wall_s"]


def summary(machine: str, dataset: str) -> dict[str, tuple[float, float, float, float]]:
    """{recipe: (lowest, median, highest test accuracy over the seeds, median wall s)} measured on
    ``dataset`` on that kind of machine ({} when there are none)."""
    runs = measured()["machines"].get(machine, {}).get("datasets", {}).get(dataset, {}).get("recipes", {})
    return {name: (min(r["test_acc"]), statistics.median(r["test_acc"]), max(r["test_acc"]), median_wall_s(r))
            for name, r in runs.items()}


def measured_on(machine: str, dataset: str, recipe: str) -> str:
    """Where a recipe's figures were measured, in a few words: machine, precision, date."""
    kind = measured()["machines"][machine]
    run = kind["datasets"][dataset]["recipes"][recipe]
    return f"{run['machine']}, {kind['precision']}, {run['date']}"


def pick_for_target(target: float, dataset: str | None, machine: str = "cpu") -> tuple[str, str]:
    """(recipe, why): the cheapest recipe whose every measured seed reached ``target`` on
    ``dataset`` (as benchmarks/frontier.py draws the curve), by the figures of the machine the
    run is on where there are some for this dataset (``machine``: "gpu", "cpu-bf16" for a CPU
    that trains in bf16, "cpu"), else the fp32 CPU's. An error when the dataset is not measured or
    no recipe reaches it."""
    if not summary(machine, dataset or ""):
        machine = "cpu"
    figures = summary(machine, dataset or "")
    if not figures:
        known = ", ".join(measured()["machines"]["cpu"]["datasets"])
        raise MnistflowError(f"--target-acc without --recipe: no recipe is measured on "
                             f"{dataset or 'this data'} (measured: {known}); name one with --recipe")
    able = sorted((secs, name) for name, (lo, _, _, secs) in figures.items() if lo >= target)
    ranges = "; ".join(f"{n} {100 * lo:.2f}-{100 * hi:.2f}%" for n, (lo, _, hi, _) in figures.items())
    if not able:
        raise MnistflowError(f"--target-acc {target}: no recipe reaches it on {dataset} (every seed's test "
                             f"accuracy: {ranges}); lower it, or name a recipe with --recipe and train longer")
    secs, name = able[0]
    lo, med, hi, _ = figures[name]
    return name, (f"--target-acc {target}: recipe {name}, the cheapest measured to reach it on {dataset} "
                  f"(every seed: test {100 * lo:.2f}-{100 * hi:.2f}%, median {100 * med:.2f}%, {secs:.3g} s on "
                  f"{measured_on(machine, dataset, name)}; all: {ranges})")


def for_data(recipe: str | None, policy: str) -> dict:
    """The settings recipe ``recipe`` changes for data whose augmentation policy is ``policy``."""
    return dict(FOR_DATA.get(recipe or "", {}).get(policy, {}))


def get_recipe(name: str) -> dict:
    """A copy of recipe ``name``'s settings; an unknown name is an error listing the known ones."""
    if name not in RECIPES:
        raise MnistflowError(f"unknown recipe '{name}' (known: {', '.join(RECIPES)})")
    return dict(RECIPES[name])
