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
"""
from __future__ import annotations

import base64
import io
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mnistflow.core.errors import MnistflowError, display

DPI = 100
# name -> (width, height) in inches; at DPI the PNGs have exactly these sizes x 100 pixels.
FIGSIZES: dict[str, tuple[float, float]] = {
    "loss.png": (9, 4.5),
    "accuracy.png": (9, 4.5),
    "lr.png": (9, 3.5),
    "throughput.png": (9, 5.5),
    "confusion.png": (7.5, 6.5),
    "misclassified.png": (9, 7),
    "per_class.png": (9, 4),
}
COMPARE_FIGSIZE = (11, 8)
PLOT_SIZES = {k: (round(w * DPI), round(h * DPI)) for k, (w, h) in FIGSIZES.items()}
COMPARE_SIZE = (round(COMPARE_FIGSIZE[0] * DPI), round(COMPARE_FIGSIZE[1] * DPI))
GRID = (5, 8)  # rows x columns of the misclassified grid: the 40 most confident mistakes
HTML_FILE = "index.html"
TRAIN_COLOR, VAL_COLOR, TEST_COLOR = "#9bb7d4", "#d9480f", "#2b8a3e"


@dataclass
class RunLog:
    """What a run directory says about itself (no model needed)."""

    path: Path
    train: list[dict]
    val: list[dict]
    test: list[dict]
    summary: dict | None
    config: dict
    config_text: str

    @property
    def name(self) -> str:
        return self.path.resolve().name

    @property
    def steps_per_epoch(self) -> float | None:
        """From any training line: ``epoch`` is ``step / steps_per_epoch``."""
        for r in self.train:
            if r.get("epoch"):
                return r["step"] / r["epoch"]
        return None

    def epochs(self, rows: list[dict]) -> list[float]:
        spe = self.steps_per_epoch or 1.0
        return [r["step"] / spe for r in rows]


@dataclass
class SplitPredictions:
    """Per-image predictions of the model on a split of its records."""

    split: str
    images: np.ndarray  # (N, H, W, C) uint8
    labels: np.ndarray  # (N,)
    probs: np.ndarray  # (N, K)
    class_names: list[str]
    model: str
    dataset: str
    confusion: np.ndarray = field(init=False)

    def __post_init__(self):
        k = len(self.class_names)
        self.confusion = np.bincount(self.labels * k + self.pred, minlength=k * k).reshape(k, k)

    @property
    def pred(self) -> np.ndarray:
        return self.probs.argmax(1)

    @property
    def acc(self) -> float:
        return float((self.pred == self.labels).mean()) if len(self.labels) else float("nan")

    @property
    def per_class_acc(self) -> np.ndarray:
        return np.diag(self.confusion) / np.maximum(self.confusion.sum(1), 1)


def _by_step(rows: list[dict]) -> list[dict]:
    """Sorted by step, the last record of a step winning (a resumed run logs some again)."""
    return sorted({r["step"]: r for r in rows if isinstance(r.get("step"), int)}.values(),
                  key=lambda r: r["step"])


def load_run(run_dir: str | Path) -> RunLog:
    """The metrics, summary and configuration of a run directory."""
    from mnistflow.training.observe.metrics import read_metrics

    p = Path(run_dir)
    if not p.is_dir():
        raise MnistflowError("no such run directory", p)
    mfile = p / "metrics.jsonl"
    if not mfile.is_file():
        raise MnistflowError("no metrics.jsonl in this directory (is it a run directory?)", p)
    recs = [r for r in read_metrics(mfile) if isinstance(r, dict)]
    kinds = {k: _by_step([r for r in recs if r.get("kind") == k]) for k in ("train", "val", "test")}
    summary = None
    if (p / "summary.json").is_file():
        try:
            summary = json.loads((p / "summary.json").read_text())
        except ValueError:
            raise MnistflowError("summary.json is not valid JSON", p / "summary.json") from None
    text, config = "", {}
    if (p / "config.toml").is_file():
        text = (p / "config.toml").read_text()
        try:
            config = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise MnistflowError(f"not valid TOML ({e})", p / "config.toml") from None
    return RunLog(p, kinds["train"], kinds["val"], kinds["test"], summary, config, text)


def predict_split(run_dir: str | Path, *, data: str | Path | None = None, device: str = "auto",
                  batch_size: int = 1000, threads: int | None = None) -> SplitPredictions:
    """The model of ``run_dir`` on the test split (else validation) of its records, per image."""
    from mnistflow.artifacts.model_file import load_any
    from mnistflow.inference import _records_for, predict_arrays
    from mnistflow.runtime.device import pick_device
    from mnistflow.runtime.cpu import set_threads

    set_threads(threads)
    model, info = load_any(run_dir, device=pick_device(device), data=data)
    rec = _records_for(info, data)
    c, h, w = info.in_shape
    if rec.shape != (h, w, c):
        raise MnistflowError(f"records hold {rec.shape} images but the model takes "
                             f"{tuple(info.in_shape)} (C, H, W)", rec.path)
    split = "test" if rec.has("test") else "val"
    x, y = rec.split(split)
    probs = np.concatenate([predict_arrays(model, info, np.array(x[i:i + batch_size]))
                            for i in range(0, len(y), batch_size)] or [np.zeros((0, info.num_classes))])
    return SplitPredictions(split, np.asarray(x), np.asarray(y, dtype=np.int64), probs,
                            info.class_names, info.model, info.dataset or rec.name)


# --- plots -------------------------------------------------------------------------------

def _matplotlib():
    """matplotlib, or a one-line error saying what to install. Figures are made with
    ``matplotlib.figure.Figure`` and saved by the Agg renderer: no display, no pyplot state,
    and the backend of a notebook or script that calls ``report`` is left alone."""
    from mnistflow.artifacts.model_file import import_optional

    return import_optional("matplotlib", "report")


def _figure(size: tuple[float, float]):
    from matplotlib.figure import Figure

    return Figure(figsize=size, dpi=DPI, layout="constrained")


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in metrics.jsonl", ha="center", va="center",
            transform=ax.transAxes, color="0.4")


def _col(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))
           and math.isfinite(r[key])]
    return [s for s, _ in pts], [v for _, v in pts]


def _log_y(ax, values: list[float]) -> None:
    """A log y axis labelled 0.05, 0.1, 0.2 rather than 5x10^-2; 2, 3, 5 x 10^k in between
    when the values span two decades or less."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    if math.log10(max(values) / min(values)) <= 2:
        def minor(v, _):
            lead = v / 10 ** math.floor(math.log10(v) + 1e-9)
            return f"{v:g}" if round(lead) in (2, 3, 5) and abs(lead - round(lead)) < 1e-6 else ""

        ax.yaxis.set_minor_formatter(FuncFormatter(minor))
    else:
        ax.yaxis.set_minor_formatter(NullFormatter())


def _acc_floor(values: list[float]) -> float:
    """A lower y limit that shows where accuracy ends up, not the first minutes at 10%."""
    if not values:
        return 0.0
    lo = float(np.percentile(values, 10))
    return max(0.0, min(lo, min(values[-3:])) - 2.0)


def plot_curve(run: RunLog, key: str) -> bytes:
    """Training (per log interval, noisy) and validation (whole split) ``loss`` or ``acc``."""
    scale = 100.0 if key == "acc" else 1.0
    fig = _figure(FIGSIZES["accuracy.png" if key == "acc" else "loss.png"])
    ax = fig.add_subplot()
    ts, tv = _col(run.train, key)
    vs, vv = _col(run.val, key)
    es, ev = _col(run.test, key)
    if ts:
        ax.plot(ts, [v * scale for v in tv], color=TRAIN_COLOR, lw=1.2, label="training (batches of each log interval)")
    if vs:
        ax.plot(vs, [v * scale for v in vv], "o-", color=VAL_COLOR, lw=2, ms=4, label="validation (whole split)")
    if es:
        ax.plot(es, [v * scale for v in ev], "*", color=TEST_COLOR, ms=12,
                label=f"test: {ev[-1] * scale:.2f}%" if key == "acc" else f"test: {ev[-1]:.4f}")
    if not (ts or vs or es):
        _no_data(ax, key)
    ax.set_xlabel("step")
    if key == "acc":
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(_acc_floor([v * scale for v in tv + vv + ev]), 100.5)
        ax.set_title("Accuracy")
    else:
        ax.set_ylabel("cross-entropy loss")
        if all(v > 0 for v in tv + vv + ev) and len(tv + vv + ev) > 1:
            _log_y(ax, tv + vv + ev)
        ax.set_title("Loss")
    ax.grid(alpha=0.3, which="both")
    if ts or vs or es:
        ax.legend(loc="best")
    return _png(fig)


def plot_lr(run: RunLog) -> bytes:
    fig = _figure(FIGSIZES["lr.png"])
    ax = fig.add_subplot()
    s, v = _col(run.train, "lr")
    if s:
        ax.plot(s, v, color="#5f3dc4", lw=2)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    else:
        _no_data(ax, "learning rate")
    sched = run.config.get("schedule")
    ax.set_title("Learning rate" + (f" ({sched} schedule)" if sched else ""))
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    return _png(fig)


def plot_throughput(run: RunLog) -> bytes:
    fig = _figure(FIGSIZES["throughput.png"])
    top, bottom = fig.subplots(2, 1, sharex=True)
    s, v = _col(run.train, "img_per_s")
    if s:
        top.plot(s, v, color="#1971c2", lw=1.5, label="per log interval")
        avg = (run.summary or {}).get("img_per_s")
        if avg:
            top.axhline(avg, color="0.3", ls="--", lw=1, label=f"whole run: {avg:,.0f} img/s")
        top.legend(loc="lower right")
        top.set_ylim(bottom=0)
    else:
        _no_data(top, "throughput")
    top.set_ylabel("images / s")
    top.set_title("Throughput (intervals with an evaluation include its time)")
    top.grid(alpha=0.3)
    s, v = _col(run.train, "data_wait_frac")
    if s:
        bottom.plot(s, [100 * x for x in v], color="#e8590c", lw=1.5)
        bottom.axhline(10, color="0.5", ls=":", lw=1, label="10%: the input pipeline is starving the model")
        bottom.legend(loc="upper right")
        bottom.set_ylim(0, max(15.0, 100 * max(v) * 1.15))
    else:
        _no_data(bottom, "data wait")
    bottom.set_ylabel("waiting for data (%)")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    return _png(fig)


def plot_confusion(res: SplitPredictions) -> bytes:
    from matplotlib.colors import LogNorm

    cm = res.confusion
    k = len(res.class_names)
    fig = _figure(FIGSIZES["confusion.png"])
    ax = fig.add_subplot()
    shown = np.ma.masked_equal(cm, 0)
    im = ax.imshow(shown, cmap="Blues", norm=LogNorm(vmin=1, vmax=max(int(cm.max()), 2)))
    fig.colorbar(im, ax=ax, shrink=0.8, label="images (log scale)")
    names = [n[:12] for n in res.class_names]
    ax.set_xticks(range(k), names, rotation=45 if max(map(len, names)) > 2 else 0, ha="right"
                  if max(map(len, names)) > 2 else "center")
    ax.set_yticks(range(k), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(f"Confusion matrix: {res.model} on {res.split} ({len(res.labels):,} images, "
                 f"{100 * res.acc:.2f}% correct)")
    if k <= 20:
        thresh = math.sqrt(max(int(cm.max()), 1))  # the middle of the log colour scale
        for i in range(k):
            for j in range(k):
                if cm[i, j]:
                    ax.text(j, i, str(cm[i, j]), ha="center", va="center", fontsize=8 if k <= 10 else 6,
                            color="white" if cm[i, j] > thresh else ("#c92a2a" if i != j else "black"))
    return _png(fig)


def plot_misclassified(res: SplitPredictions) -> bytes:
    """The most confident mistakes: image, true -> predicted label, the model's confidence."""
    rows, cols = GRID
    pred = res.pred
    conf = res.probs.max(1) if len(res.probs) else np.zeros(0)
    wrong = np.flatnonzero(pred != res.labels)
    order = wrong[np.argsort(-conf[wrong], kind="stable")][: rows * cols]
    fig = _figure(FIGSIZES["misclassified.png"])
    shown = ("" if not len(order) else "; all of them" if len(order) == len(wrong)
             else f"; the {len(order)} most confident")
    fig.suptitle(f"{len(wrong):,} of {len(res.labels):,} {res.split} images misclassified{shown} "
                 "(true \u2192 predicted, confidence)" if len(order) else
                 f"{len(wrong):,} of {len(res.labels):,} {res.split} images misclassified", fontsize=11)
    axes = fig.subplots(rows, cols)
    names = res.class_names
    short = max(map(len, names)) <= 3
    for n, ax in enumerate(axes.flat):
        ax.set_axis_off()
        if n >= len(order):
            continue
        i = order[n]
        img = res.images[i]
        if img.shape[-1] == 1:
            ax.imshow(img[..., 0], cmap="gray_r", vmin=0, vmax=255, interpolation="nearest")
        else:
            ax.imshow(img, interpolation="nearest")
        true, said = names[res.labels[i]][:12], names[pred[i]][:12]
        title = (f"{true} \u2192 {said}\n{100 * conf[i]:.0f}%" if short else
                 f"{true}\n\u2192 {said} {100 * conf[i]:.0f}%")
        ax.set_title(title, fontsize=8, color="#c92a2a" if conf[i] >= 0.9 else "black")
    if not len(order):
        fig.text(0.5, 0.5, "no mistakes on this split", ha="center", va="center", fontsize=14)
    return _png(fig)


def plot_per_class(res: SplitPredictions) -> bytes:
    fig = _figure(FIGSIZES["per_class.png"])
    ax = fig.add_subplot()
    acc = 100 * res.per_class_acc
    k = len(acc)
    names = [n[:12] for n in res.class_names]
    bars = ax.bar(range(k), acc, color=["#c92a2a" if a == acc.min() else "#1971c2" for a in acc])
    ax.axhline(100 * res.acc, color="0.3", ls="--", lw=1)
    if k <= 20:
        ax.bar_label(bars, [f"{a:.1f}" for a in acc], fontsize=8, padding=2)
    ax.set_xticks(range(k), names, rotation=45 if max(map(len, names)) > 2 else 0)
    lo = float(acc.min()) if k else 0.0
    ax.set_ylim(max(0.0, lo - max(3.0, (100 - lo) * 0.3)), 100.8)
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"Accuracy per class on {res.split} (dashed: all classes, {100 * res.acc:.2f}%)")
    ax.grid(alpha=0.3, axis="y")
    return _png(fig)


def plot_compare(runs: list[RunLog]) -> bytes:
    """Several runs' curves on one page, against epochs (runs differ in batch size)."""
    import matplotlib as mpl

    fig = _figure(COMPARE_FIGSIZE)
    axes = fig.subplots(2, 2, sharex=True)
    panels = [(axes[0, 0], "train", "loss", "training loss"), (axes[0, 1], "val", "loss", "validation loss"),
              (axes[1, 0], "train", "acc", "training accuracy (%)"),
              (axes[1, 1], "val", "acc", "validation accuracy (%)")]
    colors = mpl.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, kind, key, title in panels:
        ys_all: list[float] = []
        for n, run in enumerate(runs):
            rows = getattr(run, kind)
            pts = [r for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
            if not pts:
                continue
            ys = [r[key] * (100 if key == "acc" else 1) for r in pts]
            ys_all += ys
            model = run.config.get("model") or (run.summary or {}).get("model", "")
            ax.plot(run.epochs(pts), ys, "o-" if kind == "val" or len(pts) <= 10 else "-", ms=3, lw=1.5,
                    color=colors[n % len(colors)], label=f"{run.name} ({model})" if model else run.name)
        if key == "loss" and len(ys_all) > 1 and min(ys_all) > 0:
            _log_y(ax, ys_all)
        if key == "acc":
            ax.set_ylim(_acc_floor(ys_all), 100.5)
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
    for ax in axes[1]:
        ax.set_xlabel("epoch")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if not handles:
        handles, labels = axes[0, 1].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3))
    fig.suptitle("Runs compared (against epochs: the runs may use different batch sizes)")
    return _png(fig)


# --- the page ----------------------------------------------------------------------------

CAPTIONS = {
    "loss.png": "Loss against steps. Training loss is the mean over the batches of each log "
                "interval, so it is noisy; validation loss is measured on the whole held-out split.",
    "accuracy.png": "Accuracy against steps: training (noisy, on the batches) and validation "
                    "(smooth, on the held-out split); the star is the final test accuracy.",
    "lr.png": "The learning rate, a pure function of the step.",
    "throughput.png": "Images per second and the fraction of each interval spent waiting for the "
                      "next batch. Above 10% the input pipeline, not the model, sets the pace.",
    "confusion.png": "Rows are the true class, columns the predicted one; off-diagonal cells are "
                     "the mistakes (the colour scale is logarithmic so that single mistakes show).",
    "misclassified.png": "The model's most confident mistakes on the test set. Many are digits a "
                         "person would hesitate on too; confident mistakes on clear images are worth a look.",
    "per_class.png": "Accuracy of each class on the test set; the weakest is in red.",
    "compare.png": "Several runs' curves against epochs.",
}
TITLES = {"loss.png": "Loss", "accuracy.png": "Accuracy", "lr.png": "Learning rate",
          "throughput.png": "Throughput and data wait", "confusion.png": "Confusion matrix",
          "misclassified.png": "Mistakes", "per_class.png": "Accuracy per class",
          "compare.png": "Compared with other runs"}

CSS = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:980px;
padding:1rem 1.5rem 3rem;color:#212529;background:#fff}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #dee2e6}
.sub{color:#6c757d;margin-top:0}.cards{display:flex;gap:.8rem;flex-wrap:wrap;margin:1rem 0}
.card{border:1px solid #dee2e6;border-radius:6px;padding:.5rem .9rem;min-width:8rem}
.card b{display:block;font-size:1.3rem}.card span{color:#6c757d;font-size:.85rem}
figure{margin:1rem 0}figure img{max-width:100%;height:auto;border:1px solid #f1f3f5}
figcaption{color:#495057;font-size:.9rem}pre{background:#f8f9fa;padding:.7rem;overflow-x:auto}
table{border-collapse:collapse;font-size:.9rem}td,th{padding:.2rem .7rem;border-bottom:1px solid #e9ecef;
text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}
"""


def _pct(v) -> str:
    return "-" if not isinstance(v, (int, float)) else f"{100 * v:.2f}%"


def _compare_table(runs: list[RunLog]) -> str:
    from html import escape

    head = ("<tr><th>run</th><th>model</th><th>steps</th><th>epochs</th><th>wall</th><th>img/s</th>"
            "<th>val acc</th><th>test acc</th></tr>")
    rows = []
    for r in runs:
        s = r.summary or {}
        num = lambda v, f: "-" if not isinstance(v, (int, float)) else format(v, f)  # noqa: E731
        rows.append(f"<tr><td>{escape(r.name)}</td><td>{escape(str(r.config.get('model') or s.get('model', '')))}</td>"
                    f"<td class=n>{num(s.get('steps'), ',')}</td><td class=n>{num(s.get('epochs'), 'g')}</td>"
                    f"<td class=n>{num(s.get('wall_s'), '.2f')} s</td><td class=n>{num(s.get('img_per_s'), ',.0f')}</td>"
                    f"<td class=n>{_pct(s.get('val_acc'))}</td><td class=n>{_pct(s.get('test_acc'))}</td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def render_html(run: RunLog, res: SplitPredictions, pngs: dict[str, bytes], compared: list[RunLog]) -> str:
    """One self-contained page: the PNGs as data URIs, the end-of-run table, the configuration."""
    from html import escape

    from mnistflow import __version__
    from mnistflow.training.loop import end_of_run_table

    s = run.summary or {}
    target = run.config.get("target_acc")
    cards = [("test accuracy", _pct(s.get("test_acc", res.acc if res.split == "test" else None))),
             ("validation accuracy", _pct(s.get("val_acc"))),
             ("wall time", f"{s['wall_s']:.2f} s" if isinstance(s.get("wall_s"), (int, float)) else "-"),
             ("throughput", f"{s['img_per_s']:,.0f} img/s" if isinstance(s.get("img_per_s"), (int, float)) else "-"),
             ("data wait", _pct(s.get("data_wait_frac"))),
             ("mistakes", f"{int((res.pred != res.labels).sum()):,} / {len(res.labels):,}")]
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>mnistflow report: {escape(run.name)}</title><style>{CSS}</style></head><body>",
        f"<h1>{escape(run.name)}</h1>",
        f'<p class="sub">{escape(res.model)} on {escape(res.dataset)} &middot; '
        f"{escape(str(s.get('device', '')))} {escape(str(s.get('precision', '')))} &middot; "
        f"{escape(str(s.get('steps', len(run.train) and run.train[-1]['step'])))} steps &middot; mnistflow {__version__}</p>",
        '<div class="cards">' + "".join(f"<div class=card><b>{escape(v)}</b><span>{escape(k)}</span></div>"
                                        for k, v in cards) + "</div>",
    ]
    if s:
        parts.append(f"<h2>End of run</h2><pre>{escape(end_of_run_table(s, target))}</pre>")
    else:
        parts.append("<h2>End of run</h2><p>This run has no summary.json: it did not finish "
                     "(the model is its newest checkpoint).</p>")
    for name, png in pngs.items():
        uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        parts.append(f'<h2 id="{name[:-4]}">{escape(TITLES.get(name, name))}</h2><figure>'
                     f'<img src="{uri}" alt="{escape(TITLES.get(name, name))}">'
                     f"<figcaption>{escape(CAPTIONS.get(name, ''))}</figcaption></figure>")
        if name == "compare.png":
            parts.append(_compare_table([run, *compared]))
    if run.config_text:
        rows = "".join(f"<tr><td>{escape(k)}</td><td>{escape(json.dumps(v))}</td></tr>"
                       for k, v in run.config.items() if k != "version")
        parts.append("<h2>Configuration</h2><p>From config.toml: <code>mnistflow train --config "
                     f"{escape(display(run.path / 'config.toml'))}</code> runs it again.</p><table>{rows}</table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def build_report(run_dir: str | Path, out: str | Path | None = None, compare=(), *,
                 data: str | Path | None = None, device: str = "auto",
                 threads: int | None = None) -> tuple[Path, list[Path]]:
    """Write the PNGs and the HTML page; returns (the page, the PNGs)."""
    from mnistflow.core.fsutil import atomic_write_bytes, atomic_write_text

    run = load_run(run_dir)
    compared = [load_run(c) for c in compare]
    mpl = _matplotlib()  # fail on a missing matplotlib before the model runs
    res = predict_split(run_dir, data=data, device=device, threads=threads)
    with mpl.rc_context({"font.size": 10, "axes.spines.top": False, "axes.spines.right": False}):
        pngs = {"loss.png": plot_curve(run, "loss"), "accuracy.png": plot_curve(run, "acc"),
                "lr.png": plot_lr(run), "throughput.png": plot_throughput(run),
                "confusion.png": plot_confusion(res), "misclassified.png": plot_misclassified(res),
                "per_class.png": plot_per_class(res)}
        if compared:
            pngs["compare.png"] = plot_compare([run, *compared])
    folder = Path(out) if out is not None else run.path / "report"
    written = []
    for name, png in pngs.items():
        atomic_write_bytes(folder / name, png)
        written.append(folder / name)
    html = folder / HTML_FILE
    atomic_write_text(html, render_html(run, res, pngs, compared))
    return html, written


def report(run_dir: str | Path, out: str | Path | None = None, compare=(), *,
           data: str | Path | None = None, device: str = "auto", threads: int | None = None) -> Path:
    """Python twin of ``mnistflow report``: plots and an HTML page for a run; returns the page.

    Written into ``RUN_DIR/report/`` unless ``out``; ``compare`` adds other runs' curves.
    """
    return build_report(run_dir, out, compare, data=data, device=device, threads=threads)[0]
