"""The ``mnistflow`` command: parse flags, call ONE library function, print its result.

    mnistflow prep mnist --out data/mnist
    mnistflow train --recipe seed-cnn --data data/mnist
    torchrun --standalone --nproc_per_node 2 -m mnistflow train --recipe fast

Heavy modules (torch) are imported inside the handlers so that ``--help`` stays fast.
Every ``MnistflowError`` becomes one line ``mnistflow: error: ...`` and exit code 2.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .errors import MnistflowError

PROG = "mnistflow"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        sys.stderr.write(f"{PROG}: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(2)


def _size(text: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in text.lower().split("x"))
        if h <= 0 or w <= 0:
            raise ValueError
        return h, w
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HxW like 28x28, got '{text}'") from None


# --- verbs -----------------------------------------------------------------------------

def _add_prep(sub) -> None:
    p = sub.add_parser("prep", help="prepare records once from raw data (IDX, folder, CSV, npz, TFRecord)")
    p.add_argument("dataset", nargs="?", help="a known dataset: mnist, fashion-mnist, kmnist, cifar10")
    p.add_argument("--data", type=Path, help="raw input: a file or folder (default: $MNISTFLOW_DATA)")
    p.add_argument("--out", type=Path, help="records directory to write (default: in the cache)")
    p.add_argument("--val-size", type=int, default=5000, help="validation images carved from train")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/validation split")
    p.add_argument("--variants", type=int, default=0, help="augmented copies of train to write")
    p.add_argument("--resize", type=_size, help="resize folder/TFRecord images to HxW")
    p.add_argument("--image-key", default="image", help="TFRecord image feature name")
    p.add_argument("--label-key", default="label", help="TFRecord label feature name")
    p.add_argument("--force", action="store_true", help="rebuild even if up to date")
    p.set_defaults(func=_run_prep)


def _run_prep(a) -> int:
    from .prep import prepare

    prepare(a.dataset, a.data, a.out, val_size=a.val_size, seed=a.seed, variants=a.variants,
            resize=a.resize, force=a.force, tfrecord_keys=(a.image_key, a.label_key))
    return 0


def _add_records(sub) -> None:
    p = sub.add_parser("records", help="show what a record set holds and verify its checksums")
    p.add_argument("dir", type=Path)
    p.set_defaults(func=_run_records)


def _run_records(a) -> int:
    from .data.records import describe, open_records

    print(describe(open_records(a.dir)))
    print("checksums OK")
    return 0


TRAIN_HELP = {
    "recipe": "a preset: softmax, seed-cnn, fast, best (flags override its values)",
    "model": "a registered model (see 'mnistflow models') or a layer spec string",
    "data": "records directory or raw data (prepared into the cache on first use)",
    "dataset": "a known dataset name: mnist, fashion-mnist, kmnist, cifar10",
    "run_dir": "where to write the run (default runs/<recipe>-<time>)",
    "epochs": "epochs to train (fractions allowed)",
    "max_steps": "stop after this many steps",
    "target_acc": "stop once this accuracy (e.g. 0.99) is reached; reports the time to it",
    "target_split": "split the target is measured on: val or test",
    "optimizer": "sgd, momentum, adadelta, adagrad, adam, adamw, rmsprop",
    "schedule": "constant, step, cosine, onecycle, linear",
    "warmup": "linear warm-up: fraction of all steps (<1) or a number of steps",
    "precision": "fp32, bf16, fp16 (CUDA) or auto (bf16 where the hardware is fast at it)",
    "threads": "intra-op CPU threads (default: $MNISTFLOW_THREADS or all usable cores)",
    "device": "auto, cpu, cuda, cuda:N or mps",
    "log_every": "steps between progress lines (and device syncs)",
    "eval_every": "steps between validation passes (default: every epoch)",
    "json": "print a JSON summary of the run as the last line",
}


def _flag_type(annotation: str):
    if "bool" in annotation:
        return None
    if "int" in annotation:
        return int
    if "float" in annotation:
        return float
    return str


def _add_train(sub) -> None:
    from dataclasses import fields

    from .config import TrainConfig

    p = sub.add_parser("train", help="train a model from records into a run directory")
    p.add_argument("--config", type=Path, help="a TOML file of settings (e.g. a run's config.toml)")
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = _flag_type(str(f.type))
        helptext = TRAIN_HELP.get(f.name, "") + (f" (default {f.default})" if f.default is not None else "")
        if kind is None:
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                           help=helptext)
        else:
            p.add_argument(flag, dest=f.name, type=kind, default=None, help=helptext)
    p.set_defaults(func=_run_train)


def _run_train(a) -> int:
    from dataclasses import fields

    from .config import TrainConfig
    from .train import train

    overrides = {f.name: getattr(a, f.name) for f in fields(TrainConfig)}
    train(a.config, **{k: v for k, v in overrides.items() if v is not None})
    return 0


def _add_models(sub) -> None:
    p = sub.add_parser("models", help="list the registered models with parameter counts")
    p.add_argument("--input", type=_size, default=(28, 28), help="input HxW (default 28x28)")
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--classes", type=int, default=10)
    p.set_defaults(func=_run_models)


def _run_models(a) -> int:
    from .models import create_model, get_entry, list_models

    shape = (a.channels, *a.input)
    print(f"{'model':<14} {'params':>11}  description (input {shape[1]}x{shape[2]}x{shape[0]}, {a.classes} classes)")
    for name in list_models():
        n = sum(p.numel() for p in create_model(name, shape, a.classes).parameters())
        print(f"{name:<14} {n:>11,}  {get_entry(name).description}")
    return 0


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help="accuracy, loss, per-class accuracy and confusion matrix")
    p.add_argument("model", type=Path, help="a run directory or a model file")
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument("--data", type=Path, help="records or raw data (default: the model's own records)")
    p.add_argument("--device", default="auto")
    p.add_argument("--batch-size", type=int, default=2000)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=_run_eval)


def _run_eval(a) -> int:
    import json

    from .inference import evaluate, format_eval

    res = evaluate(a.model, a.split, data=a.data, device=a.device, batch_size=a.batch_size)
    print(json.dumps(res) if a.json else format_eval(res))
    return 0


def _add_predict(sub) -> None:
    p = sub.add_parser("predict", help="label and class probabilities for images")
    p.add_argument("model", type=Path, help="a run directory or a model file")
    p.add_argument("images", nargs="+", type=Path, help="PNG/JPEG files or IDX image files")
    p.add_argument("--invert", default="no", choices=["no", "yes", "auto"],
                   help="invert dark-on-light pictures to MNIST's white-on-black (auto: decide per image)")
    p.add_argument("--mnist-style", action="store_true",
                   help="crop to the digit, scale to 20x20, centre by mass in 28x28 (as MNIST was made)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run_predict)


def _run_predict(a) -> int:
    import json

    from .inference import format_predictions, predict

    invert = {"no": False, "yes": True, "auto": None}[a.invert]
    preds = predict(a.model, a.images, invert=invert, mnist_style=a.mnist_style, device=a.device)
    print(json.dumps(preds) if a.json else format_predictions(preds))
    return 0


VERBS = [_add_prep, _add_records, _add_train, _add_models, _add_eval, _add_predict]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Train MNIST-family image classifiers fast, and see why.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    sub.required = True
    for add in VERBS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MnistflowError as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130
