"""What a run logged, read back: one owner for the formats of its metrics.jsonl and its
summary.json (``training.observe`` writes them; ``rundir`` names them).

    read_metrics / truncate_metrics   the records of metrics.jsonl, through one line reader
    read_summary                      summary.json, capped and type-checked (report and eval)
    load_run -> RunLog                what a run directory says about itself (for reports)
    end_of_run_table                  the table every run ends with (``mnistflow report`` too)

Every run file is read with a cap (``core.limits``: ``MAX_METRICS_BYTES``, ``MAX_METRICS_LINE``,
``MAX_RUN_FILE_BYTES``): memory stays bounded whatever a directory holds, and a file that is not a
regular one (a FIFO would block the read) is refused. What a tampered ``summary.json`` or
``config.toml`` holds is checked before it is shown: a field of the wrong type is one error line
naming the file and field.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from mnistflow.artifacts.rundir import METRICS, RunDir
from mnistflow.core import compat, limits
from mnistflow.core.errors import MnistflowError, os_error
from mnistflow.core.fsutil import atomic_write, open_regular, read_regular

# summary.json fields shown as numbers (each may be null, or missing: then not shown)
SUMMARY_NUMBERS = ("wall_s", "time_to_target_s", "epochs", "steps", "img_per_s", "train_s", "eval_s",
                   "train_img_per_s", "data_wait_frac", "peak_rss_mb", "val_acc", "test_acc", "tta",
                   "gpu_peak_allocated_mb", "gpu_peak_reserved_mb")


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
    most ``limits.MAX_RUN_FILE_BYTES`` are read (a 1 GiB sparse file is refused, not loaded), and a
    file that is not regular or not UTF-8 is a ``MnistflowError`` naming it."""
    if not os.path.lexists(path):
        return None
    try:
        data = read_regular(path, limits.MAX_RUN_FILE_BYTES, "a run file")
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


def _lines(f: BinaryIO, path: str | Path, max_bytes: int | None) -> Iterator[bytes]:
    """Each line of the open metrics file ``f``, except one over ``limits.MAX_METRICS_LINE``
    (read piece by piece, never whole: a sparse file of zeros costs no memory); reading stops
    once ``max_bytes`` (None: no cap) have been read."""
    seen = 0

    def readline() -> bytes:
        nonlocal seen
        try:
            line = f.readline(limits.MAX_METRICS_LINE)
        except OSError as e:
            raise os_error(e, path) from None
        seen += len(line)
        return line

    while line := readline():
        if max_bytes is not None and seen > max_bytes:  # grew since it was measured: not read
            return
        if not line.endswith(b"\n") and len(line) >= limits.MAX_METRICS_LINE:
            while line and not line.endswith(b"\n"):  # the rest of the over-long line
                line = readline()
            continue
        yield line


def _records(f: BinaryIO, path: str | Path, max_bytes: int | None) -> Iterator[tuple[bytes, dict]]:
    """(line, record) for each line of the open metrics file ``f`` (``_lines``) that is a JSON
    object. A torn, undecodable or non-object line is skipped."""
    for line in _lines(f, path, max_bytes):
        rec = _parse(line)
        if rec is not None:
            yield line, rec


_KIND = b'{"kind": "'  # how the run's own records begin: their kind is read without parsing them
MAX_KINDS = 16  # kinds of record kept apart (the run writes train, val, test, epoch)


class _Thinned:
    """At most ``2 * n`` of the records of one kind offered, evenly spread: every ``stride``-th,
    the stride doubling (and every other record kept going) whenever ``2 * n`` are kept; and
    the last one offered (a run's last step)."""

    def __init__(self, n: int) -> None:
        self.n, self.stride, self.seen = n, 1, 0
        self.kept: list[tuple[int, dict]] = []
        self.last: tuple[int, bytes] | None = None

    def due(self, order: int, line: bytes) -> bool:
        """Count the record at ``order``; whether it is one to keep."""
        self.last = (order, line)
        self.seen += 1
        return (self.seen - 1) % self.stride == 0

    def keep(self, order: int, rec: dict) -> None:
        self.kept.append((order, rec))
        if len(self.kept) >= 2 * self.n:
            self.kept = self.kept[::2]
            self.stride *= 2


def _parse(line: bytes) -> dict | None:
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) else None


def read_metrics(path: str | Path, keys: tuple[str, ...] | None = None,
                 max_bytes: int = limits.MAX_METRICS_BYTES,
                 max_points: int = limits.MAX_PLOT_POINTS) -> list[dict]:
    """The records of a metrics.jsonl, in the file's order (``_records``' lines: torn,
    undecodable, over-long and non-object ones skipped), only ``keys`` of each kept when given.
    Read as a stream, in bounded memory: of each kind ("train", "val"...), at most
    ``2 * max_points`` records evenly spread and its last one (a plot is a thousand pixels
    wide; a long run logged every step has millions), and only those are parsed. A file that
    is not a regular one (a FIFO would block) or is larger than ``max_bytes`` is refused
    (``fsutil.open_regular``)."""
    kinds: dict[str | None, _Thinned] = {}
    with open_regular(path, max_bytes, "a metrics log") as f:
        for order, line in enumerate(_lines(f, path, max_bytes)):
            kind: str | None
            rec = None
            if line.startswith(_KIND):
                kind = line[len(_KIND):line.find(b'"', len(_KIND))].decode("utf-8", "replace")
            else:
                rec = _parse(line)
                if rec is None:
                    continue
                kind = rec.get("kind") if isinstance(rec.get("kind"), str) else None
            if kind not in kinds and len(kinds) >= MAX_KINDS:
                continue
            bucket = kinds.setdefault(kind, _Thinned(max_points))
            if bucket.due(order, line) and (rec := rec or _parse(line)) is not None:
                bucket.keep(order, rec)
    for bucket in kinds.values():  # each kind's last record, if the stride passed it by
        if bucket.last is not None and (not bucket.kept or bucket.kept[-1][0] != bucket.last[0]):
            rec = _parse(bucket.last[1])
            if rec is not None:
                bucket.kept.append((bucket.last[0], rec))
    ordered = sorted((kept for b in kinds.values() for kept in b.kept), key=lambda kept: kept[0])
    return [rec if keys is None else {k: rec[k] for k in keys if k in rec} for _, rec in ordered]


def truncate_metrics(path: str | Path, step: int) -> None:
    """Rewrite a metrics.jsonl (atomically) without the records after ``step`` and without any
    torn or foreign line (``_records``): on resume, the records the interrupted process logged
    after its last checkpoint go, and the resumed run logs them again. A record without a step
    is kept. No file: nothing to do. Read line by line, whatever the file's size (bounded
    memory); a file that is not a regular one (a FIFO would block the run's logger forever) is
    one ``MnistflowError``."""
    if not os.path.lexists(path):
        return
    with open_regular(path, None, "a metrics log") as f:
        def write(out: BinaryIO) -> None:
            for line, rec in _records(f, path, None):
                at = rec.get("step", 0)
                if isinstance(at, (int, float)) and at <= step:
                    out.write(line.rstrip(b"\r\n") + b"\n")

        atomic_write(path, write)


# --- a run directory, for reports --------------------------------------------------------------

# the fields of a metrics.jsonl record a report draws (the rest is not kept in memory)
METRIC_KEYS = ("kind", "step", "epoch", "loss", "acc", "lr", "img_per_s", "data_wait_frac")


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
            if is_number(r.get("epoch")) and r["epoch"] > 0:
                return r["step"] / r["epoch"]
        return None

    def epochs(self, rows: list[dict]) -> list[float]:
        spe = self.steps_per_epoch or 1.0
        return [r["step"] / spe for r in rows]


def _by_step(rows: list[dict]) -> list[dict]:
    """Sorted by step, the last record of a step winning (a resumed run logs some again)."""
    return sorted({r["step"]: r for r in rows if is_number(r.get("step")) and isinstance(r["step"], int)
                   and 0 <= r["step"] < 2**53}.values(), key=lambda r: r["step"])


def load_run(run_dir: str | Path) -> RunLog:
    """The metrics, summary and configuration of a run directory."""
    run = RunDir(run_dir)
    if not run.path.is_dir():
        raise MnistflowError("no such run directory", run.path)
    if not os.path.lexists(run.metrics):
        raise MnistflowError(f"no {METRICS} in this directory (is it a run directory?)", run.path)
    recs = read_metrics(run.metrics, METRIC_KEYS)
    kinds = {k: _by_step([r for r in recs if r.get("kind") == k]) for k in ("train", "val", "test")}
    summary = read_summary(run.summary)
    config = {}
    text = read_small(run.config) or ""
    if text:
        try:
            config = compat.tomllib().loads(text)
        except compat.tomllib().TOMLDecodeError as e:
            raise MnistflowError(f"not valid TOML ({e})", run.config) from None
        except RecursionError:
            raise MnistflowError("not valid TOML (nested too deeply)", run.config) from None
        target = config.get("target_acc")
        if target is not None and not is_number(target):
            raise MnistflowError(f"target_acc is {type_name(target)}, not a number", run.config)
    return RunLog(run.path, kinds["train"], kinds["val"], kinds["test"], summary, config, text)


# --- the end-of-run table ----------------------------------------------------------------------

# what the end-of-run table needs (present, a number unless null is allowed)
TABLE_FIELDS = ("wall_s", "img_per_s", "train_img_per_s", "data_wait_frac", "peak_rss_mb", "val_acc",
                "test_acc", "run_dir")
NULLABLE = ("time_to_target_s", "train_img_per_s", "data_wait_frac", "val_acc", "test_acc")


def table_missing(summary: dict, target: float | None) -> list[str]:
    """The fields the end-of-run table needs that ``summary`` lacks (or holds null where a
    number is needed)."""
    need = [*TABLE_FIELDS, *(["time_to_target_s"] if target is not None else []),
            *(["gpu_peak_reserved_mb"] if "gpu_peak_allocated_mb" in summary else [])]
    return [k for k in need if k not in summary or (summary[k] is None and k not in NULLABLE)]


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
    # (at most 80 wide: a long run directory wraps under its name on a terminal, a rule cannot)
    line = "-" * min(80, w + 3 + max(len(v) for _, v in rows))
    return "\n".join([line] + [f"{k:<{w}}   {v}" for k, v in rows] + [line])
