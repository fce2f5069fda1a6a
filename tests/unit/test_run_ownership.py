"""Run directories are owned by one training at a time and never silently overwritten or mixed
(D6, D7); config.toml records where the data is; a resume keeps the run's thread count."""
from __future__ import annotations

import json
import os
import re

import pytest
import torch

from mnistflow.artifacts import checkpoint
from mnistflow.artifacts.rundir import LOCK, RunBusy, RunDir, RunLock
from mnistflow.core.errors import MnistflowError
from mnistflow.training import config as configmod
from mnistflow.training import claim, setup
from mnistflow.training.api import train
from mnistflow.training.configure import configure

SPEC = "conv3x3x4-relu,maxpool4,fc10"
# 600 training images / batch 50: 12 steps per epoch
QUICK = {"model": SPEC, "quiet": True, "threads": 1, "tensorboard": False, "batch_size": 50, "log_every": 2,
         "device": "cpu"}  # the unit tier runs on the CPU on any machine (threads are a CPU question)


@pytest.fixture(autouse=True)
def _no_malloc_tuning(monkeypatch):
    # runtime.cpu.tune_malloc finds libc through ctypes.util.find_library, which starts an
    # ldconfig process (refused in this tier); it changes no result
    monkeypatch.setenv("MNISTFLOW_MALLOC", "default")


@pytest.fixture
def threads_restored():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


# --- the lock ---------------------------------------------------------------------------------------

def test_the_lock_is_exclusive_names_its_holder_and_is_released(tmp_path):
    run = tmp_path / "runs" / "a"
    with RunLock(run):
        assert (run / LOCK).read_text().strip() == str(os.getpid())
        with pytest.raises(RunBusy, match=rf"another training is using this run directory \(pid {os.getpid()}\)"):
            RunLock(run).acquire()  # a second open file description: flock refuses it
        assert str(run) in str(RunBusy("x", run))
    # nothing else was written: the directories the lock created are gone again
    assert not (tmp_path / "runs").exists()
    with RunLock(run):  # and it can be taken again
        (run / "metrics.jsonl").write_text("")
    assert (run / "metrics.jsonl").is_file() and not (run / LOCK).exists()


def test_a_lock_file_left_by_a_killed_training_does_not_block(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / LOCK).write_text("999999\n")  # kill -9 leaves the file; the kernel dropped the flock
    with RunLock(run):
        assert (run / LOCK).read_text().strip() == str(os.getpid())
    assert run.is_dir()  # not created by the lock: left in place


@pytest.mark.parametrize("content", ["my notes\n", "1234 and more", "x" * 100])
def test_a_users_own_lock_file_is_refused_and_left_as_it_was(tmp_path, content):
    """A file named .lock that no training wrote (not empty, not a pid) is neither truncated nor
    removed: the run is refused with one error."""
    run = tmp_path / "r"
    run.mkdir()
    (run / LOCK).write_text(content)
    with pytest.raises(MnistflowError, match=r"\.lock here is not a run lock .*: move it away") as e:
        RunLock(run).acquire()
    assert e.value.path == str(run)
    assert (run / LOCK).read_text() == content


def test_a_lock_that_is_a_link_is_refused_and_its_target_untouched(tmp_path):
    run, target = tmp_path / "r", tmp_path / "precious.txt"
    run.mkdir()
    target.write_text("keep me")
    (run / LOCK).symlink_to(target)
    with pytest.raises(MnistflowError, match=r"\.lock here is a symbolic link, not a run lock"):
        RunLock(run).acquire()
    assert target.read_text() == "keep me" and (run / LOCK).is_symlink()
    (run / LOCK).unlink()
    (run / LOCK).symlink_to(tmp_path / "missing")  # a dangling one: nothing is created through it
    with pytest.raises(MnistflowError, match="symbolic link"):
        RunLock(run).acquire()
    assert not (tmp_path / "missing").exists()


def test_training_into_a_record_set_is_refused_and_changes_nothing(synthetic_records, tmp_path):
    """The records stay a record set: a run's files never go among them."""
    import shutil

    recs = tmp_path / "recs"
    shutil.copytree(synthetic_records, recs)
    (recs / "notes.txt").write_text("mine")  # records among other files are records still
    before = {p.name: p.read_bytes() for p in recs.iterdir()}
    with pytest.raises(MnistflowError, match=r"holds prepared records \(meta.json and its data\): a run's "
                                             r"files do not go among them; pick another --run-dir"):
        train(data=recs, run_dir=recs, max_steps=1, **QUICK)
    assert {p.name: p.read_bytes() for p in recs.iterdir()} == before
    for f in recs.glob("*.npy"):  # a meta.json alone (a user's own) is no record set
        f.unlink()
    assert train(data=synthetic_records, run_dir=recs, max_steps=1, **QUICK)["steps"] == 1


def test_a_path_that_cannot_be_a_run_directory_is_one_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(MnistflowError, match="cannot use as a run directory") as e:
        RunLock(tmp_path / "file" / "run").acquire()
    assert "Traceback" not in str(e.value)


def test_a_training_holds_its_run_directory_until_it_ends(synthetic_records, tmp_path):
    """D7: a second training on a run directory in use fails at once, whatever the directory holds."""
    run = tmp_path / "r"
    seen = []

    class Intruder:
        def on_train_start(self, logs):
            with pytest.raises(RunBusy, match="another training is using this run directory"):
                RunLock(run).acquire()
            with pytest.raises(MnistflowError, match="another training is using this run directory"):
                train(data=synthetic_records, run_dir=run, max_steps=2, **QUICK)
            with pytest.raises(MnistflowError, match="another training is using this run directory"):
                train(data=synthetic_records, run_dir=run, resume=True, max_steps=2, **QUICK)
            seen.append(True)

    cfg = configure(None, data=str(synthetic_records), run_dir=str(run), max_steps=3, **QUICK)[0]
    s = setup_fit(cfg, [Intruder()])
    assert seen and s["steps"] == 3
    assert not (run / LOCK).exists()
    RunLock(run).acquire().release()  # released at the end


def setup_fit(cfg, callbacks):
    from mnistflow.training.loop import fit

    return fit(cfg, callbacks=callbacks)


# --- a new run never goes into an existing one (D7) ---------------------------------------------

def test_training_again_into_a_finished_run_is_refused_and_changes_nothing(synthetic_records, tmp_path):
    """D7: a finished run without checkpoints (--keep-checkpoints 0) is not overwritten."""
    run = tmp_path / "r"
    train(data=synthetic_records, run_dir=run, max_steps=3, keep_checkpoints=0, **QUICK)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(MnistflowError, match=r"holds a run already \(config.toml, metrics.jsonl, "
                                             r"summary.json, model.safetensors\): continue it with --resume, "
                                             r"or pick another --run-dir") as e:
        train(data=synthetic_records, run_dir=run, max_steps=3, seed=5, lr=0.01, **QUICK)
    assert e.value.path == str(run)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("name", ["config.toml", "metrics.jsonl", "summary.json", "model.safetensors",
                                  "checkpoints/step-000001.pt"])
def test_any_file_of_a_run_makes_it_one(synthetic_records, tmp_path, name):
    run = tmp_path / "r"
    (run / name).parent.mkdir(parents=True)
    (run / name).write_text("x")
    with pytest.raises(MnistflowError, match=f"holds a run already \\({name.split('/')[0]}\\)"):
        train(data=synthetic_records, run_dir=run, max_steps=1, **QUICK)
    assert (run / name).read_text() == "x"


def test_an_empty_or_foreign_directory_is_fine(synthetic_records, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    (tmp_path / "other" / "checkpoints").mkdir()  # an empty folder of that name holds no run
    for run in (tmp_path / "empty", tmp_path / "other"):
        assert train(data=synthetic_records, run_dir=run, max_steps=1, **QUICK)["steps"] == 1
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_a_setting_that_fails_in_setup_leaves_no_run_directory(synthetic_records, tmp_path):
    with pytest.raises(MnistflowError, match="larger than the training set"):
        train(data=synthetic_records, run_dir=tmp_path / "new" / "r", max_steps=1,
              **{**QUICK, "batch_size": 10_000})
    assert not (tmp_path / "new").exists()


def test_a_default_run_name_taken_by_another_run_gets_a_suffix(synthetic_records, tmp_path, monkeypatch):
    taken = tmp_path / "runs" / "spec-20250101-000000"
    taken.mkdir(parents=True)
    (taken / "config.toml").write_text("x")
    monkeypatch.setattr(claim, "default_run_dir", lambda cfg: taken)
    s = train(data=synthetic_records, max_steps=1, **QUICK)
    assert s["run_dir"] == str(taken.with_name(taken.name + "-2"))
    assert (taken / "config.toml").read_text() == "x"


# --- --resume without a checkpoint restarts THAT run (D6) -----------------------------------------

def _killed_before_its_first_checkpoint(records, run) -> None:
    """What a run killed before its first checkpoint leaves: config.toml and some metrics."""
    cfg = configure(None, data=str(records), run_dir=None if run is None else str(run), max_steps=6, lr=0.02, seed=3,
                         **{**QUICK, "model": "softmax", "batch_size": 40})[0]
    run.mkdir()
    configmod.save_toml(cfg, RunDir(run).config)
    RunDir(run).metrics.write_text('{"kind": "train", "step": 2, "loss": 1.0}\n{"kind": "tr')


def test_resume_without_a_checkpoint_restarts_the_runs_own_config(synthetic_records, tmp_path):
    """D6: not the defaults (seed-cnn), the run's model, recipe and seed; flags override them."""
    run = tmp_path / "r"
    _killed_before_its_first_checkpoint(synthetic_records, run)
    cfg = configure(None, run_dir=str(run), resume=True, max_steps=4)[0]
    assert (cfg.model, cfg.batch_size, cfg.lr, cfg.seed, cfg.max_steps) == ("softmax", 40, 0.02, 3, 4)
    s = train(run_dir=run, resume=True, max_steps=4, quiet=True)
    assert s["model"] == "softmax" and s["steps"] == 4 and s["global_batch"] == 40
    saved = RunDir(run).config.read_text()
    assert 'model = "softmax"' in saved and "seed = 3" in saved
    recs = [json.loads(ln) for ln in RunDir(run).metrics.read_text().splitlines()]
    assert [r["step"] for r in recs if r["kind"] == "train"] == [2, 4]  # the killed run's are gone


def test_resume_of_a_directory_that_is_no_run_is_an_error(synthetic_records, tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "notes.txt").write_text("mine")
    with pytest.raises(MnistflowError, match="nothing to resume: no checkpoint and no config.toml"):
        configure(None, data=str(synthetic_records), run_dir=str(tmp_path / "r"), resume=True)[0]
    # empty or missing: a new run starts there (as before)
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / LOCK).write_text("123\n")  # killed before it wrote anything
    for run in (tmp_path / "e", tmp_path / "missing"):
        cfg = configure(None, data=str(synthetic_records), run_dir=str(run), resume=True, **QUICK)[0]
        assert cfg.model == SPEC


def test_another_runs_checkpoint_starts_a_run_of_its_own(synthetic_records, tmp_path):
    """D7: resuming from run a's checkpoint into run b, which holds a run, would mix the two."""
    a, b = tmp_path / "a", tmp_path / "b"
    for run in (a, b):
        train(data=synthetic_records, run_dir=run, max_steps=2, checkpoint_every=2, **QUICK)
    ckpt = checkpoint.find_latest(RunDir(a).checkpoints)
    with pytest.raises(MnistflowError, match="holds a run already"):
        train(resume=str(ckpt), run_dir=b, max_steps=4, quiet=True)
    s = train(resume=str(ckpt), run_dir=tmp_path / "c", max_steps=4, quiet=True)  # a new place: fine
    assert s["steps"] == 4 and s["resumed_from"] == str(ckpt)


def test_resume_of_a_finished_run_without_checkpoints_is_an_error(synthetic_records, tmp_path):
    run = tmp_path / "r"
    train(data=synthetic_records, run_dir=run, max_steps=2, keep_checkpoints=0, **QUICK)
    model = RunDir(run).model.read_bytes()
    with pytest.raises(MnistflowError, match="this run finished and kept no valid checkpoint"):
        train(run_dir=run, resume=True, quiet=True)
    assert RunDir(run).model.read_bytes() == model


# --- config.toml: where the data is ----------------------------------------------------------------

def test_config_records_absolute_data_and_run_paths(synthetic_records, tmp_path, monkeypatch):
    monkeypatch.chdir(synthetic_records.parent)
    train(data=synthetic_records.name, run_dir="r", max_steps=1, **QUICK)
    saved = configmod.load_toml(synthetic_records.parent / "r" / "config.toml")
    assert saved["data"] == str(synthetic_records) and saved["run_dir"] == str(synthetic_records.parent / "r")
    monkeypatch.chdir(tmp_path)  # elsewhere: the file still says where the data is
    cfg = configure(synthetic_records.parent / "r" / "config.toml", run_dir="again")[0]
    assert cfg.data == str(synthetic_records)
    assert train(config=synthetic_records.parent / "r" / "config.toml", run_dir="again")["steps"] == 1


def test_mnistflow_data_standing_in_for_data_is_recorded(synthetic_records, tmp_path, monkeypatch):
    monkeypatch.setenv("MNISTFLOW_DATA", str(synthetic_records))
    train(run_dir=tmp_path / "r", max_steps=1, **QUICK)
    assert configmod.load_toml(tmp_path / "r" / "config.toml")["data"] == str(synthetic_records)


# --- the thread count of a resumed run ----------------------------------------------------------------

def test_resume_keeps_the_runs_thread_count_unless_one_is_chosen(synthetic_records, tmp_path, monkeypatch,
                                                                 threads_restored):
    run = tmp_path / "r"
    monkeypatch.setenv("MNISTFLOW_THREADS", "1")  # the count the run got: config.toml records it
    train(data=synthetic_records, run_dir=run, max_steps=2, checkpoint_every=2,
          **{**QUICK, "threads": None})
    assert "threads = 1" in RunDir(run).config.read_text()
    last = checkpoint.find_latest(RunDir(run).checkpoints)
    assert checkpoint.load(last)["train_state"]["threads"] == 1
    monkeypatch.delenv("MNISTFLOW_THREADS")
    # no choice now: the recorded count (no shedding for a busy machine either)
    assert configure(None, run_dir=str(run), resume=True)[0].threads == 1
    # a choice now: that one
    assert configure(None, run_dir=str(run), resume=True, threads=2)[0].threads == 2
    monkeypatch.setenv("MNISTFLOW_THREADS", "2")
    assert configure(None, run_dir=str(run), resume=True)[0].threads is None  # $MNISTFLOW_THREADS applies


def test_resume_on_another_thread_count_says_so_once(synthetic_records, tmp_path, monkeypatch,
                                                     threads_restored):
    run = tmp_path / "r"
    train(data=synthetic_records, run_dir=run, max_steps=1, checkpoint_every=1, **{**QUICK, "threads": 2})
    s = train(run_dir=run, resume=True, max_steps=2, threads=1, quiet=True)
    said = [w for w in s["warnings"] if "thread" in w]
    assert said == [("the resumed part trains on 1 thread(s), the run so far on 2: it will not be bitwise "
                     "identical to an uninterrupted run (leave --threads and $MNISTFLOW_THREADS unset to "
                     "keep 2)")]
    monkeypatch.delenv("MNISTFLOW_THREADS")
    s = train(run_dir=run, resume=True, max_steps=3, quiet=True)  # kept (the last part's): nothing to say
    assert s["threads"] == 1 and not [w for w in s["warnings"] if "thread" in w]


# --- the test hook's environment value ---------------------------------------------------------------

# --- a new run that fails before it recorded a step leaves the directory as it was ---------------

def _npz(path, **arrays):
    import numpy as np

    np.savez(path, **{k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()})
    return path


def _wrong_loss(logits, targets):
    return "not a tensor"


def _nan_loss(logits, targets):
    return logits.float().sum() * float("nan")


class _Boom:
    def on_train_start(self, logs):
        raise MnistflowError("a callback refused to start")


def _failures(tmp_path):
    """(settings, extra fit arguments, a fragment of the one error line): each fails in setup,
    warm-up or the first steps, after the run directory was taken."""
    wrong = _npz(tmp_path / "wrong.npz", foo=[1.0])
    return [
        ({"init_from": str(wrong)}, {}, "no parameter of the model was restored"),
        ({"init_from": str(wrong), "init_only": "nomatch*"}, {}, "--init-only 'nomatch*' selects none"),
        ({"init_from": str(wrong), "init_only": ",,,"}, {}, "--init-only ',,,' holds no name pattern"),
        ({}, {"loss_fn": _nan_loss}, "training loss became NaN/inf"),
        ({}, {"loss_fn": _wrong_loss}, "must return a scalar floating-point tensor"),
        ({}, {"callbacks": [_Boom()]}, "a callback refused to start"),
        ({"batch_size": 10_000}, {}, "larger than the training set"),
    ]


def _fit_cfg(records, run, settings, extra):
    from mnistflow.training.loop import fit

    cfg = configure(None, data=str(records), run_dir=None if run is None else str(run),
                         **{**QUICK, "max_steps": 3, "tensorboard": True, **settings})[0]
    return fit(cfg, **extra)


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_new_run_that_fails_before_its_first_steps_leaves_no_run_directory(synthetic_records, tmp_path):
    """Each failure leaves no directory it created (a parent it created neither), so the same
    command then works: the error used to leave config.toml, metrics.jsonl, tb/ and
    checkpoints/, and the retry was refused ('holds a run already')."""
    for i, (settings, extra, fragment) in enumerate(_failures(tmp_path)):
        run = tmp_path / f"new{i}" / "run"
        with pytest.raises(MnistflowError, match=re.escape(fragment)) as e:
            _fit_cfg(synthetic_records, run, settings, extra)
        assert "\n" not in str(e.value)
        assert not (tmp_path / f"new{i}").exists(), (fragment, _tree(tmp_path / f"new{i}"))
    # the retry, with the same run directory, trains
    run = tmp_path / "new0" / "run"
    assert _fit_cfg(synthetic_records, run, {}, {})["steps"] == 3
    assert RunDir(run).run_files()


def test_a_failed_new_run_leaves_an_existing_directory_as_it_was(synthetic_records, tmp_path):
    """An empty directory (or one holding a user's files, a lock file left by a killed run)
    is left with exactly what it held."""
    run = tmp_path / "mine"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    (run / "checkpoints").mkdir()  # an empty folder of that name holds no run
    (run / LOCK).write_text("999999\n")
    before = _tree(run)
    for settings, extra, fragment in _failures(tmp_path):
        with pytest.raises(MnistflowError, match=re.escape(fragment)):
            _fit_cfg(synthetic_records, run, settings, extra)
        assert _tree(run) == [p for p in before if p != LOCK]
        assert (run / "notes.txt").read_text() == "mine"
    assert _fit_cfg(synthetic_records, run, {}, {})["steps"] == 3


def test_a_resumed_run_that_fails_is_never_removed(synthetic_records, tmp_path):
    run = tmp_path / "r"
    _fit_cfg(synthetic_records, run, {"checkpoint_every": 1}, {})
    files = {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    from mnistflow.training.loop import fit

    cfg = configure(None, data=str(synthetic_records), run_dir=str(run), resume=True, max_steps=6, **QUICK)[0]
    with pytest.raises(MnistflowError, match="a callback refused to start"):
        fit(cfg, callbacks=[_Boom()])
    now = {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert set(files) <= set(now)
    for name in ("model.safetensors", "summary.json"):
        assert now[name] == files[name]
    # and a run restarted from its own config.toml (killed before its first checkpoint) neither
    run2 = tmp_path / "killed"
    _killed_before_its_first_checkpoint(synthetic_records, run2)
    with pytest.raises(MnistflowError, match="a callback refused to start"):
        fit(configure(None, data=str(synthetic_records), run_dir=str(run2), resume=True, **QUICK)[0],
            callbacks=[_Boom()])
    assert RunDir(run2).config.is_file()


def test_a_run_that_recorded_steps_keeps_them_when_it_fails(synthetic_records, tmp_path):
    """A failure after the run logged a step (metrics.jsonl holds it) keeps the directory: it
    is a run, to be resumed or read."""

    class FailAtStep4:
        def on_step_end(self, step, logs):
            if step == 4:
                raise MnistflowError("stopped by a test")

    run = tmp_path / "r"
    with pytest.raises(MnistflowError, match="stopped by a test"):
        _fit_cfg(synthetic_records, run, {"max_steps": 6}, {"callbacks": [FailAtStep4()]})
    assert RunDir(run).metrics.read_text().count('"kind": "train"') >= 1
    assert RunDir(run).config.is_file()


def test_the_lock_of_a_new_run_removes_only_what_was_written_since_it_was_taken(tmp_path):
    run = tmp_path / "d"
    run.mkdir()
    (run / "keep.txt").write_text("x")
    with pytest.raises(RuntimeError), RunLock(run, new_run=True):
        (run / "config.toml").write_text("a")
        (run / "tb").mkdir()
        (run / "tb" / "events").write_text("e")
        raise RuntimeError("setup failed")
    assert _tree(run) == ["keep.txt"]
    with pytest.raises(RuntimeError), RunLock(tmp_path / "a" / "b", new_run=True):  # made by the lock: removed
        (tmp_path / "a" / "b" / "config.toml").write_text("a")
        raise RuntimeError("setup failed")
    assert not (tmp_path / "a").exists()
    with RunLock(tmp_path / "ok", new_run=True):  # no failure: everything stays
        (tmp_path / "ok" / "config.toml").write_text("a")
    assert (tmp_path / "ok" / "config.toml").is_file()
    with pytest.raises(RuntimeError), RunLock(tmp_path / "res"):  # not a new run (a resume): nothing is removed
        (tmp_path / "res" / "config.toml").write_text("a")
        raise RuntimeError("setup failed")
    assert (tmp_path / "res" / "config.toml").is_file()


def test_a_model_without_parameters_is_one_error_and_no_run_directory(synthetic_records, tmp_path):
    import mnistflow

    class NoParams(torch.nn.Module):
        def forward(self, x):
            return x.flatten(1)[:, :10]

    run = tmp_path / "r"
    with pytest.raises(MnistflowError, match="model NoParams has no parameters: there is nothing to train"):
        mnistflow.train(NoParams(), data=synthetic_records, run_dir=run, max_steps=1, **API)
    assert not run.exists()
    with pytest.raises(MnistflowError, match="model NoParams has no parameters"):  # fit checks it too
        _fit_cfg(synthetic_records, run, {}, {"model": NoParams()})
    assert not run.exists()


API = {k: v for k, v in QUICK.items() if k != "model"}  # mnistflow.train takes the model first


@pytest.mark.parametrize("loss, returned", [
    (lambda logits, y: "x", "it returned str"),
    (lambda logits, y: torch.nn.functional.cross_entropy(logits, y, reduction="none"),
     "it returned a tensor of shape (50,)"),
    (lambda logits, y: torch.tensor(1.0), "a tensor without a gradient"),
    (lambda logits, y: (logits.argmax(1) == y).sum(), "a torch.int64 tensor"),
])
def test_a_loss_that_is_not_a_scalar_is_one_error_and_no_run_directory(synthetic_records, tmp_path, loss,
                                                                        returned):
    import mnistflow

    run = tmp_path / "r"
    with pytest.raises(MnistflowError, match=re.escape(returned)) as e:
        mnistflow.train("softmax", data=synthetic_records, run_dir=run, max_steps=2, loss=loss,
                        **API)
    assert "\n" not in str(e.value) and "must return a scalar floating-point tensor" in str(e.value)
    assert not run.exists()
    s = mnistflow.train("softmax", data=synthetic_records, run_dir=run, max_steps=2,
                        loss=torch.nn.functional.cross_entropy, **API)
    assert s["steps"] == 2


@pytest.mark.parametrize("config", [123, {"epochs": 1}, ["a.toml"]])
def test_config_that_is_not_a_file_path_is_one_error(synthetic_records, tmp_path, config):
    import mnistflow

    with pytest.raises(MnistflowError, match=r"config is the path of a TOML file \(e.g. RUN/config.toml\); "
                                             rf"got a {type(config).__name__}: give settings as keyword"):
        mnistflow.train("softmax", data=synthetic_records, run_dir=tmp_path / "r", config=config, **API)
    assert not (tmp_path / "r").exists()


def test_a_failed_run_under_a_default_name_leaves_no_directory(synthetic_records, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(claim, "default_run_dir", lambda cfg: tmp_path / "runs" / "spec-20250101-000000")
    with pytest.raises(MnistflowError, match="a callback refused to start"):
        _fit_cfg(synthetic_records, None, {}, {"callbacks": [_Boom()]})
    assert not (tmp_path / "runs").exists()
    s = _fit_cfg(synthetic_records, None, {}, {})
    assert s["run_dir"] == str(tmp_path / "runs" / "spec-20250101-000000")
