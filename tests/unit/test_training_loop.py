"""The training loop on synthetic digits: its "when" rules, the hook protocol, the resume
checkpoint read once, the configuration left untouched, warnings recorded."""
from __future__ import annotations

import copy
import json
import os
import signal

import pytest
import torch
import torch.nn as nn

from mnistflow.artifacts import checkpoint
from mnistflow.artifacts.rundir import RunDir
from mnistflow.core import log
from mnistflow.core.errors import MnistflowError
from mnistflow.training import resume as resumemod
from mnistflow.training.checkpointing import TrainingInterrupted
from mnistflow.training.hooks import Hooks, StopTraining
from mnistflow.training.api import train
from mnistflow.training.configure import configure
from mnistflow.training.loop import fit

SPEC = "conv3x3x4-relu,maxpool4,fc10"
# 600 training images / batch 50: 12 steps per epoch
QUICK = dict(model=SPEC, quiet=True, threads=1, tensorboard=False, batch_size=50, log_every=2,
             device="cpu")  # the unit tier runs on the CPU on any machine


@pytest.fixture(autouse=True)
def _no_malloc_tuning(monkeypatch):
    # runtime.cpu.tune_malloc finds libc through ctypes.util.find_library, which starts an
    # ldconfig process (refused in this tier); it changes no result
    monkeypatch.setenv("MNISTFLOW_MALLOC", "default")


def metrics(run) -> list[dict]:
    return [json.loads(ln) for ln in RunDir(run).metrics.read_text().splitlines()]


# --- Hooks.call ---------------------------------------------------------------------------------

def test_call_merges_returned_scalars_and_stops_after_every_hook():
    seen = []

    class A:
        def on_step_end(self, step, logs):
            return {"a": 1}

    class Stop:
        def on_step_end(self, step, logs):
            raise StopTraining("enough")

    class B:
        def on_step_end(self, step, logs):
            seen.append(dict(logs))

    logs = {"loss": 0.5}
    assert Hooks([A(), Stop(), B(), object()]).call("on_step_end", step=3, epoch=0, logs=logs) == "enough"
    assert seen == [{"loss": 0.5, "a": 1}]  # the hook after the stop was called, saw A's scalar
    assert Hooks([A()]).call("on_epoch_end", step=3, epoch=0, logs={}) is None  # no such method


def test_each_hook_method_gets_the_keywords_it_names():
    got = []

    class Keras:
        def on_epoch_end(self, epoch, logs):
            got.append(("keras", epoch, dict(logs)))

    class Steps:
        def on_epoch_end(self, step):
            got.append(("steps", step))

    class Everything:
        def on_epoch_end(self, **kw):
            got.append(("all", sorted(kw)))

    Hooks([Keras(), Steps(), Everything()]).call("on_epoch_end", step=40, epoch=1, logs={"val_acc": 0.9})
    assert got == [("keras", 1, {"val_acc": 0.9}), ("steps", 40), ("all", ["epoch", "logs", "step"])]


def test_a_hook_method_that_takes_what_no_event_passes_is_one_error():
    from mnistflow.training.callbacks import check_callbacks

    class Odd:
        def on_step_end(self, step, batch, logs):
            pass

    for check in (lambda: Hooks([Odd()]), lambda: check_callbacks([Odd()])):
        with pytest.raises(MnistflowError, match=r"Odd.on_step_end takes batch; a hook method takes any "
                                                 r"of step, epoch, logs \(by name\)"):
            check()


@pytest.mark.parametrize("out", [[1], {"x": "text"}, {"x": True}, {3: 1.0}])
def test_call_names_the_hook_that_returns_something_else(out):
    class Bad:
        def on_validation_end(self, step, logs):
            return out

    with pytest.raises(MnistflowError, match="Bad.on_validation_end"):
        Hooks([Bad()]).call("on_validation_end", step=1, epoch=0, logs={})


# --- the loop's rules ---------------------------------------------------------------------------

class Recorder:
    def __init__(self):
        self.calls = []
        self.every_step = []
        self.epoch_logs = []

    def on_train_start(self, logs):
        self.calls.append(("start", logs["total_steps"], logs["steps_per_epoch"]))

    def on_step_end(self, step, logs):
        if "loss" in logs:  # a logged step: the measured scalars (every step has epoch and lr)
            self.calls.append(("step", step))
        self.every_step.append((step, sorted(logs)))

    def on_validation_end(self, step, logs):
        self.calls.append((logs["split"], step))

    def on_epoch_end(self, epoch, logs):
        self.calls.append(("epoch", epoch, logs["step"]))
        self.epoch_logs.append(dict(logs))
        return {"epochs_done": epoch + 1}

    def on_train_end(self, logs):
        self.calls.append(("end", logs["steps"]))


def test_logs_evaluations_epochs_and_the_end_in_order(synthetic_records, tmp_path):
    rec = Recorder()
    cfg = configure(None, data=str(synthetic_records), run_dir=str(tmp_path / "r"), epochs=2,
                         keep_checkpoints=0, **{**QUICK, "log_every": 5})[0]
    s = fit(cfg, callbacks=[rec])
    assert s["steps"] == 24 and s["stop_reason"] == "epochs"
    # logged every 5 steps and at each epoch's last step; val at each epoch end; test at the end
    assert rec.calls == [("start", 24, 12), ("step", 5), ("step", 10), ("step", 12), ("val", 12),
                         ("epoch", 0, 12), ("step", 15), ("step", 20), ("step", 24), ("val", 24),
                         ("epoch", 1, 24), ("test", 24), ("end", 24)]
    # on_step_end comes every step (Keras' on_train_batch_end), the cheap logs on unlogged steps
    assert [st for st, _ in rec.every_step] == list(range(1, 25))
    assert rec.every_step[0][1] == ["epoch", "lr"] and "loss" in rec.every_step[4][1]
    # on_epoch_end: the epoch's training loss and accuracy, and the validation pass at its end
    assert [sorted(e) for e in rec.epoch_logs] == [["acc", "epoch", "loss", "step", "val_acc", "val_loss"]] * 2
    assert all(0 <= e["acc"] <= 1 and e["loss"] > 0 for e in rec.epoch_logs)
    recs = metrics(tmp_path / "r")
    assert [(r["kind"], r["step"], r["epochs_done"]) for r in recs if r["kind"] == "epoch"] == \
        [("epoch", 12, 1), ("epoch", 24, 2)]
    assert not [r for r in recs if "val_acc" in r]  # no repeat of acc / loss under a second name


def test_a_stop_from_a_hook_ends_the_run_like_any_other(synthetic_records, tmp_path):
    class StopAt:
        def on_step_end(self, step, logs):
            if step == 6:
                raise StopTraining("enough")

    cfg = configure(None, data=str(synthetic_records), run_dir=str(tmp_path / "r"), epochs=3, **QUICK)[0]
    s = fit(cfg, callbacks=[StopAt()])
    assert s["steps"] == 6 and s["stop_reason"] == "enough" and s["test_acc"] is not None
    assert RunDir(tmp_path / "r").model.is_file()
    last = RunDir(tmp_path / "r").checkpoints / checkpoint.checkpoint_name(6)
    assert checkpoint.read_header(last)["reason"] == "final"
    assert [r["kind"] for r in metrics(tmp_path / "r") if r["step"] == 6] == ["train", "test"]


def test_checkpoints_every_n_steps_at_the_epoch_end_and_at_the_end(synthetic_records, tmp_path):
    train(data=synthetic_records, run_dir=tmp_path / "r", epochs=2, max_steps=20, checkpoint_every=5,
          keep_checkpoints=10, validate=False, **QUICK)
    folder = RunDir(tmp_path / "r").checkpoints
    reasons = {s: checkpoint.read_header(p)["reason"] for s, p in checkpoint.step_files(folder)}
    assert reasons == {5: "every", 10: "every", 15: "every", 20: "final"}
    # a checkpoint at an epoch's end is taken after its bookkeeping: it continues in the next epoch
    train(data=synthetic_records, run_dir=tmp_path / "e", epochs=2, max_steps=20, checkpoint_every=12,
          keep_checkpoints=10, validate=False, **QUICK)
    head = checkpoint.read_header(RunDir(tmp_path / "e").checkpoints / checkpoint.checkpoint_name(12))
    assert (head["reason"], head["epoch"], head["step_in_epoch"]) == ("every", 1, 0)


def test_a_signal_saves_at_the_end_of_the_step_and_stops(synthetic_records, tmp_path):
    class Signal:
        def on_step_end(self, step, logs):
            if step == 4:
                os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets a flag

    cfg = configure(None, data=str(synthetic_records), run_dir=str(tmp_path / "r"), epochs=2,
                         max_steps=20, **QUICK)[0]
    with pytest.raises(TrainingInterrupted) as e:
        fit(cfg, callbacks=[Signal()])
    assert e.value.step == 4 and e.value.exit_code == 143
    assert checkpoint.read_header(e.value.path)["reason"] == "interrupt"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are restored
    s = train(run_dir=tmp_path / "r", resume=True, quiet=True)  # continues to the end
    assert s["steps"] == 20 and s["resumed_from"].endswith("step-000004.pt")


def test_fit_leaves_the_callers_config_unchanged(synthetic_records, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default run directory: runs/<name>-<time>
    cfg = configure(None, model="softmax", data=str(synthetic_records), batch_size="auto",
                         max_steps=3, quiet=True, threads=1, tensorboard=False, keep_checkpoints=0)[0]
    before = copy.deepcopy(cfg)
    s = fit(cfg)
    assert cfg == before and cfg.batch_size == "auto" and cfg.run_dir is None
    assert isinstance(s["global_batch"], int)
    saved = (RunDir(s["run_dir"]).config).read_text()
    assert f"batch_size = {s['global_batch']}" in saved and "run_dir" not in saved


def test_resume_reads_the_checkpoint_once(synthetic_records, tmp_path, monkeypatch):
    train(data=synthetic_records, run_dir=tmp_path / "r", max_steps=4, **QUICK)
    reads = []
    real = checkpoint.load
    monkeypatch.setattr(checkpoint, "load", lambda p: reads.append(p) or real(p))
    s = train(run_dir=tmp_path / "r", resume=True, max_steps=6, quiet=True)
    assert s["steps"] == 6 and len(reads) == 1


def test_resume_refuses_another_model_naming_the_setting(synthetic_records, tmp_path):
    train(data=synthetic_records, run_dir=tmp_path / "r", max_steps=2, **QUICK)
    with pytest.raises(MnistflowError, match="model: conv3x3x4-relu,maxpool4,fc10 -> softmax"):
        train(run_dir=tmp_path / "r", resume=True, model="softmax", quiet=True)


# --- a user's model and loss ----------------------------------------------------------------------

class Flat(nn.Module):
    def __init__(self, inputs: int):
        super().__init__()
        self.fc = nn.Linear(inputs, 10)

    def forward(self, x):
        return self.fc(x.flatten(1))


def test_a_model_that_cannot_take_the_input_names_its_shape(synthetic_records, tmp_path):
    cfg = configure(None, data=str(synthetic_records), run_dir=str(tmp_path / "r"), max_steps=2, **QUICK)[0]
    with pytest.raises(MnistflowError, match=r"cannot take input of shape \(N, 1, 28, 28\): RuntimeError"):
        fit(cfg, model=Flat(100))
    with pytest.raises(MnistflowError, match=r"expected \(N, 10\)"):
        fit(cfg, model=nn.Flatten())


def test_a_ready_model_and_loss_function_are_trained(synthetic_records, tmp_path):
    calls = []

    def loss_fn(logits, targets):
        calls.append(logits.shape)
        return nn.functional.cross_entropy(logits, targets)

    model = Flat(784)
    w0 = model.fc.weight.detach().clone()
    cfg = configure(None, data=str(synthetic_records), run_dir=str(tmp_path / "r"), max_steps=5,
                    **{**QUICK, "model": "tests.somewhere:Flat", "model_kwargs": {"inputs": 784}})[0]
    s = fit(cfg, model=model, loss_fn=loss_fn)  # the config says how to rebuild the module given
    assert s["steps"] == 5 and len(calls) == 5 and calls[0] == (50, 10)
    assert not torch.equal(model.fc.weight.detach(), w0)  # trained in place
    from mnistflow.artifacts.model_file import read_model_file

    _, info = read_model_file(RunDir(tmp_path / "r").model)
    assert (info.factory, info.factory_kwargs) == ("tests.somewhere:Flat", {"inputs": 784})


# --- numbers that become NaN/inf, and a target no evaluation measures -----------------------------

def test_weights_that_blow_up_on_the_last_step_are_the_nan_error_and_no_model(synthetic_records, tmp_path):
    def loss_fn(logits, targets):
        calls.append(1)
        loss = nn.functional.cross_entropy(logits, targets)
        # the last step's loss is finite, its gradient NaN (d sqrt(u)/du is inf at 0, times 0):
        # no loss of the run sees the weights it leaves
        return loss + torch.sqrt((logits * 0).sum()) if len(calls) == 12 else loss

    calls = []
    cfg = configure(None, data=str(synthetic_records), run_dir=str(tmp_path / "r"), epochs=1,
                         precision="fp32", **QUICK)[0]
    with pytest.raises(MnistflowError, match=r"^the weights became NaN/inf at step 11 \(epoch 1\); stopped"):
        fit(cfg, loss_fn=loss_fn)
    run = RunDir(tmp_path / "r")
    assert len(calls) == 12 and not run.model.exists() and not run.summary.exists()
    assert [r["step"] for r in metrics(tmp_path / "r") if r["kind"] == "val"] == [12]  # what it recorded stays


def test_a_target_on_a_split_the_records_lack_is_refused_before_work(tmp_path):
    from helpers.synthetic import write_records

    records = write_records(tmp_path / "no-val", n_train=100, n_test=50, val_size=0)
    settings = dict(data=str(records), max_steps=2, target_acc=0.01, **QUICK)
    with pytest.raises(MnistflowError, match="the val split, which these records do not hold: "
                                             "add --target-split test"):
        train(run_dir=tmp_path / "r", **settings)
    assert not (tmp_path / "r").exists()
    s = train(run_dir=tmp_path / "t", target_split="test", **settings)  # the test pass judges it
    assert s["stop_reason"] == "target" and s["time_to_target_s"] is not None


# --- warnings -------------------------------------------------------------------------------------

class Warns:
    def on_train_start(self, logs):
        log.warn("something to know")


@pytest.mark.parametrize("quiet", [True, False])
def test_warnings_are_recorded_in_the_summary_and_quiet_silences_them(synthetic_records, tmp_path, capsys,
                                                                      quiet):
    cfg = configure(None, data=str(synthetic_records), run_dir=str(tmp_path / "r"), max_steps=2,
                         **{**QUICK, "quiet": quiet})[0]
    s = fit(cfg, callbacks=[Warns()])
    assert s["warnings"] == ["something to know"]
    assert json.loads(RunDir(tmp_path / "r").summary.read_text())["warnings"] == ["something to know"]
    assert set(s["kernels"]) >= {"native", "ops"}
    err = capsys.readouterr().err
    assert ("mnistflow: warning: something to know" in err) is not quiet
