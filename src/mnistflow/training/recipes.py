"""Recipes: named bundles of model + optimizer + schedule + epochs + batch.

Recipes hold no dataset's constants: input channels and size, classes and normalization come
from the records, what a recipe changes for a kind of data is declared in ``FOR_DATA``, and ``augment="auto"`` takes the dataset's own augmentation policy
(``data.augment``: glyphs for digits and letters, clothing for Fashion-MNIST, photos for
CIFAR-10, shifts for other inputs) in ``best``. ``fast`` and ``seed-cnn`` do not augment: in
fast's 0.45 epoch every image is new, and seed-cnn (dropout 0.5, 4 epochs) does not overfit
either, so augmentation only slows their learning. Chosen on Fashion-MNIST's validation split
(trained on train only): fast, seeds 0-2: 89.04 / 89.10 / 88.68% without, 86.42 / 85.92 /
85.74% with clothing; seed-cnn, seeds 0-1: 92.30 / 92.10% without, 91.06% (seed 0) with.
(MNIST fast, seeds 0-2: 99.06 / 99.03 / 99.10% test without, 99.11 / 99.14 / 99.09% with
glyphs, for ~6% more training time.) ``--augment auto`` turns it on for any recipe.

Any flag overrides a recipe value; ``mnistflow train --recipe NAME --help`` shows a recipe's
values as the defaults. Every key is a ``TrainConfig`` field (checked when resolved).
Accuracy and timing of each recipe on real MNIST are in BENCHMARKS.md; the test suite gates
softmax, seed-cnn and fast on accuracy.
"""
from __future__ import annotations

from mnistflow.core.errors import MnistflowError

# The most accurate: the wide fast net with on-device augmentation (on MNIST: glyphs, shifts
# and rotations), trained on all 60,000 labelled images (train + val, as MNIST results are
# reported; the test set stays unseen) for 7 epochs by Muon (as in `fast`), its test predictions averaged over 8
# one-pixel shifts (9 views): 99.60 / 99.61 / 99.66% on seeds 0-2. Nesterov SGD needed
# 10 epochs for 99.62 / 99.60 / 99.62%.
_BEST = dict(model="fast-wide", optimizer="muon", muon_lr=0.1, muon_momentum=0.8, nesterov=True,
             lr=0.5, weight_decay=5e-4, batch_size=256, epochs=7, schedule="onecycle", warmup=0.2,
             label_smoothing=0.1, augment="auto", channels_last=True, drop_last=True,
             log_every=50, eval_batch_size=1000, train_on="train+val", tta=8, validate=False,
             cuda_graphs="auto")

# Time-to-accuracy: >= 99.0% test in 0.45 of an epoch (benchmarks/time_to_accuracy.py):
# the first convolution initialised by whitening (--whiten), the hidden convolutions trained
# by Muon (orthogonalized momentum), the rest by Nesterov SGD. Batch 384 (65 steps): a step
# costs ~3.5 ms whatever its size (Python, oneDNN set-up, Muon), so 384 trains the same
# images in 0.85x the time of 256 (interleaved), with rates 1.3x. The net's last stage is
# a VALID convolution to 192 channels (models/fast.py): it reaches in 0.45 epoch what the
# 96-channel SAME stage + pool reached in 0.55, at a lower cost per step. Seeds 0-63: mean
# 99.10%, 59 of 64 at 99.0% or more, the worst 98.93% (the previous net at 0.55 epoch:
# 99.08%, 59 of 64; there, Nesterov SGD alone needed 0.9 epoch). No validation passes
# inside the timed run: the final test evaluation is the measurement (--validate: curves).
_FAST = dict(model="fast", optimizer="muon", muon_lr=0.13, muon_momentum=0.8, nesterov=True,
             lr=1.3, momentum=0.9, weight_decay=5e-4, batch_size=384, epochs=0.45,
             schedule="onecycle", warmup=0.3, label_smoothing=0.1, channels_last=True,
             drop_last=True, log_every=50, eval_batch_size=2000, validate=False, whiten=True,
             augment="off", cuda_graphs="auto")  # a GPU replays the step as one CUDA graph

RECIPES: dict[str, dict] = {
    # The tutorial's softmax regression: plain gradient descent, batch 100 (~92%). On
    # standardized inputs a linearly decaying rate from 0.3 beats the tutorial's constant 0.5.
    "softmax": dict(model="softmax", optimizer="sgd", lr=0.3, batch_size=100, epochs=1,
                    schedule="linear", precision="fp32", log_every=100),
    # The tutorial's deep CNN, trained with Adam (the tutorial: 1e-4, batch 50, 20k steps);
    # a one-cycle schedule and bf16 + channels_last reach its ~99.2% in a few epochs.
    "seed-cnn": dict(model="seed-cnn", optimizer="adam", lr=2e-3, batch_size=128, epochs=4,
                     schedule="onecycle", warmup=0.15, channels_last=True, log_every=100, augment="off"),
    "fast": dict(_FAST),  # time to 99.0% (above)
    # fast's net and settings for one whole epoch on train + val, with the dataset's augmentation
    # and 4 extra test views: >= 99.3% at 3x fast's cost (mid: 35x). Chosen on
    # validation (train only, seeds 0-3, mean / worst, training wall here): 0.75 epoch + glyphs
    # 99.07 / 99.02% (3.9 s), 1 epoch 99.08 / 99.04% unaugmented, 99.06 / 99.02% with glyphs
    # and no views, 99.12 / 99.06% with both (4.5 s), 1.5 epochs 99.17 / 99.16% (7.7 s), 2
    # 99.20 / 99.18% (9.9 s); fast itself 98.80 / 98.74% (2.1 s), and test has run 0.21-0.29%
    # above validation for fast and mid. The rule: the cheapest with a validation mean >= 99.10%.
    # Test, seeds 0-2: 99.35 / 99.36 / 99.41% in 6.4-7.0 s (fast: 2.2 s; BENCHMARKS.md).
    "fast-plus": {**_FAST, "epochs": 1, "augment": "auto", "tta": 4, "train_on": "train+val"},
    # 99.5% at a fraction of best's time. best's settings for 3 epochs instead
    # of 7, chosen on validation (trained on train only, no validation inside the final run):
    # fast-wide at 2 / 3 / 7 epochs reached 99.30, 99.26 / 99.38, 99.36 / 99.40% val (seeds 0, 1;
    # 7: seed 0), the fast net (32/48/192) 99.14-99.22% at 2-5 epochs, and 48/96/256 at
    # 3 epochs 99.16%. 3 epochs is the fewest within seed noise of 7 (BENCHMARKS.md, "The
    # time-to-accuracy frontier"). 4 extra test views, not 8: the same validation accuracy
    # (seeds 0-3: 99.32% mean with 4, 99.33% with 8, 99.29% with 2, 99.26% with none) in
    # 0.55x the test pass (5 forward passes of the test set instead of 9).
    "mid": {**_BEST, "epochs": 3, "tta": 4},
    "best": dict(_BEST),  # the most accurate (above)
}

# What a recipe changes for a kind of data, keyed by the dataset's own augmentation policy
# (``data.datasets``: clothing for Fashion-MNIST, photos for CIFAR-10), chosen on validation
# data (BENCHMARKS.md, "The MNIST family"). Applied when the records are open, to each value the
# run still has from the recipe: a flag or a config file that set it keeps its own.
FOR_DATA: dict[str, dict[str, dict]] = {
    # Clothing needs depth more than digits do: a second conv per stage (fast-deep) took
    # Fashion-MNIST validation from 92.2% to 93.0% at 7 epochs, 93.4% at 12 (seed 0, train
    # only, no TTA). 10 epochs: ~1.7x fast-wide's step, inside 120 s where `best` on MNIST
    # takes ~46 s (bf16 CPUs). A 7x7 cutout on top: 93.1% at 12 epochs, no better.
    "best": {"clothing": dict(model="fast-deep", epochs=10)},
    # fast-plus on clothing: neither the clothing augmentation nor test views (mirror + shifts),
    # which both cost the fast net at one epoch. Fashion-MNIST validation (train only, seeds
    # 0-2): 88.96 / 88.84 / 88.88% with both, 90.88 / 90.48 / 90.76% with views only, 91.14 /
    # 90.92 / 91.18% with neither (fast itself: 88.98 / 89.14 / 88.88%).
    "fast-plus": {"clothing": dict(augment="off", tta=0)},
    # mid on clothing: best's net (fast-deep) for mid's 3 epochs, without the clothing
    # augmentation, which costs a short run (as it costs fast-plus). Fashion-MNIST validation
    # (train only, 4 extra views, seeds 0-1, training wall here): fast-deep 92.94 / 93.12% without,
    # 92.20 / 92.38% with it (116 s); fast-wide 92.76 / 92.66% without, 91.84 / 91.52% with (62 s);
    # fast-deep for 2 epochs without, 92.38 / 92.88% (74 s). At best's 10 epochs the augmentation
    # pays: 93.84 / 93.76% with, 93.54 / 93.24% without (8 views), so best keeps it.
    "mid": {"clothing": dict(model="fast-deep", augment="off")},
}

# What each recipe reached from prepared records on a CPU without fast bf16 (MEASURED_ON): MNIST
# in one benchmarks/frontier.py run, Fashion-MNIST by benchmarks/family.py, the same measure
# (BENCHMARKS.md, "The time-to-accuracy frontier", "The MNIST family"): test accuracy over seeds
# 0-2 (lowest, median, highest) and the median wall seconds. ``--target-acc`` without a recipe
# picks from it, or from the table below for the machine the run is on.
MEASURED_ON = "AMD EPYC (Zen 2), 2 cores, fp32, 2026-11-25"
MEASURED: dict[str, dict[str, tuple[float, float, float, float]]] = {
    "mnist": {"fast": (0.9903, 0.9907, 0.9912, 2.17), "fast-plus": (0.9935, 0.9936, 0.9941, 6.48),
              "seed-cnn": (0.9934, 0.9939, 0.9940, 160.6), "mid": (0.9956, 0.9959, 0.9959, 76.6),
              "best": (0.9959, 0.9961, 0.9966, 172.8)},
    "fashion-mnist": {"fast": (0.8809, 0.8832, 0.8842, 2.3), "fast-plus": (0.9003, 0.9028, 0.9030, 5.0),
                      "seed-cnn": (0.9174, 0.9175, 0.9185, 155.0), "mid": (0.9239, 0.9250, 0.9260, 134.0),
                      "best": (0.9331, 0.9332, 0.9348, 417.0)},
}

# The same on a CPU with fast bf16 (AMX or AVX-512-BF16, where --precision auto trains in bf16):
# benchmarks/frontier.py on a Zen 4 without AMX, its fourth run (every recipe in one run, the
# weight gradient and Muon's iteration on the AVX-512-BF16 kernels; BENCHMARKS.md, "On a bf16
# CPU without AMX"); Fashion-MNIST by benchmarks/family.py on the same machine ("The MNIST
# family", its bf16 run). In that run best's seed 0 stopped at 99.56%.
MEASURED_BF16_ON = "AMD EPYC (Zen 4, AVX-512-BF16), 2 cores, bf16, 2026-11-27"
MEASURED_BF16: dict[str, dict[str, tuple[float, float, float, float]]] = {
    "mnist": {"fast": (0.9902, 0.9910, 0.9910, 1.32), "fast-plus": (0.9935, 0.9936, 0.9940, 4.03),
              "seed-cnn": (0.9935, 0.9939, 0.9941, 62.9), "mid": (0.9956, 0.9957, 0.9959, 35.3),
              "best": (0.9956, 0.9961, 0.9963, 75.3)},
    "fashion-mnist": {"fast": (0.8808, 0.8822, 0.8853, 1.37), "fast-plus": (0.9015, 0.9015, 0.9020, 2.99),
                      "seed-cnn": (0.9174, 0.9188, 0.9192, 71.4), "mid": (0.9250, 0.9258, 0.9259, 63.9),
                      "best": (0.9334, 0.9340, 0.9347, 234.0)},
}

# The same on a GPU: benchmarks/frontier.py --device cuda (bf16, the records resident on the
# GPU, the step replayed as a CUDA graph; one untimed run first: BENCHMARKS.md, "On a GPU").
MEASURED_GPU_ON = "an NVIDIA H100 (CUDA, bf16), 2026-11-25"
MEASURED_GPU: dict[str, dict[str, tuple[float, float, float, float]]] = {
    "mnist": {"fast": (0.9903, 0.9903, 0.9905, 0.100), "fast-plus": (0.9938, 0.9944, 0.9950, 0.315),
              "seed-cnn": (0.9934, 0.9940, 0.9942, 6.68), "mid": (0.9956, 0.9960, 0.9961, 0.995),
              "best": (0.9961, 0.9961, 0.9962, 2.65)},
}

MACHINES = ("cpu", "cpu-bf16", "gpu")  # what pick_for_target's figures can be for


def pick_for_target(target: float, dataset: str | None, machine: str = "cpu") -> tuple[str, str]:
    """(recipe, why): the cheapest recipe whose every measured seed reached ``target`` on
    ``dataset`` (as benchmarks/frontier.py draws the curve), by the figures of the machine the
    run is on where there are some for this dataset (``machine``: "gpu", "cpu-bf16" for a CPU
    that trains in bf16, "cpu"), else the fp32 CPU's. An error when the dataset is not measured or
    no recipe reaches it."""
    tables = {"gpu": (MEASURED_GPU, MEASURED_GPU_ON), "cpu-bf16": (MEASURED_BF16, MEASURED_BF16_ON)}
    measured, on = tables.get(machine, (MEASURED, MEASURED_ON))
    if dataset not in measured:
        measured, on = MEASURED, MEASURED_ON
    measured = measured.get(dataset or "")
    if not measured:
        raise MnistflowError(f"--target-acc without --recipe: no recipe is measured on "
                             f"{dataset or 'this data'} (measured: {', '.join(MEASURED)}); name one with --recipe")
    able = sorted((secs, name) for name, (lo, _, _, secs) in measured.items() if lo >= target)
    ranges = "; ".join(f"{n} {100 * lo:.2f}-{100 * hi:.2f}%" for n, (lo, _, hi, _) in measured.items())
    if not able:
        raise MnistflowError(f"--target-acc {target}: no recipe reaches it on {dataset} (seeds 0-2 test: "
                             f"{ranges}); lower it, or name a recipe with --recipe and train longer")
    secs, name = able[0]
    lo, med, hi, _ = measured[name]
    return name, (f"--target-acc {target}: recipe {name}, the cheapest measured to reach it on {dataset} "
                  f"(every seed: test {100 * lo:.2f}-{100 * hi:.2f}%, median {100 * med:.2f}%, {secs:.3g} s on "
                  f"{on}; all: {ranges})")


def for_data(recipe: str | None, policy: str) -> dict:
    """The settings recipe ``recipe`` changes for data whose augmentation policy is ``policy``."""
    return dict(FOR_DATA.get(recipe or "", {}).get(policy, {}))


def get_recipe(name: str) -> dict:
    """A copy of recipe ``name``'s settings; an unknown name is an error listing the known ones."""
    if name not in RECIPES:
        raise MnistflowError(f"unknown recipe '{name}' (known: {', '.join(RECIPES)})")
    return dict(RECIPES[name])
