"""The training record on a terminal of 80 columns, as a user sees it (issue 38): a pseudo-terminal
runs ``mnistflow train``; a row per epoch stays (with the validation pass and data wait), the
live bar with its ETA shows while it runs and is gone at the end, and no line passes 80
columns."""
from __future__ import annotations

import re

from helpers.terminal import run_in_pty, screen, segments

ROW = re.compile(r"^\s+(\d+\.\d\d)\s+(\d+)\s+(\d+\.\d{4})\s+(\d+\.\d\d)%\s+(\d+\.\d{4})\s+(\d+\.\d\d)%"
                 r"\s+([\d,]+)\s+(\d+\.\d)%$")


def test_a_row_per_epoch_stays_the_bar_goes_and_nothing_passes_80_columns(mnist_records, tmp_path):
    # 2 epochs of 110 steps; log every 25 steps, so that several logged steps pass inside an epoch
    code, raw = run_in_pty(["train", "--model", "softmax", "--data", str(mnist_records), "--epochs", "2",
                            "--batch-size", "500", "--log-every", "25", "--threads", "1",
                            "--run-dir", "run"], cwd=tmp_path)  # (a path is never cut: a short one)
    assert code == 0, raw[-3000:]
    too_long = [s for s in segments(raw) if len(s) > 80]
    assert not too_long, too_long
    shown = [ln for ln in screen(raw) if ln]
    assert all(len(ln) <= 80 for ln in shown)
    head = next(i for i, ln in enumerate(shown) if ln.split()[:2] == ["epoch", "step"])
    assert shown[head].split()[-2:] == ["data", "wait"]
    rows = [ROW.match(ln) for ln in shown[head + 1:head + 3]]
    assert all(rows), shown[head:head + 4]
    # the epochs' ends, each with its validation pass; nothing of the steps in between stays
    assert [(r.group(1), r.group(2)) for r in rows] == [("1.00", "110"), ("2.00", "220")]
    assert shown[head + 3].startswith("test  step    220  loss ")
    assert "wall time" in "\n".join(shown[head + 4:])
    assert not any("train:" in ln for ln in shown)  # the bar is gone
    # ... but it showed while the run went on: the count and an ETA
    assert re.search(r"train: +\d+%\|.*\| *\d+/220 \[\d\d:\d\d<\d\d:\d\d", raw), raw[-3000:]
    # the headline: three lines within 80 columns
    i = next(i for i, ln in enumerate(shown) if ln.startswith("training softmax on mnist train"))
    assert shown[i + 1].startswith("cpu fp32, 1 thread, batch 500 x 220 steps (2.00 epochs)")
    assert shown[i + 2].startswith("run directory ")
