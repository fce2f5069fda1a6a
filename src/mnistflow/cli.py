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


VERBS = [_add_prep, _add_records]


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
