"""``mnistflow report``: a run's curves, mistakes and numbers as PNGs and one HTML page.

    mnistflow report runs/seed-cnn-20261121-120000          # -> RUN/report/index.html + PNGs
    mnistflow report runs/seed-cnn --compare runs/softmax runs/fast --out cmp/

    import mnistflow
    html = mnistflow.report("runs/seed-cnn", compare=["runs/softmax"])

Written into ``RUN/report/`` (re-made from the run, so replaced by the next report), or into
the folder ``--out`` names: one that does not exist or is empty; one that holds anything
(an earlier report included) only with ``--force``, which replaces the page and the PNGs of
the same names and leaves other files alone. A file is never replaced by the folder. The
files are drawn in memory and written into a temporary sibling folder first, then moved
into place (the page last): a report that fails leaves the folder as it was.

The curves come from the run's ``metrics.jsonl`` (training loss/accuracy on the batches of
each log interval, noisy; validation on the whole split, smooth), the mistakes from the
trained model run once over the test split of its records. The HTML page embeds every PNG
as a ``data:`` URI, so it is one file with no external assets that can be mailed or
attached to an issue. matplotlib is optional (``pip install 'mnistflow[report]'``) and
imported only here; the PNGs are drawn by its Agg renderer (no display needed).

    run.py    the model on its test split (the run's own files: ``artifacts.runlog.load_run``)
    plots.py  one function per PNG
    page.py   the self-contained HTML page
"""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Iterable

from mnistflow.artifacts.rundir import RunDir
from mnistflow.artifacts.runlog import load_run
from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError, os_error
from mnistflow.core.progress import stages
from mnistflow.reporting.page import HTML_FILE, render_html
from mnistflow.reporting.plots import (
    COMPARE_SIZE,
    PLOT_SIZES,
    plot_compare,
    plot_confusion,
    plot_curve,
    plot_layers,
    plot_lr,
    plot_misclassified,
    plot_per_class,
    plot_throughput,
    require_matplotlib,
)
from mnistflow.reporting.run import SplitPredictions, predict_split

__all__ = ["COMPARE_SIZE", "HTML_FILE", "PLOT_SIZES", "SplitPredictions", "build_report", "predict_split",
           "report"]


REPORT_FILES = frozenset([HTML_FILE, *PLOT_SIZES, "compare.png"])


def _holds(folder: Path) -> str | None:
    """What stands in the way of writing a report into ``folder``: None if it is missing or
    empty, else 'report' (only a report's files) or 'files'; a non-folder is refused."""
    if not os.path.isdir(folder):
        if os.path.lexists(folder):
            why = "a file" if folder.is_file() else "not a folder"
            raise MnistflowError(f"is {why}; a report is a folder (index.html and PNGs)", folder)
        return None
    try:
        with os.scandir(folder) as it:
            names = [e.name for _, e in zip(range(len(REPORT_FILES) + 1), it)]
    except OSError as e:
        raise os_error(e, folder) from None
    if not names:
        return None
    return "report" if set(names) <= REPORT_FILES and _is_our_page(folder / HTML_FILE) else "files"


def _is_our_page(html: Path) -> bool:
    """A page ``render_html`` wrote (its head, read without following a link or blocking)."""
    try:
        fd = os.open(html, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        try:
            return stat.S_ISREG(os.fstat(fd).st_mode) and b"<title>mnistflow report: " in f.read(1024)
        except OSError:
            return False


def _check_out(folder: Path, force: bool) -> str | None:
    """``_holds(folder)``, refused when it is not None unless ``force``."""
    held = _holds(folder)
    if held and not force:
        raise MnistflowError("holds an earlier report; --force replaces it" if held == "report" else
                             "is not empty; --force writes the report into it (replacing index.html "
                             "and the PNGs of the same names)", folder)
    return held


def _publish(folder: Path, files: dict[str, bytes], named: bool, force: bool) -> None:
    """Write ``files`` into a temporary sibling of ``folder``, then move them into place: the
    whole folder at once when there is none (or an empty one), else file by file, the page last
    (and an earlier report's PNGs that this one lacks removed). Nothing is left of a failure."""
    from mnistflow.core.fsutil import file_mode, fsync_dir, make_dirs, remove_empty, sweep_stale, temp_name

    held = _check_out(folder, force) if named else _holds(folder)
    real = Path(os.path.realpath(folder))  # a symlinked folder: its files move in its own file system
    for name in files if held else ():  # refused before anything moves: all files or none
        if (real / name).is_dir() and not (real / name).is_symlink():
            raise MnistflowError("is a directory, not a file; not replaced", folder / name)
    created = make_dirs(real.parent)
    sweep_stale(real.parent, real.name)  # what a killed report (or another writer) left here
    tmp = temp_name(real)
    try:
        os.mkdir(tmp)
        try:
            for name, data in files.items():
                fd = os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                             file_mode())
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            if held is None:
                try:
                    os.rename(tmp, real)  # replaces an empty folder
                    fsync_dir(real.parent)
                    return
                except OSError:  # a folder that filled meanwhile: checked again
                    held = _check_out(real, force) if named else _holds(real)
                    if held is None:
                        raise
            for name in sorted(files, key=lambda n: n == HTML_FILE):
                os.replace(tmp / name, real / name)
            if held == "report":
                for name in REPORT_FILES - set(files):
                    if (real / name).is_file():
                        (real / name).unlink()
            fsync_dir(real)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        remove_empty(created)
        raise os_error(e, folder) from None
    except BaseException:
        remove_empty(created)
        raise


def build_report(run_dir: str | Path, out: str | Path | None = None, compare: Iterable[str | Path] = (), *,
                 data: str | Path | None = None, device: str = "auto",
                 threads: int | None = None, force: bool = False) -> tuple[Path, list[Path]]:
    """Write the PNGs and the HTML page; returns (the page, the PNGs). ``out``: see the
    module's docstring (``force`` writes into an ``out`` that is not empty)."""
    compare = list(compare)
    if len(compare) > limits.MAX_COMPARE_RUNS:  # each is held at once (its curves thinned: load_run)
        raise MnistflowError(f"--compare takes at most {limits.MAX_COMPARE_RUNS} runs, got {len(compare)}")
    run = load_run(run_dir)
    folder = Path(out) if out is not None else RunDir(run.path).report
    if out is not None:
        _check_out(folder, force)  # before the model runs; again before the files move in
    else:
        _holds(folder)
    compared = [load_run(c) for c in compare]
    mpl = require_matplotlib()  # fail on a missing matplotlib before the model runs
    # each PNG drawn when its turn comes (``res``, the predictions, is made first, below)
    plots = {"loss.png": lambda: plot_curve(run, "loss"), "accuracy.png": lambda: plot_curve(run, "acc"),
             "lr.png": lambda: plot_lr(run), "throughput.png": lambda: plot_throughput(run),
             "confusion.png": lambda: plot_confusion(res), "misclassified.png": lambda: plot_misclassified(res),
             "per_class.png": lambda: plot_per_class(res), "layers.png": lambda: plot_layers(res)}
    if compared:
        plots["compare.png"] = lambda: plot_compare([run, *compared])
    with stages(["predictions", *plots], "report") as stage:  # a bar on a terminal
        stage("predictions")
        res = predict_split(run_dir, data=data, device=device, threads=threads)
        pngs = {}
        with mpl.rc_context({"font.size": 10, "axes.spines.top": False, "axes.spines.right": False}):
            for name, plot in plots.items():
                stage(name)
                pngs[name] = plot()
    page = render_html(run, res, pngs, compared).encode()
    _publish(folder, {**pngs, HTML_FILE: page}, out is not None, force)
    return folder / HTML_FILE, [folder / name for name in pngs]


def report(run_dir: str | Path, out: str | Path | None = None, compare: Iterable[str | Path] = (), *,
           data: str | Path | None = None, device: str = "auto", threads: int | None = None,
           force: bool = False) -> Path:
    """Python twin of ``mnistflow report``: plots and an HTML page for a run; returns the page.

    Written into ``RUN_DIR/report/`` unless ``out`` (refused if not empty, unless ``force``);
    ``compare`` adds other runs' curves.
    """
    return build_report(run_dir, out, compare, data=data, device=device, threads=threads, force=force)[0]
