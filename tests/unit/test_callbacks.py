"""User callbacks: EarlyStopping and CSVLogger on their own, and inside real (synthetic) runs."""
from __future__ import annotations

import csv
import json

import pytest

import mnistflow
from mnistflow.artifacts.rundir import RunDir
from mnistflow.core import log
from mnistflow.core.errors import MnistflowError
from mnistflow.training.callbacks import CSVLogger, EarlyStopping, check_callbacks, read_csv_log
from mnistflow.training.hooks import StopTraining

QUICK = dict(quiet=True, threads=1, tensorboard=False, keep_checkpoints=0, batch_size=50, log_every=2)


def validations(cb: EarlyStopping, values, key: str = "val_acc") -> int | None:
    """Feed validation results (steps 10, 20, ...); the step at which it stopped, or None."""
    for i, v in enumerate(values, 1):
        try:
            cb.on_validation_end(10 * i, {"split": "val", key: v})
        except StopTraining:
            return 10 * i
    return None


# --- EarlyStopping ----------------------------------------------------------------------------

def test_early_stopping_waits_patience_validations_without_improvement():
    es = EarlyStopping(patience=2)
    assert validations(es, [0.5, 0.6, 0.6, 0.59]) == 40
    assert (es.best, es.best_step, es.stopped_step) == (0.6, 20, 40)


def test_early_stopping_resets_its_patience_on_improvement():
    assert validations(EarlyStopping(patience=2), [0.5, 0.4, 0.6, 0.5, 0.7, 0.6]) is None


def test_early_stopping_min_delta_and_modes():
    assert validations(EarlyStopping(patience=1, min_delta=0.05), [0.5, 0.54]) == 20  # +0.04 is no gain
    assert validations(EarlyStopping(patience=1, min_delta=0.05), [0.5, 0.56]) is None
    assert EarlyStopping("val_loss").mode == "min" and EarlyStopping("val_acc").mode == "max"
    assert validations(EarlyStopping("val_loss", patience=1), [0.5, 0.4, 0.3], "val_loss") is None
    assert validations(EarlyStopping("val_loss", patience=1), [0.5, 0.6], "val_loss") == 20
    assert validations(EarlyStopping("val_loss", patience=1, mode="max"), [0.5, 0.6], "val_loss") is None


def test_early_stopping_raises_stop_training_with_a_short_reason():
    es = EarlyStopping(patience=1)
    es.on_validation_end(1, {"split": "val", "val_acc": 0.5})
    with log.quiet(), pytest.raises(StopTraining, match="early_stopping"):
        es.on_validation_end(2, {"split": "val", "val_acc": 0.5})


@pytest.mark.parametrize("kw", [dict(mode="maximize"), dict(patience=0), dict(patience=1.5),
                                dict(min_delta=-1)])
def test_early_stopping_rejects_bad_settings(kw):
    with pytest.raises(MnistflowError):
        EarlyStopping(**kw)


def test_early_stopping_on_a_missing_metric_warns_once_and_never_stops():
    es = EarlyStopping("val_f1", patience=1)
    with log.recording() as warned, log.quiet():
        assert validations(es, [0.1, 0.1, 0.1], key="val_acc") is None
    assert len(warned) == 1 and "val_f1" in warned[0] and "val_acc" in warned[0]


# --- CSVLogger --------------------------------------------------------------------------------

def test_csv_logger_rows_header_and_widening(tmp_path):
    path = tmp_path / "sub" / "log.csv"
    cb = CSVLogger(path)
    cb.on_train_start({})
    assert path.read_text() == "kind,step\n"
    cb.on_step_end(2, {"loss": 2.0, "acc": 0.25, "lr": 1e-3, "note": "text is left out"})
    cb.on_step_end(4, {"loss": 1.5, "acc": 0.5, "lr": 1e-3})
    before = path.read_text()
    assert before.splitlines()[0] == "kind,step,loss,acc,lr" and len(before.splitlines()) == 3
    cb.on_validation_end(4, {"split": "val", "acc": 0.6, "loss": 1.2, "val_acc": 0.6, "val_loss": 1.2})
    cb.on_step_end(6, {"loss": 1.0, "acc": 0.7, "lr": 1e-3})
    cb.on_train_end({})
    lines = path.read_text().splitlines()
    assert lines[0] == "kind,step,loss,acc,lr,val_acc,val_loss"  # one header, widened in place
    assert len(lines) == 5
    rows = read_csv_log(path)
    assert rows[0] == {"kind": "train", "step": 2, "loss": 2.0, "acc": 0.25, "lr": 1e-3}
    assert rows[2] == {"kind": "val", "step": 4, "acc": 0.6, "loss": 1.2, "val_acc": 0.6, "val_loss": 1.2}
    with open(path, newline="") as f:
        assert all(len(r) == 7 for r in csv.reader(f))  # every row has every column
    assert not [p for p in path.parent.iterdir() if p.name != "log.csv"]  # no temporary files left


def test_csv_logger_starts_afresh(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("kind,step,acc\ntrain,5,0.5\n")  # a previous run's log
    cb = CSVLogger(path)
    cb.on_train_start({})
    cb.on_step_end(1, {"loss": 1.0})
    assert read_csv_log(path) == [{"kind": "train", "step": 1, "loss": 1.0}]


def test_csv_logger_never_replaces_a_users_file(synthetic_records, tmp_path):
    """Another file at the path (not a CSV log) is refused, left as it was, and the new run
    leaves no directory behind."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes, not a CSV\n")
    with pytest.raises(MnistflowError, match=r"CSVLogger would replace this file, which is not a CSV log") as e:
        CSVLogger(notes).on_train_start({})
    assert e.value.path == str(notes) and notes.read_text() == "my notes, not a CSV\n"
    run = tmp_path / "run"
    with pytest.raises(MnistflowError, match="not a CSV log"):
        mnistflow.train(data=synthetic_records, model="softmax", max_steps=1, threads=1, quiet=True,
                        tensorboard=False, run_dir=run, callbacks=[CSVLogger(notes)])
    assert notes.read_text() == "my notes, not a CSV\n" and not run.exists()
    (tmp_path / "folder").mkdir()
    with pytest.raises(MnistflowError, match="CSVLogger: not a regular file"):
        CSVLogger(tmp_path / "folder").on_train_start({})
    (tmp_path / "empty.csv").write_text("")  # nothing to lose
    CSVLogger(tmp_path / "empty.csv").on_train_start({})


def test_csv_logger_keeps_full_float_precision(tmp_path):
    cb = CSVLogger(tmp_path / "log.csv")
    cb.on_train_start({})
    cb.on_step_end(1, {"loss": 0.1 + 0.2})
    assert read_csv_log(tmp_path / "log.csv")[0]["loss"] == 0.1 + 0.2


# --- check_callbacks --------------------------------------------------------------------------

class Typo:
    def on_batch_end(self, step, logs):  # Keras's name
        pass

    def on_train_end(self, logs):
        pass


def test_check_callbacks_catches_mistakes():
    assert check_callbacks(None) == []
    with pytest.raises(MnistflowError, match="a class: pass an instance"):
        check_callbacks([EarlyStopping])
    with pytest.raises(MnistflowError, match="none of the hook methods"):
        check_callbacks([object()])
    with pytest.raises(MnistflowError, match="a list of callback objects"):
        check_callbacks(EarlyStopping())
    with log.recording() as warned, log.quiet():
        assert len(check_callbacks([Typo()])) == 1
    assert len(warned) == 1 and "on_batch_end" in warned[0] and "on_step_end" in warned[0]


# --- inside a run -----------------------------------------------------------------------------

class Recorder:
    """Records every hook call; returns its own scalar on logged steps."""

    def __init__(self):
        self.calls: list[tuple] = []

    def on_train_start(self, logs):
        self.calls.append(("on_train_start", dict(logs)))

    def on_step_end(self, step, logs):
        self.calls.append(("on_step_end", step, dict(logs)))
        return {"twice_step": 2 * step}

    def on_validation_end(self, step, logs):
        self.calls.append(("on_validation_end", step, dict(logs)))

    def on_epoch_end(self, epoch, logs):
        self.calls.append(("on_epoch_end", epoch))

    def on_train_end(self, logs):
        self.calls.append(("on_train_end", dict(logs)))


def test_early_stopping_stops_a_run(synthetic_records, tmp_path):
    # min_delta 1.0: accuracy can never improve by that much, so patience=1 stops at the 2nd validation
    es = EarlyStopping("val_acc", patience=1, min_delta=1.0)
    s = mnistflow.train("conv3x3x4-relu,maxpool4,fc10", synthetic_records, callbacks=[es],
                        run_dir=tmp_path / "run", epochs=10, eval_every=3, **QUICK)
    assert s["stop_reason"] == "early_stopping"
    assert s["steps"] == 6 and es.stopped_step == 6 and es.best_step == 3
    recs = [json.loads(ln) for ln in RunDir(tmp_path / "run").metrics.read_text().splitlines()]
    assert [r["step"] for r in recs if r["kind"] == "val"] == [3, 6]
    assert RunDir(tmp_path / "run").model.is_file()  # a stopped run ends like any other


def test_callback_hooks_scalars_and_csv_match_metrics(synthetic_records, tmp_path):
    rec = Recorder()
    s = mnistflow.train("conv3x3x4-relu,maxpool4,fc10", synthetic_records,
                        callbacks=[rec, CSVLogger(tmp_path / "log.csv")], run_dir=tmp_path / "run",
                        max_steps=8, eval_every=4, **QUICK)
    names = [c[0] for c in rec.calls]
    assert names[0] == "on_train_start" and names[-1] == "on_train_end"
    start = rec.calls[0][1]
    assert start["total_steps"] == 8 and start["steps_per_epoch"] == 12  # 600 images / 50
    assert {"run_dir", "config"} <= set(start)
    assert rec.calls[-1][1]["steps"] == s["steps"] == 8
    steps = [c[1] for c in rec.calls if c[0] == "on_step_end"]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 8]  # every step
    logged = [c[1] for c in rec.calls if c[0] == "on_step_end" and "loss" in c[2]]
    assert logged == [2, 4, 6, 8]  # the measured scalars on logged steps (log_every=2)
    assert all({"epoch", "lr"} <= set(c[2]) for c in rec.calls if c[0] == "on_step_end")
    vals = [c for c in rec.calls if c[0] == "on_validation_end" and c[2].get("split") == "val"]
    assert [c[1] for c in vals] == [4, 8]
    assert all(c[2]["val_acc"] == c[2]["acc"] for c in vals)

    metrics = [json.loads(ln) for ln in RunDir(tmp_path / "run").metrics.read_text().splitlines()]
    # the scalars a callback returned are in metrics.jsonl at their step
    logged = {r["step"]: r["twice_step"] for r in metrics if "twice_step" in r}
    assert logged == {2: 4, 4: 8, 6: 12, 8: 16}
    # the CSV log holds the same training and validation numbers as metrics.jsonl
    rows = read_csv_log(tmp_path / "log.csv")
    assert [(r["kind"], r["step"]) for r in rows if r["kind"] == "train"] == [("train", k) for k in (2, 4, 6, 8)]
    by_key = {(r["kind"], r["step"]): r for r in metrics}
    for r in rows:
        m = by_key[(r["kind"], r["step"])]
        for k in ("loss", "acc", "lr"):
            if k in r:
                assert r[k] == m[k], (r, m)
    assert {("val", 4), ("val", 8)} <= {(r["kind"], r["step"]) for r in rows}


def test_a_callback_error_is_not_swallowed(synthetic_records, tmp_path):
    class Broken:
        def on_step_end(self, step, logs):
            raise ZeroDivisionError("user bug")

    with pytest.raises(ZeroDivisionError):
        mnistflow.train("conv3x3x4-relu,maxpool4,fc10", synthetic_records, callbacks=[Broken()],
                        run_dir=tmp_path / "run", max_steps=4, **QUICK)
