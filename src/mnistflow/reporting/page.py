"""The report's page: one self-contained HTML file (every PNG inline as a ``data:`` URI, no
scripts, no external assets), with the end-of-run table and the run's configuration."""
from __future__ import annotations

import base64
import json
from html import escape

from mnistflow.artifacts.rundir import RunDir
from mnistflow.artifacts.runlog import RunLog, end_of_run_table, table_missing
from mnistflow.core.errors import display
from mnistflow.reporting.run import SplitPredictions

HTML_FILE = "index.html"

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
    "layers.png": "What the network sees: each column follows one test image (mistakes first, in red) "
                  "through the network. Each row is the output of a stage, its most active channels "
                  "as small pictures (dark: zero, bright: strong; red/blue for signed values), fully "
                  "connected units in rows of 16; the bars are the probabilities (green: the true class, "
                  "red: a wrong answer). 'mnistflow serve RUN' shows every layer of a picture you draw.",
}
TITLES = {"loss.png": "Loss", "accuracy.png": "Accuracy", "lr.png": "Learning rate",
          "throughput.png": "Throughput and data wait", "confusion.png": "Confusion matrix",
          "misclassified.png": "Mistakes", "per_class.png": "Accuracy per class",
          "compare.png": "Compared with other runs", "layers.png": "Layer by layer"}

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
    from mnistflow import __version__

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
    missing = table_missing(s, target) if s else []
    if s and not missing:
        parts.append(f"<h2>End of run</h2><pre>{escape(end_of_run_table(s, target))}</pre>")
    elif s:
        parts.append("<h2>End of run</h2><p>summary.json lacks what the end-of-run table shows "
                     f"({escape(', '.join(missing))}).</p>")
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
        rows = "".join(f"<tr><td>{escape(k)}</td><td>{escape(json.dumps(v, default=str))}</td></tr>"
                       for k, v in run.config.items() if k != "version")
        parts.append("<h2>Configuration</h2><p>From config.toml: <code>mnistflow train --config "
                     f"{escape(display(RunDir(run.path).config))}</code> runs it again.</p><table>{rows}</table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
