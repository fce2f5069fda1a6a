"""The report's figures: one function per PNG, each returning the PNG's bytes.

matplotlib is optional (``pip install 'mnistflow[report]'``) and imported only here; figures
are made with ``matplotlib.figure.Figure`` and saved by the Agg renderer: no display, no
pyplot state, and the backend of a notebook or script that calls ``report`` is left alone.
"""
from __future__ import annotations

import io
import math
from types import ModuleType

import numpy as np

from mnistflow.artifacts.runlog import RunLog, is_number
from mnistflow.core.errors import MnistflowError
from mnistflow.reporting.run import SplitPredictions

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
    "layers.png": (9, 11),
}
COMPARE_FIGSIZE = (11, 8)
PLOT_SIZES = {k: (round(w * DPI), round(h * DPI)) for k, (w, h) in FIGSIZES.items()}
COMPARE_SIZE = (round(COMPARE_FIGSIZE[0] * DPI), round(COMPARE_FIGSIZE[1] * DPI))
LAYER_ROWS = 8  # feature rows of layers.png (besides the input and the probabilities)
LAYER_TILES = 16  # channels shown per layer and image: the most active
GRID = (5, 8)  # rows x columns of the misclassified grid: the 40 most confident mistakes
TRAIN_COLOR, VAL_COLOR, TEST_COLOR = "#9bb7d4", "#d9480f", "#2b8a3e"


def require_matplotlib() -> ModuleType:
    """matplotlib, or a one-line error saying what to install. Figures are made with
    ``matplotlib.figure.Figure`` and saved by the Agg renderer: no display, no pyplot state,
    and the backend of a notebook or script that calls ``report`` is left alone."""
    from mnistflow.core.errors import import_optional

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
    pts = [(r["step"], r[key]) for r in rows if is_number(r.get(key))]
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
            pts = [r for r in rows if is_number(r.get(key))]
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


def layer_examples(res: SplitPredictions, k: int = 4) -> list[int]:
    """Which images layers.png follows: the two most confident mistakes, then right ones (the
    most and the least confident), ``k`` in all."""
    conf = res.probs.max(1) if len(res.probs) else np.zeros(0)
    wrong = np.flatnonzero(res.pred != res.labels)
    right = np.flatnonzero(res.pred == res.labels)
    right = right[np.argsort(-conf[right], kind="stable")]
    picks = list(wrong[np.argsort(-conf[wrong], kind="stable")][:2])
    for i in (right[:1], right[-1:], right[1:k]):
        picks += [int(j) for j in i if j not in picks]
    return [int(i) for i in picks[:k]]


def stage_outputs(found: list, rows: int = LAYER_ROWS) -> list:
    """The layers worth a row: the last of each run of same-shaped layers (a block's output,
    after its normalization and activation), at most ``rows`` of them, evenly spread."""
    kept = [layer for n, layer in enumerate(found)
            if n + 1 == len(found) or found[n + 1].shape != layer.shape]
    if len(kept) > rows:
        kept = [kept[round(i * (len(kept) - 1) / (rows - 1))] for i in range(rows)]
    return kept


def _mosaic(values: np.ndarray, tiles: int = LAYER_TILES) -> np.ndarray:
    """A layer's output as one 2-D picture: C x H x W -> its ``tiles`` most active channels in a
    grid, NaN between them; a vector -> its units in rows of 16 (NaN pads)."""
    if values.ndim == 3 and values.shape[1] * values.shape[2] > 1:
        act = np.abs(values).mean((1, 2))
        chosen = values[np.sort(np.argsort(-act, kind="stable")[:tiles])]
        cols = math.ceil(math.sqrt(len(chosen)))
        rows = math.ceil(len(chosen) / cols)
        h, w = chosen.shape[1:]
        out = np.full((rows * (h + 1) - 1, cols * (w + 1) - 1), np.nan, np.float32)
        for n, tile in enumerate(chosen):
            r, c = divmod(n, cols)
            out[r * (h + 1): r * (h + 1) + h, c * (w + 1): c * (w + 1) + w] = tile
        return out
    flat = values.ravel()[:1024]
    cols = 16 if len(flat) > 16 else len(flat)
    out = np.full(math.ceil(len(flat) / cols) * cols, np.nan, np.float32)
    out[: len(flat)] = flat
    return out.reshape(-1, cols)


def plot_layers(res: SplitPredictions) -> bytes:
    """A few test images through the model, layer by layer (``artifacts.layers``): a column per
    image (mistakes first), a row per stage of the network, the probabilities at the bottom."""
    import matplotlib as mpl

    from mnistflow.artifacts.layers import layers

    fig = _figure(FIGSIZES["layers.png"])
    picks = layer_examples(res)
    try:
        seen = [layers(res.predictor, res.predictor.info, res.images[i]) for i in picks]
    except MnistflowError as e:  # an ONNX model: no layers to hook
        _no_data(fig.add_subplot(), f"no layers to show: {e}")
        return _png(fig)
    if not picks:
        _no_data(fig.add_subplot(), "no images in this split")
        return _png(fig)
    names = [layer.name for layer in stage_outputs(seen[0][:-1])]
    grid = fig.subplots(len(names) + 2, len(picks), squeeze=False,
                        gridspec_kw={"height_ratios": [1.2] * (len(names) + 1) + [1]})
    for col, (i, found) in enumerate(zip(picks, seen)):
        by_name = {layer.name: layer for layer in found}
        true, said = res.class_names[res.labels[i]][:12], res.class_names[res.pred[i]][:12]
        img = res.images[i]
        grid[0, col].imshow(img[..., 0] if img.shape[-1] == 1 else img, cmap="gray_r", interpolation="nearest")
        grid[0, col].set_title(f"{true} \u2192 {said} ({100 * res.probs[i].max():.0f}%)", fontsize=9,
                               color="#c92a2a" if true != said else "black")
        for row, name in enumerate(names, 1):
            v = by_name[name].values
            signed = float(v.min()) < 0
            top = float(np.abs(v).max()) or 1.0
            cmap = mpl.colormaps["RdBu_r" if signed else "magma"].with_extremes(bad="white")
            grid[row, col].imshow(_mosaic(v), cmap=cmap, vmin=-top if signed else 0, vmax=top,
                                  interpolation="nearest", aspect="auto")
        p = grid[-1, col]
        p.bar(range(len(res.probs[i])), res.probs[i],
              color=["#2b8a3e" if k == res.labels[i] else "#c92a2a" if k == res.pred[i] else "#adb5bd"
                     for k in range(len(res.probs[i]))])
        p.set_ylim(0, 1)
        p.set_xticks([])
    for row, name in enumerate(["input", *names, "probabilities"]):
        layer = next((x for x in seen[0] if x.name == name), None)
        label = name if layer is None or name == "probabilities" else f"{name}\n{layer.kind} {'x'.join(map(str, layer.shape))}"
        grid[row, 0].set_ylabel(label, fontsize=7, rotation=0, ha="right", va="center")
        for ax in grid[row]:
            ax.set_xticks([])
            ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_visible(row == len(names) + 1)
    fig.suptitle(f"{len(picks)} {res.split} images through the network: the most active channels of each stage", fontsize=11)
    return _png(fig)
