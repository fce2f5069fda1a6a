"""Checkpoint files: atomic and checksummed, keep-K + best rotation, strict loading, no pickle."""
from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.nn as nn
from safetensors.torch import load_file

from helpers import inject
from helpers.cli import assert_one_line_error, run_cli
from mnistflow.artifacts import checkpoint
from mnistflow.core.errors import MnistflowError
from mnistflow.models import create_model
from mnistflow.training.api import train

QUIET = dict(quiet=True, threads=1, tensorboard=False)


def _small_run(records, run_dir, **kw):
    args = dict(model="mlp", data=str(records), run_dir=str(run_dir), max_steps=30, batch_size=64,
                augment="auto", checkpoint_every=10, eval_every=10, log_every=10, **QUIET)
    args.update(kw)
    return train(**args)


def test_run_keeps_last_k_and_best_with_pointers_and_everything_to_resume(mnist_records, tmp_path):
    run = tmp_path / "run"
    s = _small_run(mnist_records, run, max_steps=60, keep_checkpoints=3)
    folder = run / "checkpoints"
    files = checkpoint.step_files(folder)
    steps = [st for st, _ in files]
    best = checkpoint.read_pointer(folder, "best")
    assert steps[-3:] == [40, 50, 60] and len(steps) == 3 + (best.name not in {f.name for _, f in files[-3:]})
    assert checkpoint.read_pointer(folder, "last").name == "step-000060.pt" == s["checkpoint"].split("/")[-1]
    vals = {st: checkpoint.read_header(p)["metric"]["value"] for st, p in files}
    assert checkpoint.read_header(best)["metric"]["value"] == max(vals.values())
    for _, p in files:
        head = checkpoint.verify(p)
        assert head["format_version"] == checkpoint.FORMAT_VERSION == 1 and len(head["payload_sha256"]) == 64
    assert not list(folder.glob(".*.tmp-*"))

    payload = checkpoint.load(folder / "step-000060.pt")
    assert set(checkpoint.PAYLOAD_KEYS) <= set(payload)
    plain = torch.load(folder / "step-000060.pt", weights_only=True)  # a standard torch file
    assert set(plain) == set(checkpoint.PAYLOAD_KEYS) and plain["train_state"] == payload["train_state"]
    assert all(torch.equal(plain["model"][k], v) for k, v in payload["model"].items())
    final = load_file(str(run / "model.safetensors"))
    assert list(payload["model"]) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight",
                                      "fc3.bias"]  # the unwrapped model's names
    assert set(payload["model"]) == set(final)
    assert all(torch.equal(payload["model"][k], final[k]) for k in final)
    assert payload["optimizer"]["state"] and payload["optimizer"]["param_groups"][0]["lr"] > 0
    assert payload["train_state"]["step"] == 60 and payload["train_state"]["step_in_epoch"] == 60
    assert payload["train_state"]["epoch"] == 0 and payload["train_state"]["samples"] == 60 * 64
    assert payload["train_state"]["metrics"]["val_acc"] == s["val_acc"]
    assert payload["config"]["model"] == "mlp" and payload["config"]["augment"] == "glyphs"
    assert payload["config"]["resume"] is None
    rng = payload["rng"]
    assert isinstance(rng["torch"], torch.Tensor) and isinstance(rng["numpy"]["keys"], torch.Tensor)
    assert isinstance(rng["python"]["state"], torch.Tensor) and rng["python"]["state"].numel() == 625
    assert payload["scheduler"]["step"] == 60 and payload["scaler"] is None
    assert payload["data"]["name"] == "mnist" and len(payload["data"]["sha256"]) == 64
    assert payload["model_info"]["class_names"] == [str(i) for i in range(10)]
    # a fresh (non-resume) run into this directory would mix two runs: refused
    with pytest.raises(MnistflowError, match="holds a run already .*checkpoints.*continue it with --resume"):
        _small_run(mnist_records, run)


def test_best_is_kept_beyond_the_last_k(tmp_path):
    folder = tmp_path / "checkpoints"
    ck = checkpoint.CheckpointDir(folder, keep=2)
    for step, acc in zip(range(1, 6), [0.5, 0.9, 0.6, 0.7, 0.8]):
        ck.save(step, {"train_state": {"step": step}}, {"name": "val_acc", "value": acc, "step": step})
    assert [s for s, _ in checkpoint.step_files(folder)] == [2, 4, 5]
    assert (folder / "best").read_text().strip() == "step-000002.pt"
    assert (folder / "last").read_text().strip() == "step-000005.pt"
    again = checkpoint.CheckpointDir(folder, keep=2)  # a resumed run knows the best so far
    assert again.best_value == 0.9
    again.save(6, {"train_state": {"step": 6}}, None)  # no evaluation at this step: not a candidate
    assert [s for s, _ in checkpoint.step_files(folder)] == [2, 5, 6]
    again.save(7, {"train_state": {"step": 7}}, {"name": "val_acc", "value": 0.95, "step": 7})
    assert [s for s, _ in checkpoint.step_files(folder)] == [6, 7]
    assert (folder / "best").read_text().strip() == "step-000007.pt"


def test_corrupt_and_truncated_checkpoints_are_reported_skipped_and_resume_uses_the_previous(
        mnist_records, tmp_path, capsys):
    run = tmp_path / "run"
    _small_run(mnist_records, run, max_steps=30, keep_checkpoints=5)
    final_ref = (run / "model.safetensors").read_bytes()
    folder = run / "checkpoints"
    f10, f20, f30 = (folder / f"step-0000{s}.pt" for s in (10, 20, 30))
    data = bytearray(f30.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit in the payload (the weights)
    f30.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CorruptCheckpoint, match="sha256"):
        checkpoint.load(f30)
    assert checkpoint.find_latest(folder) == f20
    err = capsys.readouterr().err
    assert "step-000030.pt" in err and "falling back to the previous checkpoint step-000020.pt" in err
    f20.write_bytes(f20.read_bytes()[:-4096])  # a torn write (what atomic saves prevent)
    with pytest.raises(checkpoint.CorruptCheckpoint, match="truncated"):
        checkpoint.load(f20)
    (folder / "step-000040.pt").write_bytes(b"garbage")
    assert checkpoint.find_latest(folder) == f10
    assert len([ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("mnistflow: warning:")]) == 3

    # resuming reports the bad files, continues from step 10 and ends exactly where the
    # uninterrupted run ended
    proc = run_cli("train", "--resume", "--run-dir", str(run), "--threads", "1", "--no-quiet")
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("mnistflow: warning:")]
    assert len(warnings) == 3 and all(".pt: " in w for w in warnings), proc.stderr
    assert "resumed from" in proc.stdout and "step-000010.pt: step 10" in proc.stdout
    assert (run / "model.safetensors").read_bytes() == final_ref
    assert sorted(p.name for p in (folder / "superseded").iterdir()) == \
        ["step-000020.pt", "step-000030.pt", "step-000040.pt"]
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["kind"] == "train"] == [10, 20, 30]  # no duplicates


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))  # would create the marker file if unpickled


def test_pickle_payloads_are_refused_and_never_executed(tmp_path):
    marker = tmp_path / "executed"
    # 1. a well-formed checkpoint (header, correct checksum) whose payload needs arbitrary pickle
    forged = tmp_path / "forged.pt"
    buf = io.BytesIO()
    torch.save({"format_version": 1, "model": _Evil(marker)}, buf)
    forged.write_bytes(checkpoint.seal(buf.getvalue(), {"step": 1}))
    checkpoint.verify(forged)  # the checksum is fine...
    with pytest.raises(MnistflowError, match="refused: the file carries a pickle payload"):
        checkpoint.load(forged)  # ...but the content is refused
    # 2. a plain torch.save() pickle, and 3. an npz with an object array, through the CLI
    plain = tmp_path / "plain.pt"
    torch.save({"w": _Evil(marker)}, plain)
    objnpz = tmp_path / "obj.npz"
    np.savez(objnpz, w=np.array([_Evil(marker)], dtype=object))
    for path, fragment in ((forged, "refused: the file carries a pickle payload"),
                           (plain, "refused: the file carries a pickle payload"),
                           (objnpz, "refused: the npz holds pickled objects")):
        assert_one_line_error(run_cli("eval", str(path), "--model", "mlp"), str(path.name), fragment)
    assert not marker.exists()


def test_unwrapped_model_is_saved_and_restore_is_strict(tmp_path):
    model = create_model("fast")
    compiled = torch.compile(model)  # wraps as _orig_mod (compiles lazily: nothing runs here)

    class DDPLike(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.module = m

    wrapped = DDPLike(compiled)
    assert next(iter(wrapped.state_dict())).startswith("module._orig_mod.")
    opt = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
    payload = checkpoint.capture(wrapped, opt, None, {"step": 0}, {"model": "fast"})
    assert list(payload["model"]) == list(model.state_dict())  # features.0.weight, ... no prefixes
    path = checkpoint.write(tmp_path / "c.pt", payload)
    loaded = checkpoint.load(path)

    fresh = create_model("fast")
    checkpoint.restore(loaded, DDPLike(torch.compile(fresh)), torch.optim.SGD(fresh.parameters(), 0.1,
                                                                             momentum=0.9), rng=False)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))

    def broken(edit):
        p = dict(loaded)
        p["model"] = dict(loaded["model"])
        edit(p["model"])
        return p

    cases = [(lambda sd: sd.update({"extra.weight": torch.zeros(1)}), "unexpected: extra.weight"),
             (lambda sd: sd.pop("head.weight"), "missing: head.weight"),
             (lambda sd: sd.update({"head.weight": torch.zeros(3, 96)}), "shape mismatch: head.weight")]
    for edit, fragment in cases:
        with pytest.raises(MnistflowError, match=fragment.replace(".", r"\.")):
            checkpoint.restore(broken(edit), create_model("fast"), None, rng=False)
    with pytest.raises(MnistflowError, match="optimizer state does not fit"):
        checkpoint.restore(loaded, create_model("fast"), torch.optim.SGD(nn.Linear(2, 2).parameters(), 0.1),
                           rng=False)


def test_rng_states_round_trip_through_weights_only_loading():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in Python's state
    state = checkpoint.rng_state()
    buf = io.BytesIO()
    torch.save(state, buf)
    back = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)

    def draw():
        return (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), np.random.randn(),
                torch.rand(3).tolist(), torch.randn(2).tolist())

    first = draw()
    checkpoint.set_rng_state(back)
    assert draw() == first


def test_a_fault_injected_by_the_tests_reaches_a_child_process(tmp_path):
    """``helpers.inject.env`` (the package has no test hook): a child Python process writing a
    checkpoint holds the written temp file for the injected seconds before the rename."""
    target = tmp_path / "step-000001.pt"
    code = ("import sys, torch; from mnistflow.artifacts import checkpoint; "
            "checkpoint.write(sys.argv[1], {'w': torch.zeros(1000)})")
    proc = subprocess.Popen([sys.executable, "-c", code, str(target)], env={**os.environ, **inject.env(slow_save=3)})
    try:
        t0 = time.monotonic()
        while not list(tmp_path.glob(".step-000001.pt.tmp-*")):
            assert proc.poll() is None and time.monotonic() - t0 < 60, "no temp file"
            time.sleep(0.01)
        time.sleep(1)  # without the fault the rename comes within milliseconds
        assert list(tmp_path.glob(".step-000001.pt.tmp-*")) and not target.exists()
    finally:
        assert proc.wait(timeout=60) == 0
    checkpoint.verify(target)
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
