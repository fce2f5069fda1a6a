"""The ``mnistflow`` command: parse flags, call ONE library function, print its result.

    mnistflow prep mnist --out data/mnist
    mnistflow train --recipe seed-cnn --data data/mnist
    torchrun --standalone --nproc_per_node 2 -m mnistflow train --recipe fast

Heavy modules (torch) are imported inside the handlers so that ``--help`` stays fast.
Every ``MnistflowError`` becomes one line ``mnistflow: error: ...`` and exit code 2.
"""
from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path
from typing import NoReturn

from mnistflow.core import choices, limits
from mnistflow.core.errors import MnistflowError, one_line

PROG = "mnistflow"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage dump
        sys.stderr.write(f"{PROG}: error: {one_line(message)}{self._hint(message)} (see '{self.prog} --help')\n")
        raise SystemExit(2)

    def _hint(self, message: str) -> str:
        """For unknown flags, the flags they most likely mean (``--learning-rate`` -> ``--lr``)."""
        if not message.startswith("unrecognized arguments: "):
            return ""
        from mnistflow.training.config import suggest

        known = set(self._option_string_actions)
        for action in self._actions:  # the verbs' flags: the leftovers are reported up here
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    known |= set(sub._option_string_actions)
        hints = []
        for arg in message.split(": ", 1)[1].split():
            flag = arg.split("=", 1)[0]
            if not flag.startswith("--"):
                continue
            setting = suggest(flag[2:])
            guess = (f"--{setting.replace('_', '-')}" if setting else None)
            if guess not in known:
                close = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.75)
                guess = close[0] if close else None
            if guess:
                hints.append(f"{flag} -> {guess}")
        return f" (did you mean: {', '.join(hints)}?)" if hints else ""


def _int_in(low: int, high: int):
    """An argparse type: an integer from ``low`` to ``high``; anything else is a one-line error."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or not low <= n <= high:
            allowed = f"from {low} to {high}" if high < limits.MAX_INT else f">= {low}"
            raise argparse.ArgumentTypeError(f"expected an integer {allowed}, got '{text}'")
        return n
    return parse


def _size(text: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in text.lower().split("x"))
        if not (0 < h <= limits.MAX_SIDE and 0 < w <= limits.MAX_SIDE):
            raise ValueError
        return h, w
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HxW like 28x28 (sides 1 to {limits.MAX_SIDE}), "
                                         f"got '{text}'") from None


# --- verbs -----------------------------------------------------------------------------

def _add_prep(sub) -> None:
    p = sub.add_parser("prep", help="prepare records once from raw data (IDX, folder, CSV, npz, TFRecord)")
    from mnistflow.data.known import HELP

    p.add_argument("dataset", nargs="?", help=f"a known dataset: {HELP}")
    p.add_argument("--data", type=Path, help="raw input: a file or folder (default: $MNISTFLOW_DATA)")
    p.add_argument("--out", type=Path, help="records directory to write (default: in the cache)")
    p.add_argument("--val-size", type=_int_in(0, limits.MAX_INT), default=None,
                   help="validation images carved from train (default: 5000, or a tenth of a smaller set)")
    p.add_argument("--seed", type=_int_in(0, limits.MAX_SEED), default=0, help="seed of the train/validation split")
    p.add_argument("--variants", type=_int_in(0, limits.MAX_INT), default=0,
                   help="augmented copies of train to write")
    p.add_argument("--resize", type=_size, help="resize folder/TFRecord images to HxW")
    p.add_argument("--image-key", default="image", help="TFRecord image feature name")
    p.add_argument("--label-key", default="label", help="TFRecord label feature name")
    p.add_argument("--force", action="store_true",
                   help="rebuild even if up to date, or replace another dataset's record set at --out "
                        "(never other files)")
    p.add_argument("--max-pixels", type=_int_in(1, limits.MAX_INT), default=None, metavar="N",
                   help="largest picture decoded, in pixels, checked from its header before decoding "
                        "(default 16,777,216 = 4096x4096)")
    p.set_defaults(func=_run_prep)


def _run_prep(a) -> int:
    from mnistflow.data.prepare import prepare

    prepare(a.dataset, a.data, a.out, val_size=a.val_size, seed=a.seed, variants=a.variants,
            resize=a.resize, force=a.force, tfrecord_keys=(a.image_key, a.label_key),
            max_pixels=a.max_pixels)
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


# The profile verb: a short run around the profiled steps, without TensorBoard event files.
PROFILE_DEFAULTS = {"profile_steps": "5:15", "tensorboard": False}


def _recipe_in(argv: list[str]) -> str | None:
    """The value of the last ``--recipe`` in ``argv`` (``--recipe X``, ``--recipe=X`` or a
    unique abbreviation, as argparse reads them), so that ``--help`` can show its values."""
    name = None
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        flag, eq, value = arg.partition("=")
        if len(flag) >= len("--rec") and "--recipe".startswith(flag):
            name = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return name


def _shown_defaults(recipe: str | None, verb_defaults: dict) -> tuple[dict, str]:
    """The defaults ``--help`` shows (TrainConfig's, then the recipe's, then the verb's) and a
    line that says where they come from. An unknown recipe is left to the run to report."""
    from dataclasses import fields

    from mnistflow.training.config import TrainConfig

    shown = {f.name: f.default for f in fields(TrainConfig)}
    note = ""
    if recipe is not None:
        from mnistflow.training.recipes import RECIPES

        if recipe in RECIPES:
            shown.update(RECIPES[recipe], recipe=recipe)
            note = f"The defaults shown are those of --recipe {recipe}; flags override them."
    shown.update(verb_defaults)
    return shown, note


def _train_flags(p: argparse.ArgumentParser, argv: list[str], verb_defaults: dict) -> None:
    """Every TrainConfig field as a flag, in the help section its metadata names (shared by
    train and profile). Flags default to None, 'not given'; the help shows the value that
    applies: the field's default, or the --recipe's when argv names one."""
    from dataclasses import fields

    from mnistflow.training.config import GROUPS, TrainConfig, flag

    shown, note = _shown_defaults(_recipe_in(argv), verb_defaults)
    if note:
        p.description = f"{p.description}\n\n{note}" if p.description else note
    groups = {name: p.add_argument_group(name, what) for name, what in GROUPS.items()}
    run = groups["run"]
    run.add_argument("-h", "--help", action="help", help="show this help message and exit")
    run.add_argument("--config", type=Path, help="a TOML file of settings (e.g. a run's config.toml)")
    run.add_argument("--nproc", type=_int_in(1, limits.MAX_LOCAL_PROCESSES), metavar="N",
                     help="data parallel on this machine: re-run this command under torchrun with N processes")
    run.add_argument("--max-restarts", type=_int_in(0, limits.MAX_RESTARTS), metavar="K",
                     help="with --nproc: when a process dies, restart them all, up to K times; each restart "
                          "resumes from the newest checkpoint (default: 0)")
    for f in fields(TrainConfig):
        g, meta = groups[f.metadata["group"]], f.metadata
        helptext = meta["help"] + (f" (default: {shown[f.name]})" if shown[f.name] is not None else "")
        if meta["rule"].kind is bool:
            g.add_argument(flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                           help=helptext)
            continue
        options = dict(meta["flag"])
        off = options.pop("off", None)  # --no-<flag>: this value (--no-augment: off)
        g.add_argument(flag(f.name), dest=f.name, type=meta["parse"], default=None, help=helptext, **options)
        if off is not None:
            g.add_argument("--no-" + flag(f.name)[2:], dest=f.name, action="store_const", const=off,
                           help=argparse.SUPPRESS)


def _add_train(sub, argv: list[str], flags: bool = True) -> None:
    p = sub.add_parser("train", help="train a model from records into a run directory", add_help=not flags)
    if flags:
        _train_flags(p, argv, {})
    p.set_defaults(func=_run_train, profile=False)


def _add_profile(sub, argv: list[str], flags: bool = True) -> None:
    p = sub.add_parser("profile", help="a few training steps under the PyTorch profiler: Chrome trace, "
                                       "op tables by time and memory, step breakdown", add_help=not flags)
    if flags:
        _train_flags(p, argv, {**PROFILE_DEFAULTS, "max_steps": "B of --profile-steps A:B"})
    p.set_defaults(func=_run_train, profile=True)


LAUNCHER_FLAGS = ("--nproc", "--max-restarts")  # the launcher's own: not passed to the processes


def _without_launcher_flags(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in LAUNCHER_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f"{f}=" for f in LAUNCHER_FLAGS)):
            out.append(arg)
    return out


def _profile_settings(given: dict) -> dict:
    """The profile verb's settings: PROFILE_DEFAULTS where not given, and a run that stops at
    the last profiled step unless --max-steps says otherwise."""
    out = dict(given)
    for k, v in PROFILE_DEFAULTS.items():
        if out.get(k) in (None, ""):
            out[k] = v
    last = str(out["profile_steps"]).partition(":")[2].strip()
    if out.get("max_steps") is None and last.isdigit():  # a malformed A:B is reported by the config
        out["max_steps"] = int(last)
    return out


def _run_train(a) -> int:
    from dataclasses import fields

    from mnistflow.training.api import train
    from mnistflow.training.checkpointing import TrainingInterrupted
    from mnistflow.training.config import TrainConfig

    given = {f.name: getattr(a, f.name) for f in fields(TrainConfig) if getattr(a, f.name) is not None}
    if a.profile:
        given = _profile_settings(given)
    if a.nproc is not None:
        return _launch(a, given)
    if a.max_restarts is not None:
        raise MnistflowError("--max-restarts restarts the processes of --nproc N; under your own torchrun, "
                             "give it to torchrun (torchrun --max-restarts K ...)")
    from mnistflow.runtime.dist import die_with_parent

    die_with_parent()  # under torchrun: never left training alone when the agent dies
    try:
        train(config=a.config, **given)
    except TrainingInterrupted as e:  # a checkpoint was saved: 130 (SIGINT) / 143 (SIGTERM)
        from mnistflow.core import progress

        progress.close_all()
        sys.stderr.write(f"{PROG}: {e}\n")
        return e.exit_code
    return 0


def _launch(a, given: dict) -> int:
    """``train --nproc N``: everything each process would refuse is checked here first (one line,
    exit 2, not one per process and a torn-down job), then the processes start."""
    from mnistflow.runtime.dist import env_info, launch_local
    from mnistflow.training.configure import configure
    from mnistflow.training.setup import check_launch, check_run_inputs

    if env_info().enabled:
        raise MnistflowError("--nproc is for a plain command; under torchrun leave it out")
    cfg, resume = configure(a.config, **given)
    check_run_inputs(cfg)
    check_launch(cfg, a.nproc, resume)
    return launch_local(a.nproc, _without_launcher_flags(sys.argv[1:]), a.max_restarts or 0)


def _add_models(sub) -> None:
    p = sub.add_parser("models", help="list the registered models with parameter counts")
    p.add_argument("--input", type=_size, default=(28, 28), help="input HxW (default 28x28)")
    p.add_argument("--channels", type=_int_in(1, limits.MAX_CHANNELS), default=1)
    p.add_argument("--classes", type=_int_in(1, limits.MAX_CLASSES), default=10)
    p.set_defaults(func=_run_models)


def _run_models(a) -> int:
    import textwrap

    from mnistflow.core.progress import columns
    from mnistflow.models import get_entry, list_models, parameter_count
    from mnistflow.models.ensemble import MAX_MEMBERS

    shape = (a.channels, *a.input)
    print(f"{'model':<14} {'params':>11}  description (input {shape[1]}x{shape[2]}x{shape[0]}, {a.classes} classes)")
    rows = [(name, f"{parameter_count(name, shape, a.classes):,}", get_entry(name).description)
            for name in list_models()]
    rows.append(("NAME-xK", "K x NAME", f"An ensemble of K NAMEs (2-{MAX_MEMBERS}) trained as one model, "
                                        "their probabilities averaged (e.g. fast-wide-x4)"))
    width = max(columns(sys.stdout), 60) - 28  # the description column: what the terminal leaves
    for name, params, text in rows:
        lines = textwrap.wrap(text.replace("``", "'"), width, break_on_hyphens=False) or [""]  # rST ``x``: 'x'
        print(f"{name:<14} {params:>11}  {lines[0]}")
        for line in lines[1:]:
            print(" " * 28 + line)
    return 0


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help="accuracy, loss, per-class accuracy and confusion matrix")
    p.add_argument("model", type=Path, help="a run directory or a model file")
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument("--model", dest="model_name", help="the model name for an npz of parameters")
    p.add_argument("--data", type=Path, help="records or raw data (default: the model's own records)")
    p.add_argument("--device", default="auto")
    p.add_argument("--batch-size", type=_int_in(1, limits.MAX_INT), default=None,
                   help="images per forward pass (default: one that fits a CPU's caches; 2000 on a GPU)")
    p.add_argument("--tta", type=int, default=0, metavar="N",
                   help="average each prediction over N one-pixel shifts too (0, 2, 4, 8), as --tta in training")
    p.add_argument("--precision", default="auto", choices=choices.PRECISIONS,
                   help="auto: the precision the run's own evaluations used, where this device runs it fast "
                        "(so eval repeats the run's figure), else fp32")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=_run_eval)


def _run_eval(a) -> int:
    import json

    from mnistflow.inference import evaluate, format_eval

    res = evaluate(a.model, a.split, data=a.data, device=a.device, batch_size=a.batch_size,
                   model_name=a.model_name, tta=a.tta, precision=a.precision)
    print(json.dumps(res) if a.json else format_eval(res))
    return 0


def _add_predict(sub) -> None:
    p = sub.add_parser("predict", help="label and class probabilities for images")
    p.add_argument("model", type=Path, help="a run directory or a model file")
    p.add_argument("images", nargs="+", type=Path,
                   help="picture files (PNG, JPEG, ...), folders of pictures, or IDX image files")
    p.add_argument("--as-is", action="store_true",
                   help="feed pictures as they are, only resized to the model's size (by default "
                        "each is made as the dataset's images were: polarity, the ink's box scaled "
                        "and centred)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", dest="model_name", help="the model name for an npz of parameters")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--format", default="table", choices=choices.PREDICT_FORMATS,
                     help="table (default), json (one array), jsonl (one object a line) or csv; "
                          "written as the images are classified")
    out.add_argument("--json", action="store_true", help="--format json, and no progress bar")
    p.add_argument("--batch-size", type=_int_in(1, limits.MAX_INT), default=None,
                   help="images per forward pass (default: one that fits a CPU's caches)")
    p.add_argument("--precision", default="fp32", choices=choices.PRECISIONS,
                   help="fp32 (default: as serve and the exports), bf16 (faster on CPUs with bf16 units; "
                        "a few answers differ), or auto: as eval, the run's own where this device runs it fast")
    p.add_argument("--max-pixels", type=_int_in(1, limits.MAX_INT), default=None, metavar="N",
                   help="largest picture decoded, in pixels, checked from its header before decoding "
                        "(default 16,777,216 = 4096x4096)")
    p.set_defaults(func=_run_predict)


def _run_predict(a) -> int:
    from mnistflow.inference import predict_batches, write_predictions

    preds = predict_batches(a.model, a.images, as_is=a.as_is, device=a.device, model_name=a.model_name,
                            max_pixels=a.max_pixels, precision=a.precision, batch_size=a.batch_size)
    write_predictions(preds, "json" if a.json else a.format)
    return 0


def _add_serve(sub) -> None:
    p = sub.add_parser("serve", help="the draw-a-digit web page and a JSON API for a trained model")
    p.add_argument("model", type=Path, help="a run directory, a model file, or an ONNX or .pt2 export")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; others get a warning)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--workers", type=_int_in(1, 1024), default=1,
                   help="server processes, each loading the model checked at start (a private copy)")
    p.add_argument("--threads", type=_int_in(1, 1024), default=None,
                   help="intra-op threads per request (default $MNISTFLOW_THREADS, else 1)")
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.add_argument("--max-pixels", type=_int_in(1, limits.MAX_INT), default=None, metavar="N",
                   help="largest image a request may send, in pixels, checked from its header before decoding "
                        "(default 4,194,304 = 2048x2048; JPEGs decode at up to 1/8 scale first)")
    p.set_defaults(func=_run_serve)


def _run_serve(a) -> int:
    from mnistflow.server import serve

    serve(a.model, a.host, a.port, workers=a.workers, threads=a.threads, access_log=a.access_log,
          max_pixels=a.max_pixels)
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
    p = sub.add_parser("export", help="a trained model as ONNX or a torch.export program (pt2), both "
                                      "verified; npz or safetensors; a web page that runs it in the browser")
    p.add_argument("model", type=Path, help="a run directory, a checkpoint or a model file")
    p.add_argument("--format", required=True, choices=choices.EXPORT_FORMATS)
    p.add_argument("--out", help="file to write, or folder for --format web "
                                 "(default: next to the model)")  # str: keeps a trailing /
    p.add_argument("--force", action="store_true", help="replace the --out file (and its .int8.onnx) if it exists")
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

    res = export(a.model, a.format, a.out, a.only, a.quantize, model_name=a.model_name, data=a.data, force=a.force)
    print(json.dumps(res) if a.json else format_export(res))
    return 0


def _add_summary(sub) -> None:
    p = sub.add_parser("summary", help="layers, output shapes, parameters, MACs; --variables lists them")
    p.add_argument("model", help="a registered model, a layer spec, a run directory or a model file")
    p.add_argument("--input", type=_size, help="input HxW (default: the model's, or 28x28)")
    p.add_argument("--channels", type=_int_in(1, limits.MAX_CHANNELS),
                   help="input channels (default: the model's, or 1)")
    p.add_argument("--classes", type=_int_in(1, limits.MAX_CLASSES),
                   help="classes for a model name or spec (default 10)")
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
    p.add_argument("--force", action="store_true", help="write into an --out folder that is not empty")
    p.add_argument("--compare", nargs="+", type=Path, default=[], metavar="RUN_DIR",
                   help="overlay the curves of these runs too")
    p.add_argument("--data", type=Path, help="records for the test images (default: the model's own)")
    p.add_argument("--device", default="auto")
    p.set_defaults(func=_run_report)


def _run_report(a) -> int:
    from mnistflow.core.errors import display
    from mnistflow.reporting import build_report

    html, pngs = build_report(a.run_dir, a.out, a.compare, data=a.data, device=a.device, force=a.force)
    print("\n".join(display(p) for p in [*pngs, html]))
    return 0


VERBS = [_add_doctor, _add_prep, _add_records, _add_train, _add_profile, _add_models, _add_eval, _add_predict, _add_serve,
         _add_export, _add_summary, _add_report]


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line. ``argv``: the arguments about to be parsed. Read for the
    ``--recipe`` whose values ``train --help`` / ``profile --help`` show as defaults, and for
    the verb: train's and profile's flags are built only when one of them is the verb."""
    verb = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    train_flags = verb is None or verb in ("train", "profile")
    parser = _Parser(prog=PROG, description="Train MNIST-family image classifiers fast, and see why.")
    from mnistflow import __version__

    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    sub.required = True
    for add in VERBS:
        if add in (_add_train, _add_profile):
            add(sub, argv or [], train_flags)
        else:
            add(sub)
    return parser


def _stdout_unusable() -> str | None:
    """Why nothing written to standard output would arrive (closed: ``>&-``; open for reading
    only), else None: a verb would print its result into nothing and exit 0."""
    if sys.stdout is None:  # Python's stand-in for a closed file descriptor 1
        return "standard output is closed"
    try:
        import fcntl

        flags = fcntl.fcntl(sys.stdout.fileno(), fcntl.F_GETFL)
    except (ImportError, OSError, ValueError, AttributeError):  # no fcntl (Windows), no descriptor
        return None
    return "standard output is open for reading only" if flags & os.O_ACCMODE == os.O_RDONLY else None


def main(argv: list[str] | None = None) -> int:
    from mnistflow.core import openmp

    unusable = _stdout_unusable()
    if unusable:  # (and a file opened later could take descriptor 1 and receive the output)
        if sys.stderr is not None:
            sys.stderr.write(f"{PROG}: error: {unusable}: the output would be lost; "
                             "redirect it to a file or to /dev/null instead\n")
        return 2
    openmp.choose_at_start()  # before anything imports torch: libgomp reads the policy once
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    from mnistflow.core import progress

    try:
        with progress.quiet(bool(getattr(args, "json", False) or getattr(args, "quiet", False))):
            try:
                return int(args.func(args) or 0)
            finally:
                progress.close_all()  # no bar left under an error or interrupt line
    except MnistflowError as e:
        # under torchrun every rank raises it: print it once per machine; a lost peer is each rank's own
        if os.environ.get("LOCAL_RANK", "0") == "0" or getattr(e, "per_rank", False):
            sys.stderr.write(f"{PROG}: error: {one_line(e)}\n")
        return getattr(e, "exit_code", 2)  # 2, or 128 + signal for a process killed under --nproc
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130
    except BrokenPipeError:  # e.g. `mnistflow summary seed-cnn | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141
    except OSError as e:  # the last resort for a write the library did not wrap: disk full, ...
        if e.errno is None and e.strerror is None:  # not the system's: a bug, keep its traceback
            raise
        from mnistflow.core.errors import os_error

        sys.stderr.write(f"{PROG}: error: {one_line(os_error(e))}\n")  # any rank: it may be its own alone
        return 2
