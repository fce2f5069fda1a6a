"""metrics.jsonl has one reader (``runlog._records``) behind both ``read_metrics`` (reports) and
``truncate_metrics`` (resume): the same lines are skipped by both, memory stays bounded and a
file that is not a regular one is refused before it can block."""
from __future__ import annotations

import os

import pytest

from helpers import memory
from helpers.blocking import deadline
from mnistflow.artifacts import runlog
from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError

LONG = b"x" * (limits.MAX_METRICS_LINE * 2 + 5)  # a foreign line, longer than any record
HOSTILE = (b'{"step": 5, "loss": 1}\n' + LONG + b'\n{"step": 7}\n{"step": "x"}\n[1, 2]\n\xff\xfe\n'
           b'{"kind": "val"}\n{"step": 9}\n{"step": 10, "lo')  # ends torn, mid-record


def test_truncate_metrics_keeps_the_records_up_to_the_step_line_by_line(tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_bytes(HOSTILE)
    runlog.truncate_metrics(m, 7)
    # step 9 and the torn line go; so do the over-long, undecodable and non-object lines and a
    # step that is not a number; a record without a step stays
    assert m.read_bytes() == b'{"step": 5, "loss": 1}\n{"step": 7}\n{"kind": "val"}\n'
    runlog.truncate_metrics(tmp_path / "none.jsonl", 7)  # no file: nothing to do
    assert not (tmp_path / "none.jsonl").exists()


def test_a_last_record_without_its_newline_is_kept_and_ended(tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_bytes(b'{"step": 1}\r\n{"step": 2}')
    runlog.truncate_metrics(m, 2)
    assert m.read_bytes() == b'{"step": 1}\n{"step": 2}\n'


def test_read_metrics_and_truncate_metrics_read_the_same_records(tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_bytes(HOSTILE)
    assert runlog.read_metrics(m) == [{"step": 5, "loss": 1}, {"step": 7}, {"step": "x"},
                                      {"kind": "val"}, {"step": 9}]
    assert runlog.read_metrics(m, ("loss",)) == [{"loss": 1}, {}, {}, {}, {}]
    runlog.truncate_metrics(m, 10**9)  # every step kept: what is left is what the reader read
    assert runlog.read_metrics(m) == [{"step": 5, "loss": 1}, {"step": 7}, {"kind": "val"}, {"step": 9}]


def test_a_fifo_metrics_file_is_refused_not_waited_on(tmp_path):
    m = tmp_path / "metrics.jsonl"
    os.mkfifo(m)
    for call in (lambda: runlog.truncate_metrics(m, 7), lambda: runlog.read_metrics(m)):
        with deadline(10), pytest.raises(MnistflowError) as e:
            call()
        assert str(e.value) == f"{m}: not a regular file (a FIFO); refusing to read it"


def test_a_sparse_file_of_zeros_is_truncated_in_bounded_memory(tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_bytes(b'{"step": 1}\n')
    with open(m, "r+b") as f:  # 256 MiB of zeros after it: one endless line, no disk
        f.truncate(256 << 20)
    got, grew = memory.peak_growth(lambda: runlog.truncate_metrics(m, 7))
    assert got is None
    assert grew < 32 << 20, f"{grew / 2**20:.0f} MiB ({memory.METHOD})"
    assert m.read_bytes() == b'{"step": 1}\n'


def test_read_metrics_refuses_a_file_over_its_cap(tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_bytes(b'{"step": 1}\n{"step": 2}\n')
    with pytest.raises(MnistflowError, match=r"a metrics log of 24 bytes is over the 20-byte limit"):
        runlog.read_metrics(m, max_bytes=20)
    assert runlog.read_metrics(m, max_bytes=24) == [{"step": 1}, {"step": 2}]


# --- a long run's metrics: streamed and thinned (issue 40, minor) -----------------------------------

def _train_line(step: int) -> bytes:
    return (b'{"kind": "train", "step": %d, "epoch": %f, "loss": 0.25, "acc": 0.5, "lr": 0.1, '
            b'"img_per_s": 12345.6, "data_wait_frac": 0.01, "queue_depth": 0, "rss_mb": 300.5}\n' % (step, step / 550))


def test_a_long_runs_metrics_are_thinned_evenly_with_the_last_step_kept(tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_bytes(b"".join(_train_line(s) + (b'{"kind": "val", "step": %d, "acc": 0.9}\n' % s if s % 100 == 0 else b"")
                           for s in range(1, 1002)) + b'{"step": 3}\n')
    recs = runlog.read_metrics(m, ("kind", "step"), max_points=16)
    train = [r["step"] for r in recs if r.get("kind") == "train"]
    assert 16 <= len(train) <= 33 and train[0] == 1 and train[-1] == 1001
    gaps = {b - a for a, b in zip(train[:-2], train[1:-1])}
    assert len(gaps) == 1  # evenly spread
    assert [r["step"] for r in recs if r.get("kind") == "val"] == list(range(100, 1001, 100))  # fewer: all
    assert recs[-1] == {"step": 3}  # the file's order


def test_a_metrics_log_over_the_old_64_mb_cap_is_reported_in_bounded_memory(tmp_path):
    """``report`` refused a metrics.jsonl over 64 MB (a long run logged often); now it is read
    as a stream: ~70 MB of records cost a few MB (before: ~250 MB for 60 MB, when it was read)."""
    m = tmp_path / "metrics.jsonl"
    block = b"".join(_train_line(s) for s in range(1, 10_001))
    with open(m, "wb") as f:
        for _ in range(41):  # ~70 MB (the steps repeat: only the count and the size matter here)
            f.write(block)
    assert m.stat().st_size > 64 << 20
    got, grew = memory.peak_growth(lambda: runlog.read_metrics(m, runlog.METRIC_KEYS))
    assert isinstance(got, list) and len(got) <= 2 * limits.MAX_PLOT_POINTS + 1
    assert grew < 32 << 20, f"{grew / 2**20:.0f} MiB ({memory.METHOD})"
