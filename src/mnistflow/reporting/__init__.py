"""``mnistflow report``: a run's curves, mistakes and numbers as PNGs and one HTML page.

    mnistflow report runs/seed-cnn-20261121-120000          # -> RUN/report/index.html + PNGs
    mnistflow report runs/seed-cnn --compare runs/softmax runs/fast --out cmp/

    import mnistflow
    html = mnistflow.report("runs/seed-cnn", compare=["runs/softmax"])

The curves come from the run's ``metrics.jsonl`` (training loss/accuracy on the batches of
each log interval, noisy; validation on the whole split, smooth), the mistakes from the
trained model run once over the test split of its records. The HTML page embeds every PNG
as a ``data:`` URI, so it is one file with no external assets that can be mailed or
attached to an issue. matplotlib is optional (``pip install 'mnistflow[report]'``) and
imported only here; the PNGs are drawn by its Agg renderer (no display needed).

    run.py    what a report is drawn from: the run's files, the model on its test split
    plots.py  one function per PNG
    page.py   the self-contained HTML page
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from mnistflow.artifacts.rundir import RunDir
from mnistflow.core.progress import stages
from mnistflow.reporting.page import HTML_FILE, render_html
from mnistflow.reporting.plots import (
    COMPARE_SIZE,
    PLOT_SIZES,
    plot_compare,
    plot_confusion,
    plot_curve,
    plot_lr,
    plot_misclassified,
    plot_per_class,
    plot_throughput,
    require_matplotlib,
)
from mnistflow.reporting.run import RunLog, SplitPredictions, load_run, predict_split

__all__ = ["COMPARE_SIZE", "HTML_FILE", "PLOT_SIZES", "RunLog", "SplitPredictions", "build_report",
           "load_run", "predict_split", "report"]


def build_report(run_dir: str | Path, out: str | Path | None = None, compare: Iterable[str | Path] = (), *,
                 data: str | Path | None = None, device: str = "auto",
                 threads: int | None = None) -> tuple[Path, list[Path]]:
    """Write the PNGs and the HTML page; returns (the page, the PNGs)."""
    from mnistflow.core.fsutil import atomic_write_bytes, atomic_write_text

    run = load_run(run_dir)
    compared = [load_run(c) for c in compare]
    mpl = require_matplotlib()  # fail on a missing matplotlib before the model runs
    # each PNG drawn when its turn comes (``res``, the predictions, is made first, below)
    plots = {"loss.png": lambda: plot_curve(run, "loss"), "accuracy.png": lambda: plot_curve(run, "acc"),
             "lr.png": lambda: plot_lr(run), "throughput.png": lambda: plot_throughput(run),
             "confusion.png": lambda: plot_confusion(res), "misclassified.png": lambda: plot_misclassified(res),
             "per_class.png": lambda: plot_per_class(res)}
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
    folder = Path(out) if out is not None else RunDir(run.path).report
    written = []
    for name, png in pngs.items():
        atomic_write_bytes(folder / name, png)
        written.append(folder / name)
    html = folder / HTML_FILE
    atomic_write_text(html, render_html(run, res, pngs, compared))
    return html, written


def report(run_dir: str | Path, out: str | Path | None = None, compare: Iterable[str | Path] = (), *,
           data: str | Path | None = None, device: str = "auto", threads: int | None = None) -> Path:
    """Python twin of ``mnistflow report``: plots and an HTML page for a run; returns the page.

    Written into ``RUN_DIR/report/`` unless ``out``; ``compare`` adds other runs' curves.
    """
    return build_report(run_dir, out, compare, data=data, device=device, threads=threads)[0]
