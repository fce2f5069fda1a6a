"""What a run logged, read back: the records of its metrics.jsonl, its summary.json (read
with a cap and type-checked: ``read_summary``, the one reader that ``report`` and ``eval`` use),
and the table that sums it up (printed at the end of training, shown again by ``mnistflow report``).

Every run file is read with a cap (``MAX_METRICS_BYTES``, ``MAX_SMALL_BYTES``): memory stays
bounded whatever a directory holds, and a file that is not a regular one (a FIFO would block
the read) is refused.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from mnistflow.core.errors import MnistflowError, os_error
from mnistflow.core.fsutil import open_regular, read_regular

MAX_SMALL_BYTES = 4 << 20  # summary.json, config.toml: a few KiB when a training writes them
# summary.json fields shown as numbers (each may be null, or missing: then not shown)
SUMMARY_NUMBERS = ("wall_s", "time_to_target_s", "epochs", "steps", "img_per_s", "train_s", "train_img_per_s",
                   "data_wait_frac", "peak_rss_mb", "val_acc", "test_acc", "tta", "gpu_peak_allocated_mb",
                   "gpu_peak_reserved_mb")


def describe_views(views: int, mirror: bool) -> str:
    """What ``--tta views`` averages over, for run and eval reports."""
    if mirror:
        more = views - 1
        return f"mean of {views + 1} views: the image, its mirror" + (
            f" and {more} shift{'s' if more > 1 else ''}" if more else "")
    return f"mean of {views + 1} shifted views"


def is_number(v: object) -> bool:
    """A finite int or float that fits a float (not a bool, not a 400-digit integer)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def type_name(v: object) -> str:
    """What a JSON/TOML value is, for an error line ("a list", "null", ...)."""
    return "null" if v is None else {dict: "an object", list: "a list", str: "a string",
                                     bool: "a boolean"}.get(type(v), f"{v!r}")


def read_small(path: str | Path) -> str | None:
    """The text of a small run file (summary.json, config.toml), or None if there is none; at
    most ``MAX_SMALL_BYTES`` are read (a 1 GiB sparse file is refused, not loaded), and a
    file that is not regular or not UTF-8 is a ``MnistflowError`` naming it."""
    if not os.path.lexists(path):
        return None
    try:
        data = read_regular(path, MAX_SMALL_BYTES, "a run file")
    except OSError as e:
        raise os_error(e, path) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MnistflowError(f"is not UTF-8 text (byte {e.start})", path) from None


def check_summary(summary: object, path: str | Path) -> dict:
    """``summary`` (parsed summary.json) if it is an object whose numeric fields are numbers."""
    if not isinstance(summary, dict):
        raise MnistflowError(f"is {type_name(summary)}, not a JSON object of the run's figures", path)
    for k in SUMMARY_NUMBERS:
        v = summary.get(k)
        if v is not None and not is_number(v):
            raise MnistflowError(f"'{k}' is {type_name(v)}, not a number", path)
    return summary


def read_summary(path: str | Path) -> dict | None:
    """A run's summary.json (``path``: the file), bounded and checked (``read_small``,
    ``check_summary``): the object, or None when there is no such file. Anything wrong with
    it (too large, not a regular file, not UTF-8, not JSON, not an object, a figure that is
    not a number) is one ``MnistflowError`` naming the file: callers never see a traceback."""
    text = read_small(path)
    if text is None:
        return None
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        raise MnistflowError("is not valid JSON", path) from None
    return check_summary(parsed, path)


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
