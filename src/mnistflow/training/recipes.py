"""Recipes: named bundles of model + optimizer + schedule + epochs + batch.

Recipes know nothing of the data: input channels and size, classes and normalization come
from the records, and ``augment="auto"`` takes the dataset's own augmentation policy
(``data.augment``: glyphs for digits and letters, clothing for Fashion-MNIST, photos for
CIFAR-10, shifts for other inputs) in ``best``. ``fast`` and ``seed-cnn`` do not augment: in
fast's 0.45 epoch every image is new, and seed-cnn (dropout 0.5, 4 epochs) does not overfit
either, so augmentation only slows their learning. Fashion-MNIST, fast, seeds 0-1: 88.6 /
88.1% test without, 85.8 / 85.8% with clothing; seed-cnn, seed 0: 92.0% without, 90.8% with
clothing. (MNIST fast, seeds 0-2: 99.06 / 99.03 / 99.10% without, 99.11 / 99.14 / 99.09%
with glyphs, for ~6% more training time.) ``--augment auto`` turns it on for any recipe.

Any flag overrides a recipe value; ``mnistflow train --recipe NAME --help`` shows a recipe's
values as the defaults. Every key is a ``TrainConfig`` field (checked when resolved).
Accuracy and timing of each recipe on real MNIST are in BENCHMARKS.md; the test suite gates
softmax, seed-cnn and fast on accuracy.
"""
from __future__ import annotations

from mnistflow.core.errors import MnistflowError

RECIPES: dict[str, dict] = {
    # The tutorial's softmax regression: plain gradient descent, batch 100 (~92%). On
    # standardized inputs a linearly decaying rate from 0.3 beats the tutorial's constant 0.5.
    "softmax": dict(model="softmax", optimizer="sgd", lr=0.3, batch_size=100, epochs=1,
                    schedule="linear", precision="fp32", log_every=100),
    # The tutorial's deep CNN, trained with Adam (the tutorial: 1e-4, batch 50, 20k steps);
    # a one-cycle schedule and bf16 + channels_last reach its ~99.2% in a few epochs.
    "seed-cnn": dict(model="seed-cnn", optimizer="adam", lr=2e-3, batch_size=128, epochs=4,
                     schedule="onecycle", warmup=0.15, channels_last=True, log_every=100, augment="off"),
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
    "fast": dict(model="fast", optimizer="muon", muon_lr=0.13, muon_momentum=0.8, nesterov=True,
                 lr=1.3, momentum=0.9, weight_decay=5e-4, batch_size=384, epochs=0.45,
                 schedule="onecycle", warmup=0.3, label_smoothing=0.1, channels_last=True,
                 drop_last=True, log_every=50, eval_batch_size=2000, validate=False, whiten=True,
                 augment="off"),
    # The most accurate: the wide fast net with on-device augmentation (on MNIST: glyphs, shifts
    # and rotations), trained on all 60,000 labelled images (train + val, as MNIST results are
    # reported; the test set stays unseen) for 7 epochs by Muon (as in `fast`), its test predictions averaged over 8
    # one-pixel shifts (9 views): 99.60 / 99.61 / 99.66% on seeds 0-2. Nesterov SGD needed
    # 10 epochs for 99.62 / 99.60 / 99.62%.
    "best": dict(model="fast-wide", optimizer="muon", muon_lr=0.1, muon_momentum=0.8, nesterov=True,
                 lr=0.5, weight_decay=5e-4, batch_size=256, epochs=7, schedule="onecycle", warmup=0.2,
                 label_smoothing=0.1, augment="auto", channels_last=True, drop_last=True,
                 log_every=50, eval_batch_size=1000, train_on="train+val", tta=8, validate=False),
}


def get_recipe(name: str) -> dict:
    """A copy of recipe ``name``'s settings; an unknown name is an error listing the known ones."""
    if name not in RECIPES:
        raise MnistflowError(f"unknown recipe '{name}' (known: {', '.join(RECIPES)})")
    return dict(RECIPES[name])
