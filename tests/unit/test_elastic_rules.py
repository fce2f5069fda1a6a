"""The rules of elastic training, without processes: how a difference between ranks is named,
how a checkpoint's save is decided and agreed, how a restart finds the run of its job, what
the --nproc launcher keeps for itself (tests/integration/test_elastic.py and test_netns.py run
them with real processes and machines)."""
from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from mnistflow import cli
from mnistflow.runtime import dist
from mnistflow.training import agree, resume
from mnistflow.training.checkpointing import REASONS, Saver, Signals


def ident(**over) -> dict:
    base = {"model": "softmax", "lr": 0.1, "max_steps": 30, "device": "cpu",
            "data": {"name": "mnist", "shape": [1, 28, 28], "splits": {"train": 55000}, "variants": 0,
                     "sha256": "ab" * 32}}
    return {**base, **over}


def test_ranks_that_agree_have_no_difference():
    assert agree.differences([ident(), ident(), ident()]) == []


def test_each_difference_names_the_flag_its_values_and_their_ranks():
    seen = [ident(lr=0.1), ident(lr=0.2), ident(lr=0.1, model="fc32,fc10"), ident(max_steps=None)]
    assert agree.differences(seen) == [
        "--model softmax on ranks 0, 1, 3, fc32,fc10 on rank 2",
        "--lr 0.1 on ranks 0, 2, 3, 0.2 on rank 1",
        "--max-steps 30 on ranks 0, 1, 2, unset on rank 3",
    ]


def test_a_data_difference_names_each_records_by_name_and_checksum():
    other = ident(data={**ident()["data"], "name": "digits", "sha256": "cd" * 32, "splits": {"train": 600}})
    (line,) = agree.differences([ident(), other])
    assert line == ("--data mnist (sha256 abababababab, {'train': 55000}) on rank 0, "
                    "digits (sha256 cdcdcdcdcdcd, {'train': 600}) on rank 1")


def test_long_rank_lists_and_values_are_cut():
    seen = [ident(model="m" * 100)] + [ident() for _ in range(9)]
    (line,) = agree.differences(seen)
    assert line == f"--model {'m' * 57}... on rank 0, softmax on ranks 1, 2, 3, 4, 5, 6 and 3 more"


def test_what_each_process_may_hold_alone_is_not_compared():
    from mnistflow.training.config import FIELDS

    assert set(agree.PER_PROCESS) <= set(FIELDS)
    for same in ("model", "lr", "batch_size", "seed", "max_steps", "optimizer", "precision", "augment"):
        assert same not in agree.PER_PROCESS


def test_a_single_process_compares_nothing():
    agree.check_ranks_agree(None, None, None, dist.DistInfo())  # returns before reading anything


def _saver(tmp_path: Path) -> Saver:
    from mnistflow.artifacts.checkpoint import CheckpointDir

    return Saver(CheckpointDir(tmp_path, 2), payload=lambda rank_rng: {})


def test_a_save_is_due_every_n_steps_after_n_seconds_or_at_a_new_best(tmp_path):
    s = _saver(tmp_path)
    assert s.due(20, every=20, secs=None) == "every" and s.due(21, every=20, secs=None) == ""
    s._t_last = time.monotonic() - 11
    assert s.due(21, every=20, secs=10) == "secs"
    s.note_eval(22, "val", 0.9)
    assert s.due(22, every=20, secs=None) == "best"
    s._saved_step = 22
    assert s.due(22, every=1, secs=None) == ""  # saved already at this step


def test_one_process_agrees_with_itself():
    sig = Signals(dist.DistInfo(), catch=True, quiet=True)
    assert sig.agree("every") == (0, "every") and sig.agree() == (0, "")
    sig.local.signum = signal.SIGTERM  # as the handler sets it
    assert sig.agree("every") == (signal.SIGTERM, "interrupt")  # a signal: save, and stop
    assert sig.agree(saved=True) == (signal.SIGTERM, "")  # saved at this step already: only stop
    assert all(r == "" or r in ("best", "secs", "every", "interrupt") for r in REASONS)


def test_max_over_ranks_takes_a_list_in_one_collective():
    assert dist.max_over_ranks(3) == 3 and dist.max_over_ranks([1, 2, 0]) == [1, 2, 0]


class FakeStore:
    """The job's store, as a dict (TCPStore's check/get/set)."""

    def __init__(self):
        self.keys: dict[str, bytes] = {}

    def check(self, keys):
        return all(k in self.keys for k in keys)

    def get(self, key):
        return self.keys[key]

    def set(self, key, value):
        self.keys[key] = value.encode() if isinstance(value, str) else value


def test_a_restart_finds_the_run_its_job_recorded(monkeypatch, tmp_path):
    store = FakeStore()
    monkeypatch.setattr(dist, "job_store", lambda: store)
    monkeypatch.setattr(resume, "_trainings", 0)
    assert resume.restarted_run() is None  # the job's first start: nothing recorded
    resume.remember_job_run(tmp_path / "run", dist.DistInfo(rank=1, world_size=2))
    assert store.keys == {}  # only rank 0 records it
    monkeypatch.setattr(resume, "_trainings", 0)  # the same process, once more as rank 0
    resume.remember_job_run(tmp_path / "run", dist.DistInfo())
    assert resume.restarted_run() is None  # a second training of this process is a run of its own
    monkeypatch.setattr(resume, "_trainings", 0)  # a restarted process, before its first training
    assert resume.restarted_run() == (tmp_path / "run").resolve()


def test_each_training_of_a_restarted_script_continues_its_own_run(monkeypatch, tmp_path):
    store = FakeStore()
    monkeypatch.setattr(dist, "job_store", lambda: store)
    monkeypatch.setattr(resume, "_trainings", 0)
    for name in ("first", "second"):  # a script that trains two runs, one after the other
        assert resume.restarted_run() is None
        resume.remember_job_run(tmp_path / name, dist.DistInfo())
    monkeypatch.setattr(resume, "_trainings", 0)  # restarted: the same script from its start
    found = []
    for _ in range(2):
        found.append(resume.restarted_run())
        resume.remember_job_run(found[-1], dist.DistInfo())
    assert found == [(tmp_path / "first").resolve(), (tmp_path / "second").resolve()]


def test_without_torchrun_nothing_is_recorded_or_found(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert dist.job_store() is None and resume.restarted_run() is None
    resume.remember_job_run(tmp_path, dist.DistInfo())  # nothing to record into: no error


def test_a_restart_takes_over_the_command_lines_run_directory_and_resume(monkeypatch, tmp_path):
    """A restart continues the job's run, whatever the command line said (its first start's
    command: a new run, or the resume of an older checkpoint)."""
    from mnistflow.training import configure as configuremod

    monkeypatch.setattr(resume, "restarted_run", lambda: tmp_path / "job-run")
    flags = {"run_dir": "elsewhere", "resume": "runs/a/checkpoints/step-000040.pt", "quiet": True}
    configuremod._continue_a_restarted_job(flags)
    assert flags["resume"] == "latest" and flags["run_dir"] == str(tmp_path / "job-run")


def test_the_launcher_keeps_its_own_flags():
    argv = ["train", "--nproc", "2", "--max-restarts=3", "--recipe", "fast", "--nproc=4", "--max-restarts", "1",
            "--lr", "0.1"]
    assert cli._without_launcher_flags(argv) == ["train", "--recipe", "fast", "--lr", "0.1"]


def test_a_process_outside_torchrun_is_not_tied_to_its_parent(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    called = []
    monkeypatch.setattr("ctypes.CDLL", lambda *a, **k: called.append(a))
    dist.die_with_parent()
    assert called == []


@pytest.mark.parametrize("argv, fragment", [
    (["train", "--nproc", "2", "--max-restarts", "-1"], "argument --max-restarts: expected an integer from 0 to"),
    (["train", "--recipe", "softmax", "--max-restarts", "2"], "--max-restarts restarts the processes of --nproc N"),
])
def test_max_restarts_is_checked_and_needs_nproc(argv, fragment, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's own refusal
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
