"""Standard output that cannot be written (issue 40, minor findings): closed (``>&-``) or open for
reading only, one line and exit 2 before anything runs (it was exit 0 with the output gone);
closing under a training run (``train ... | head``) stops it as Ctrl-C does, with a checkpoint
and one line on stderr, exit 141 (it was 141 with nothing said and no checkpoint). Other verbs
keep the quiet exit 141 of Unix tools when their reader leaves (test_cli.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from helpers.cli import assert_one_line_error


def _closed_stdout():
    os.close(1)


def test_a_closed_stdout_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "mnistflow", "models"], stderr=subprocess.PIPE, text=True,
                          preexec_fn=_closed_stdout, timeout=60)
    proc.stdout = ""
    assert_one_line_error(proc, "standard output is closed: the output would be lost")


def test_a_read_only_stdout_is_one_line():
    with open(os.devnull, "rb") as ro:
        proc = subprocess.run([sys.executable, "-m", "mnistflow", "models"], stdout=ro, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    assert_one_line_error(proc, "standard output is open for reading only")


def test_train_whose_reader_leaves_saves_a_checkpoint_and_says_so(tmp_path, synthetic_records):
    """``train ... | head -5``: the reader leaves inside the table (2,000 epochs: far from done)."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mnistflow", "train", "--recipe", "softmax", "--data", str(synthetic_records),
         "--run-dir", str(run), "--epochs", "2000", "--log-every", "1", "--no-tensorboard", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(5):
        assert proc.stdout.readline()
    proc.stdout.close()  # `head` exits
    t0 = time.monotonic()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141 and time.monotonic() - t0 < 30
    got = [ln for ln in err.splitlines() if ln.strip()]
    assert len(got) == 1 and "interrupted by SIGPIPE (standard output closed" in got[0], err
    assert "checkpoint saved:" in got[0] and "mnistflow train --resume --run-dir" in got[0]
    assert list((run / "checkpoints").glob("step-*.pt")) and (run / "checkpoints" / "last").is_file()
