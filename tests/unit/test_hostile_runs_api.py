"""The third sweep's Python API findings (issue 40): a callback's scalars never overwrite the run's
own metric fields and are written as JSON (R13); a model, a callback or an argument that cannot
work is one ``MnistflowError`` naming it, never a raw autograd or matmul error."""
from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn as nn

import mnistflow
from mnistflow.artifacts.rundir import RunDir
from mnistflow.core.errors import MnistflowError
from mnistflow.models import registry

QUICK = dict(quiet=True, threads=1, tensorboard=False, keep_checkpoints=0, batch_size=50)


def _strict(line: str) -> dict:
    """A JSON line as a strict parser reads it: NaN / Infinity are not JSON."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(line, parse_constant=refuse)


# --- R13: a callback's returned scalars ----------------------------------------------------------

class _Returns:
    def __init__(self, out: dict, event: str = "on_step_end"):
        setattr(self, event, lambda step, logs: dict(out))


@pytest.mark.parametrize("out, event, key", [
    ({"loss": 5.0, "step": 999999}, "on_step_end", "loss"),  # the reproduction (P25)
    ({"kind": 1}, "on_step_end", "kind"),
    ({"lr": 0.1}, "on_step_end", "lr"),
    ({"rss_mb": 1.0}, "on_step_end", "rss_mb"),  # added by mnistflow's memory watch before it
    ({"n": 3}, "on_validation_end", "n"),
    ({"val_acc": 1.0}, "on_epoch_end", "val_acc"),
    ({"steps": 1}, "on_train_end", "steps"),  # a summary field
])
def test_a_callback_cannot_overwrite_the_runs_own_fields(synthetic_records, tmp_path, out, event, key):
    """R13: before, every train record said "step": 999999, "loss": 5.0 (and a resume then
    dropped them all); now one line naming the name."""
    run = tmp_path / "run"
    with pytest.raises(MnistflowError) as e:
        mnistflow.train("softmax", synthetic_records, run_dir=run, max_steps=12, log_every=5,
                        callbacks=[_Returns(out, event)], **QUICK)
    assert f"_Returns.{event} returned '{key}', a name the run logs itself" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_callbacks_own_names_are_logged_and_a_nan_is_json_null(synthetic_records, tmp_path):
    """R13 (minor): a NaN scalar was written to metrics.jsonl as a bare NaN (not JSON)."""
    run = tmp_path / "run"
    mnistflow.train("softmax", synthetic_records, run_dir=run, max_steps=10, log_every=5,
                    callbacks=[_Returns({"my_loss": 5.0, "gap": float("nan"), "big": float("inf")})], **QUICK)
    train = [r for r in map(_strict, RunDir(run).metrics.read_text().splitlines()) if r["kind"] == "train"]
    assert [r["step"] for r in train] == [5, 10]
    assert all(r["my_loss"] == 5.0 and r["gap"] is None and r["big"] is None and r["loss"] != 5.0
               for r in train)


# --- models and callbacks that cannot train ------------------------------------------------------

class _IntLogits(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        return self.fc(x.flatten(1)).round().long()


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        return self.fc(x.flatten(1))


class _Frozen(_Net):
    def __init__(self):
        super().__init__()
        self.fc.requires_grad_(False)


@pytest.mark.parametrize("model, message", [
    (_IntLogits(), "is a torch.int64 tensor; expected floating-point scores (logits)"),
    (_Frozen(), "has every parameter frozen (requires_grad=False, all 2): there is nothing to train"),
])
def test_a_model_that_cannot_learn_is_one_line(synthetic_records, tmp_path, model, message):
    """Before: ``element 0 of tensors does not require grad`` (a raw autograd error)."""
    with pytest.raises(MnistflowError, match=re.escape(message)):
        mnistflow.train(model, synthetic_records, run_dir=tmp_path / "run", max_steps=2, **QUICK)
    assert not (tmp_path / "run").exists()


class _Reshapes:
    """Gives a weight another shape through ``.data`` (the same Parameter object) at a step."""

    def __init__(self, at: int):
        self.at = at

    def on_train_start(self, logs):
        pass

    def on_step_end(self, step, logs):
        if step == self.at:
            self.model.fc.weight.data = torch.zeros(3, 3)


@pytest.mark.parametrize("at", [3, 5])  # a plain step (the next forward fails), a logged step
def test_a_callback_that_reshapes_a_weight_is_named(synthetic_records, tmp_path, at):
    """Before: a raw matmul error (``mat1 and mat2 shapes cannot be multiplied``)."""
    model = _Net()
    cb = _Reshapes(at)
    cb.model = model
    with pytest.raises(MnistflowError, match=r"the model changed during training .*: replaced param "
                                             r"fc\.weight \(shape \(10, 784\) -> \(3, 3\)\)"):
        mnistflow.train(model, synthetic_records, run_dir=tmp_path / "run", max_steps=8, log_every=5,
                        callbacks=[cb], **QUICK)


# --- arguments of the wrong kind -------------------------------------------------------------------

def test_export_refuses_an_out_that_is_no_path(tmp_path):
    """Before: ``export(out=5)`` was a raw TypeError."""
    for kw, message in ((dict(out=5), "out is a path (str or os.PathLike), not int 5"),
                        (dict(model_path=5), "model_path is a path (str or os.PathLike), not int 5")):
        with pytest.raises(MnistflowError, match=re.escape(message)):
            mnistflow.export(**{"model_path": tmp_path, "format": "onnx", **kw})


@pytest.mark.parametrize("factory, name, message", [
    (5, "five", "register_model takes a model class or factory, not int 5"),
    (_Frozen, "a,b", "cannot register a model as 'a,b': a model name takes letters, digits"),
    (_Frozen, "fast x3", "cannot register a model as 'fast x3': a model name takes letters"),
    (_Frozen, "fast-x3", "cannot register a model as 'fast-x3': it names an ensemble"),
    (_Frozen, "conv5x5x32", "cannot register a model as 'conv5x5x32': it reads as a layer spec"),
    (_Frozen, "pkg.mod:net", "cannot register a model as 'pkg.mod:net': a model name takes"),
    (_Frozen, "softmax", "model 'softmax' registered twice"),
])
def test_register_model_refuses_what_model_could_not_name(factory, name, message):
    """Before: ``register_model(5, name=...)`` and names with ',' or ' x3' were accepted."""
    before = registry.list_models()
    with pytest.raises(MnistflowError, match=re.escape(message)):
        registry.register_model(factory, name=name)
    assert registry.list_models() == before


# --- R12: train --compile with a full disk ----------------------------------------------------------

def test_compile_refuses_a_full_temporary_directory_before_it_starts(synthetic_records, tmp_path, monkeypatch):
    """R12 (CO02), the check before the compile: a full TMPDIR (or cache directory) is one line
    naming it (the reproduction itself, a real full tmpfs: tests/integration/test_hostile_runs.py)."""
    from mnistflow.runtime import compile_room

    full = tmp_path / "full"
    full.mkdir()
    real = compile_room.shutil.disk_usage
    monkeypatch.setattr(compile_room.shutil, "disk_usage",
                        lambda p: real(p)._replace(free=4096) if str(p) == str(full) else real(p))
    monkeypatch.setenv("TMPDIR", str(full))
    with pytest.raises(MnistflowError, match=re.escape(
            f"{full}: --compile needs room for the code it generates: the temporary directory (TMPDIR) the C++ "
            "compiler writes to has 0.0 MB free (at least 64 MB): free some, set TMPDIR to a folder with room")):
        mnistflow.train("softmax", synthetic_records, run_dir=tmp_path / "run", max_steps=2, compile=True, **QUICK)
    assert not (tmp_path / "run").exists()


class _CompiledOutOfSpace(nn.Module):
    """What ``torch.compile`` gives when the disk fills during the compile: its first call
    raises inductor's error, which wraps the OSError."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        try:
            raise OSError(28, "No space left on device", "/tmp/x/ccKv3rLd.s")
        except OSError as e:
            raise RuntimeError("InductorError: CppCompileError: C++ compile error") from e


def test_compile_that_runs_out_of_space_midway_is_one_line(synthetic_records, tmp_path, monkeypatch):
    """R12: the room was there when it started, and ran out during the compile: before, rc 1
    and 144 lines (inductor's traceback, the compiler's command and output)."""
    monkeypatch.setattr(torch, "compile", _CompiledOutOfSpace)
    with pytest.raises(MnistflowError, match="--compile ran out of disk space writing the code it generates, in "):
        mnistflow.train("softmax", synthetic_records, run_dir=tmp_path / "run", max_steps=2, compile=True, **QUICK)
    assert not (tmp_path / "run").exists()
