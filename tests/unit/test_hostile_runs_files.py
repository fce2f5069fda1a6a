"""Files written together (issue 40, R10): a pair (a model and its int8 twin) is never left
half new, half old, whatever fails between the two writes. And the run directory's minor
findings: who trains a run now; a folder of runs is not one to train into; --compare bounded."""
from __future__ import annotations

import errno
import os

import pytest

from mnistflow.core import fsutil
from mnistflow.core.errors import MnistflowError


def _names(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --- R10: replace_together --------------------------------------------------------------------------

def _failing(monkeypatch, name: str, code: int = errno.EPERM) -> None:
    """``os.replace`` onto ``name`` fails with ``code`` (an immutable file, a full disk...)."""
    real = os.replace

    def replace(src, dst, *a, **kw):
        if os.path.basename(dst) == name:
            raise OSError(code, os.strerror(code), str(dst))
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(fsutil.os, "replace", replace)


@pytest.mark.parametrize("failing", ["m.int8.onnx", "m.onnx"])
def test_a_pair_whose_second_rename_fails_keeps_the_old_pair(tmp_path, monkeypatch, failing):
    """R10: before, m.onnx was the new model and m.int8.onnx the old one (rc 2)."""
    a, b = tmp_path / "m.onnx", tmp_path / "m.int8.onnx"
    a.write_bytes(b"old float")
    b.write_bytes(b"old int8")
    _failing(monkeypatch, failing)
    with pytest.raises(MnistflowError, match=f"{failing}: Operation not permitted"):
        fsutil.replace_together({a: b"new float", b: b"new int8"})
    assert (a.read_bytes(), b.read_bytes()) == (b"old float", b"old int8")
    assert _names(tmp_path) == ["m.int8.onnx", "m.onnx"]  # no temporary or old name left


def test_a_new_pair_that_fails_leaves_neither(tmp_path, monkeypatch):
    _failing(monkeypatch, "m.int8.onnx", errno.ENOSPC)
    with pytest.raises(MnistflowError, match="No space left on device"):
        fsutil.replace_together({tmp_path / "out" / "m.onnx": b"f", tmp_path / "out" / "m.int8.onnx": b"q"})
    assert _names(tmp_path) == []  # the folder it made is gone too


def test_a_pair_is_replaced_whole_and_a_link_in_the_way_is_replaced_not_followed(tmp_path):
    target = tmp_path / "elsewhere.onnx"
    target.write_bytes(b"keep")
    (tmp_path / "m.onnx").symlink_to(target)
    fsutil.replace_together({tmp_path / "m.onnx": b"new float", tmp_path / "m.int8.onnx": b"new int8"})
    assert (tmp_path / "m.onnx").read_bytes() == b"new float" and not (tmp_path / "m.onnx").is_symlink()
    assert target.read_bytes() == b"keep" and (tmp_path / "m.int8.onnx").read_bytes() == b"new int8"
    assert _names(tmp_path) == ["elsewhere.onnx", "m.int8.onnx", "m.onnx"]


# --- a run directory: who trains it now; a folder of runs is none --------------------------------

def test_training_pid_is_the_lock_holders_and_a_left_lock_file_is_none(tmp_path):
    from mnistflow.artifacts.rundir import RunDir, RunLock

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    assert run.training_pid() is None
    lock = RunLock(run.path).acquire()
    try:
        assert run.training_pid() == os.getpid()
    finally:
        lock.release()
    assert run.training_pid() is None
    run.lock.write_text(f"{os.getpid()}\n")  # what a killed training leaves (here: a live pid, no lock)
    assert run.training_pid() is None


def test_a_folder_of_runs_is_not_trained_into(synthetic_records, tmp_path):
    """``--run-dir runs/`` (a ``$(...)`` that expanded to nothing) trained a run among the others."""
    import mnistflow

    runs = tmp_path / "runs"
    for name in ("a", "b"):
        (runs / name).mkdir(parents=True)
        (runs / name / "config.toml").write_text('model = "softmax"\n')
    with pytest.raises(MnistflowError, match=r"this directory holds other runs \(a, b\): a run directory is "
                                             r"one run's; pick a new folder"):
        mnistflow.train("softmax", synthetic_records, run_dir=runs, max_steps=1, quiet=True, threads=1)
    assert sorted(p.name for p in runs.iterdir()) == ["a", "b"]


def test_report_compares_a_bounded_number_of_runs(tmp_path):
    """``--compare`` held every compared run at once (10 runs at the old cap: 2.4 GB): each is
    thinned now (tests/unit/test_artifacts_runlog.py), and their number bounded."""
    import mnistflow
    from mnistflow.core import limits

    with pytest.raises(MnistflowError, match=f"--compare takes at most {limits.MAX_COMPARE_RUNS} runs, got 33"):
        mnistflow.report(tmp_path, compare=[tmp_path] * 33)
