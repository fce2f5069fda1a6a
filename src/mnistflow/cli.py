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

from mnistflow.core.errors import MnistflowError

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
    from mnistflow.data.prepare import prepare

    prepare(a.dataset, a.data, a.out, val_size=a.val_size, seed=a.seed, variants=a.variants,
            resize=a.resize, force=a.force, tfrecord_keys=(a.image_key, a.label_key))
    return 0


def _add_records(sub) -> None:
    p = sub.add_parser("records", help="show what a record set holds and verify its checksums")
    p.add_argument("dir", type=Path)
    p.set_defaults(func=_run_records)


def _run_records(a) -> int:
    from mnistflow.data.records import describe, open_records

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
    "optimizer": "sgd, momentum, adadelta, adagrad, adam, adamw, rmsprop, muon (orthogonalized "
                 "updates for the hidden weight matrices, Nesterov SGD for the rest)",
    "muon_lr": "--optimizer muon: learning rate of the hidden weight matrices (--lr: the rest)",
    "muon_momentum": "--optimizer muon: momentum of the hidden weight matrices",
    "schedule": "constant, step, cosine, onecycle, linear",
    "warmup": "linear warm-up: fraction of all steps (<1) or a number of steps",
    "precision": "fp32, bf16, fp16 (CUDA) or auto (bf16 where the hardware is fast at it)",
    "threads": "intra-op CPU threads (default: $MNISTFLOW_THREADS, else the usable cores other processes "
               "leave free, shared among the processes per machine)",
    "interop_threads": "PyTorch's inter-op threads (default: PyTorch's, the number of cores)",
    "gpu_memory_fraction": "cap this process's share of its GPU's memory, 0 < F <= 1 (CUDA only)",
    "sync_bn": "under torchrun on GPUs: batch norm statistics over the global batch",
    "batch_size": "per process; under torchrun the global batch is this x processes",
    "train_on": "train, or train+val: every labelled image (no validation passes then)",
    "tta": "test-time augmentation: also average the predictions for N images shifted by one "
           "pixel (2: left/right, 4: + up/down, 8: + diagonals) in evaluations",
    "whiten": "initialise the first convolution to whiten its input patches (from 1,000 training images)",
    "resident": "keep the data on the device: auto (when it fits), yes, or no (stream it from disk)",
    "memory_cap_mb": "refuse settings estimated to need more memory than this (default: what is free)",
    "profile_steps": "A:B profiles optimizer steps A..B: Chrome trace, op tables, step breakdown",
    "validate": "evaluate the validation split at each epoch end (or every --eval-every steps)",
    "device": "auto, cpu, cuda, cuda:N or mps",
    "log_every": "steps between progress lines (and device syncs)",
    "eval_every": "steps between validation passes (default: every epoch)",
    "json": "print a JSON summary of the run as the last line",
    "checkpoint_every": "steps between checkpoints (RUN/checkpoints; also at the end and on a new best)",
    "checkpoint_secs": "seconds between checkpoints",
    "keep_checkpoints": "checkpoints to keep (plus the best); 0 turns checkpoints off",
    "init_from": "start from the arrays of an npz (mnistflow export --format npz), by name",
    "init_only": "glob(s), comma separated, of the names --init-from restores (e.g. 'conv*')",
}


def _batch_size(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or auto, got '{text}'") from None


def _flag_type(annotation: str):
    if "bool" in annotation:
        return None
    if "int" in annotation:
        return int
    if "float" in annotation:
        return float
    return str


def _train_flags(p) -> None:
    """Every TrainConfig field as a flag (shared by train and profile)."""
    from dataclasses import fields

    from mnistflow.training.config import TrainConfig

    p.add_argument("--config", type=Path, help="a TOML file of settings (e.g. a run's config.toml)")
    p.add_argument("--resume", nargs="?", const="latest", default=None, metavar="PATH",
                   help="continue from the latest checkpoint of --run-dir, or from PATH "
                        "(a checkpoint or run directory)")
    p.add_argument("--nproc", type=int, metavar="N",
                   help="data parallel on this machine: re-run this command under torchrun with N processes")
    for f in fields(TrainConfig):
        if f.name == "resume":
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = _batch_size if f.name == "batch_size" else _flag_type(str(f.type))
        helptext = TRAIN_HELP.get(f.name, "") + (f" (default {f.default})" if f.default is not None else "")
        if kind is None:
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                           help=helptext)
        else:
            p.add_argument(flag, dest=f.name, type=kind, default=None, help=helptext)


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train a model from records into a run directory")
    _train_flags(p)
    p.set_defaults(func=_run_train)


def _add_profile(sub) -> None:
    p = sub.add_parser("profile", help="a few training steps under the PyTorch profiler: Chrome trace, "
                                       "op tables by time and memory, step breakdown")
    _train_flags(p)
    p.set_defaults(func=_run_train, profile_default="5:15")


def _without_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def _run_train(a) -> int:
    from dataclasses import fields

    from mnistflow.training.config import TrainConfig
    from mnistflow.training.loop import TrainingInterrupted, train

    if a.nproc:
        from mnistflow.runtime.dist import env_info, launch_local

        if env_info().enabled:
            raise MnistflowError("--nproc is for a plain command; under torchrun leave it out")
        return launch_local(a.nproc, _without_nproc(sys.argv[1:]))
    overrides = {f.name: getattr(a, f.name) for f in fields(TrainConfig)}
    if getattr(a, "profile_default", None):  # the profile verb: a short run around the profiled steps
        overrides["profile_steps"] = overrides["profile_steps"] or a.profile_default
        if overrides["max_steps"] is None:
            overrides["max_steps"] = int(overrides["profile_steps"].split(":")[1])
        overrides["tensorboard"] = False if overrides["tensorboard"] is None else overrides["tensorboard"]
    try:
        train(a.config, **{k: v for k, v in overrides.items() if v is not None})
    except TrainingInterrupted as e:  # a checkpoint was saved: 130 (SIGINT) / 143 (SIGTERM)
        sys.stderr.write(f"{PROG}: {e}\n")
        return e.exit_code
    return 0


def _add_models(sub) -> None:
    p = sub.add_parser("models", help="list the registered models with parameter counts")
    p.add_argument("--input", type=_size, default=(28, 28), help="input HxW (default 28x28)")
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--classes", type=int, default=10)
    p.set_defaults(func=_run_models)


def _run_models(a) -> int:
    from mnistflow.models import create_model, get_entry, list_models

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
    p.add_argument("--model", dest="model_name", help="the model name for an npz of parameters")
    p.add_argument("--data", type=Path, help="records or raw data (default: the model's own records)")
    p.add_argument("--device", default="auto")
    p.add_argument("--batch-size", type=int, default=2000)
    p.add_argument("--tta", type=int, default=0, metavar="N",
                   help="average each prediction over N one-pixel shifts too (0, 2, 4, 8), as --tta in training")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=_run_eval)


def _run_eval(a) -> int:
    import json

    from mnistflow.inference import evaluate, format_eval

    res = evaluate(a.model, a.split, data=a.data, device=a.device, batch_size=a.batch_size,
                   model_name=a.model_name, tta=a.tta)
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
    p.add_argument("--model", dest="model_name", help="the model name for an npz of parameters")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run_predict)


def _run_predict(a) -> int:
    import json

    from mnistflow.inference import format_predictions, predict

    invert = {"no": False, "yes": True, "auto": None}[a.invert]
    preds = predict(a.model, a.images, invert=invert, mnist_style=a.mnist_style, device=a.device,
                    model_name=a.model_name)
    print(json.dumps(preds) if a.json else format_predictions(preds))
    return 0


def _add_serve(sub) -> None:
    p = sub.add_parser("serve", help="the draw-a-digit web page and a JSON API for a trained model")
    p.add_argument("model", type=Path, help="a run directory, a model file or an ONNX export")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; others get a warning)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--workers", type=int, default=1, help="server processes, each with its own model")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per request (default 1)")
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.set_defaults(func=_run_serve)


def _run_serve(a) -> int:
    from mnistflow.server import serve

    serve(a.model, a.host, a.port, workers=a.workers, threads=a.threads, access_log=a.access_log)
    return 0


def _add_doctor(sub) -> None:
    p = sub.add_parser("doctor", help="versions, devices, CPU features, and what to change for speed")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run_doctor)


def _run_doctor(a) -> int:
    import json

    from mnistflow.doctor import diagnose, format_report

    d = diagnose()
    print(json.dumps(d) if a.json else format_report(d))
    return 0


def _add_export(sub) -> None:
    p = sub.add_parser("export", help="a trained model as ONNX (verified), npz or safetensors")
    p.add_argument("model", type=Path, help="a run directory, a checkpoint or a model file")
    p.add_argument("--format", required=True, choices=["onnx", "npz", "safetensors"])
    p.add_argument("--out", type=Path, help="file to write (default: next to the model)")
    p.add_argument("--only", action="append", metavar="GLOB",
                   help="npz/safetensors: only names matching GLOB, e.g. 'conv*' (repeatable)")
    p.add_argument("--quantize", choices=["int8"], help="onnx: also write an int8 model and compare it")
    p.add_argument("--model", dest="model_name", help="the model name for an npz of parameters")
    p.add_argument("--data", type=Path, help="records for verification (default: the model's own)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=_run_export)


def _run_export(a) -> int:
    import json

    from mnistflow.exporting import export, format_export

    res = export(a.model, a.format, a.out, a.only, a.quantize, model_name=a.model_name, data=a.data)
    print(json.dumps(res) if a.json else format_export(res))
    return 0


def _add_summary(sub) -> None:
    p = sub.add_parser("summary", help="layers, output shapes, parameters, MACs; --variables lists them")
    p.add_argument("model", help="a registered model, a layer spec, a run directory or a model file")
    p.add_argument("--input", type=_size, help="input HxW (default: the model's, or 28x28)")
    p.add_argument("--channels", type=int, help="input channels (default: the model's, or 1)")
    p.add_argument("--classes", type=int, help="classes for a model name or spec (default 10)")
    p.add_argument("--variables", action="store_true", help="list every trainable variable with its shape")
    p.add_argument("--all", action="store_true", help="list all variables, buffers included")
    p.set_defaults(func=_run_summary)


def _run_summary(a) -> int:
    from mnistflow.summary import summarize

    print(summarize(a.model, a.input, a.variables, a.all, channels=a.channels, num_classes=a.classes))
    return 0


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="plots (curves, confusion matrix, mistakes) and one HTML page of a run")
    p.add_argument("run_dir", type=Path, help="a run directory")
    p.add_argument("--out", type=Path, help="folder to write (default: RUN_DIR/report)")
    p.add_argument("--compare", nargs="+", type=Path, default=[], metavar="RUN_DIR",
                   help="overlay the curves of these runs too")
    p.add_argument("--data", type=Path, help="records for the test images (default: the model's own)")
    p.add_argument("--device", default="auto")
    p.set_defaults(func=_run_report)


def _run_report(a) -> int:
    from mnistflow.core.errors import display
    from mnistflow.reporting import build_report

    html, pngs = build_report(a.run_dir, a.out, a.compare, data=a.data, device=a.device)
    print("\n".join(display(p) for p in [*pngs, html]))
    return 0


VERBS = [_add_doctor, _add_prep, _add_records, _add_train, _add_profile, _add_models, _add_eval, _add_predict, _add_serve,
         _add_export, _add_summary, _add_report]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Train MNIST-family image classifiers fast, and see why.")
    from mnistflow import __version__

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
        if os.environ.get("RANK", "0") == "0":  # under torchrun every rank raises it: print it once
            sys.stderr.write(f"{PROG}: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130
    except BrokenPipeError:  # e.g. `mnistflow summary seed-cnn | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141
