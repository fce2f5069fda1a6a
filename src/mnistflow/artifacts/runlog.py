"""What a run logged, read back: the records of its metrics.jsonl, and the table that sums up
its summary.json (printed at the end of training, shown again by ``mnistflow report``)."""
from __future__ import annotations

import json
from pathlib import Path

from mnistflow.core.errors import os_error
from mnistflow.core.fsutil import open_regular


def describe_views(views: int, mirror: bool) -> str:
    """What ``--tta views`` averages over, for run and eval reports."""
    if mirror:
        more = views - 1
        return f"mean of {views + 1} views: the image, its mirror" + (
            f" and {more} shift{'s' if more > 1 else ''}" if more else "")
    return f"mean of {views + 1} shifted views"


MAX_METRICS_BYTES = 64 << 20  # ~250,000 logged steps (log less often for longer runs)


def read_metrics(path: str | Path, keys: tuple[str, ...] | None = None,
                 max_bytes: int = MAX_METRICS_BYTES) -> list[dict]:
    """The records of a metrics.jsonl, read line by line (a torn last line from a crash, an
    undecodable line or one that is not a JSON object is skipped), only ``keys`` of each kept
    when given. A file that is not a regular one (a FIFO would block) or is larger than
    ``max_bytes`` is refused (``fsutil.open_regular``): memory stays bounded."""
    out, seen = [], 0
    with open_regular(path, max_bytes, "a metrics log") as f:
        try:
            for line in f:
                seen += len(line)
                if seen > max_bytes:  # grew since it was measured: the rest is not read
                    break
                try:
                    rec = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if isinstance(rec, dict):
                    out.append(rec if keys is None else {k: rec[k] for k in keys if k in rec})
        except OSError as e:
            raise os_error(e, path) from None
    return out


def end_of_run_table(s: dict, target: float | None) -> str:
    """The short fixed-width table every run ends with, from its summary."""
    pct = lambda v: "-" if v is None else f"{100 * v:.2f}%"  # noqa: E731
    rows = [("wall time", f"{s['wall_s']:.2f} s")]
    if target is not None:
        ttt = s["time_to_target_s"]
        rows.append((f"time to {100 * target:.2f}%", "not reached" if ttt is None else f"{ttt:.2f} s"))
    rows += [("throughput", f"{s['img_per_s']:,.0f} img/s ({s['train_img_per_s'] or 0:,.0f} img/s "
                            f"in training steps)"),
             ("data wait", pct(s["data_wait_frac"])),
             ("peak memory", f"{s['peak_rss_mb']:,.0f} MB RSS"),
             *([("GPU peak memory", f"{s['gpu_peak_allocated_mb']:,.0f} MB allocated, "
                                    f"{s['gpu_peak_reserved_mb']:,.0f} MB reserved")]
               if "gpu_peak_allocated_mb" in s else []),
             ("val accuracy", pct(s["val_acc"])),
             ("test accuracy", pct(s["test_acc"]) + (f" ({describe_views(s['tta'], s.get('tta_mirror', False))})"
                                                     if s.get("tta") and s["test_acc"] is not None else "")),
             ("run directory", s["run_dir"])]
    w = max(len(k) for k, _ in rows)
    line = "-" * (w + 3 + max(len(v) for _, v in rows))
    return "\n".join([line] + [f"{k:<{w}}   {v}" for k, v in rows] + [line])
