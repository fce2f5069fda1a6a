"""The checkpoint file format (version 2: a standard torch.save zip plus a checksummed header
entry), the reading of version-1 files, and the strict restore."""
from __future__ import annotations

import io
import os
import tracemalloc
import zipfile

import pytest
import torch
import torch.nn as nn

from helpers.blocking import deadline
from mnistflow.artifacts import checkpoint, runlog
from mnistflow.artifacts.load import load_any
from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError

INFO = {"model": "mlp", "in_shape": [1, 28, 28], "class_names": [str(i) for i in range(10)],
        "mean": [33.0], "std": [78.0]}


def _payload(model: nn.Module | None = None) -> dict:
    from mnistflow.models import create_model

    torch.manual_seed(0)
    model = model or create_model("mlp")
    opt = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
    model(torch.randn(4, 1, 28, 28)).sum().backward()
    opt.step()
    return checkpoint.capture(model, opt, None, {"step": 7, "epoch": 0}, {"model": "mlp"},
                              model_info=dict(INFO))


def test_a_fresh_checkpoint_opens_with_plain_torch_load(tmp_path):
    payload = _payload()
    path = checkpoint.write(tmp_path / "step-000007.pt", payload, {"step": 7, "reason": "test"})
    plain = torch.load(path, weights_only=True)  # no mnistflow needed to read it
    assert set(plain) == set(checkpoint.PAYLOAD_KEYS) and plain["format_version"] == 1
    assert all(torch.equal(plain["model"][k], v) for k, v in payload["model"].items())
    assert plain["optimizer"]["state"] and plain["train_state"]["step"] == 7
    head = checkpoint.verify(path)
    assert head["format_version"] == 1 and head["step"] == 7 and len(head["payload_sha256"]) == 64
    assert checkpoint.read_header(path) == head and checkpoint.is_checkpoint_file(path)
    loaded = checkpoint.load(path)
    assert loaded["header"]["reason"] == "test"
    assert all(torch.equal(loaded["model"][k], v) for k, v in payload["model"].items())


def test_altered_and_truncated_files_are_corrupt_never_loaded(tmp_path):
    path = checkpoint.write(tmp_path / "c.pt", _payload())
    data = path.read_bytes()
    head = checkpoint.verify(path)
    with zipfile.ZipFile(path) as z:  # flip one bit inside a tensor's bytes
        info = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
    at = info.header_offset + 30 + len(info.filename) + len(info.extra) + 8
    assert at < head["payload_bytes"]
    bad = bytearray(data)
    bad[at] ^= 0x01
    (tmp_path / "flip.pt").write_bytes(bytes(bad))
    with pytest.raises(checkpoint.CorruptCheckpoint, match="sha256"):
        checkpoint.load(tmp_path / "flip.pt")
    for name, blob in (("cut.pt", data[:-4096]), ("tail.pt", data[:-10]), ("half.pt", data[: len(data) // 2])):
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(checkpoint.CorruptCheckpoint, match="truncated"):
            checkpoint.load(tmp_path / name)
    end = bytearray(data)
    end[-100] ^= 0x01  # in the zip's directory
    (tmp_path / "dir.pt").write_bytes(bytes(end))
    with pytest.raises(checkpoint.CorruptCheckpoint):
        checkpoint.verify(tmp_path / "dir.pt")
        checkpoint.load(tmp_path / "dir.pt")
    (tmp_path / "garbage.pt").write_bytes(b"garbage")
    with pytest.raises(checkpoint.CorruptCheckpoint, match="not a mnistflow checkpoint"):
        checkpoint.load(tmp_path / "garbage.pt")
    assert not checkpoint.is_checkpoint_file(tmp_path / "garbage.pt")


def test_a_plain_torch_save_is_not_a_checkpoint(tmp_path):
    torch.save({"w": torch.zeros(2)}, tmp_path / "plain.pt")
    assert not checkpoint.is_checkpoint_file(tmp_path / "plain.pt")
    with pytest.raises(checkpoint.CorruptCheckpoint, match="not a mnistflow checkpoint"):
        checkpoint.verify(tmp_path / "plain.pt")
    with pytest.raises(MnistflowError, match="a plain torch file of 1 entries"):
        load_any(tmp_path / "plain.pt")


def test_a_pickle_payload_with_a_valid_checksum_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("executed",))

    buf = io.BytesIO()
    torch.save({"format_version": 1, "model": Evil()}, buf)
    (tmp_path / "forged.pt").write_bytes(checkpoint.seal(buf.getvalue(), {"step": 1}))
    checkpoint.verify(tmp_path / "forged.pt")  # the checksum is right...
    with pytest.raises(MnistflowError, match="refused: the file carries a pickle payload"):
        checkpoint.load(tmp_path / "forged.pt")  # ...the content is refused


def test_a_checkpoint_of_another_format_version_is_refused(tmp_path, monkeypatch):
    """No compatibility layer before the first release: one format version, refused by name."""
    body = checkpoint._serialize(_payload())
    with monkeypatch.context() as m:
        m.setattr(checkpoint, "FORMAT_VERSION", 2)  # as a later mnistflow would write it
        (tmp_path / "other.pt").write_bytes(checkpoint.seal(body, {"step": 7}))
    with pytest.raises(MnistflowError, match=r"checkpoint format version 2 is not supported \(this mnistflow "
                                             r"reads version 1\)"):
        checkpoint.verify(tmp_path / "other.pt")


def test_restore_is_strict_and_names_what_does_not_fit():
    from mnistflow.models import create_model

    payload = _payload()
    fresh = create_model("mlp")
    checkpoint.restore(payload, fresh, None, rng=False)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in payload["model"].items())
    wrong = create_model("mlp", (1, 28, 28), 5)
    with pytest.raises(MnistflowError, match=r"shape mismatch: fc3\.weight \(file 10x\d+, model 5x\d+\)"):
        checkpoint.restore(payload, wrong, None, rng=False)


# --- candidates that must not be read: devices, FIFOs, files over the cap -----------------------


def _zero_link(p):
    p.symlink_to("/dev/zero")


def _sparse(p):
    with open(p, "wb") as f:
        f.truncate(limits.MAX_CHECKPOINT_BYTES + 1)


@pytest.mark.parametrize("plant, reason", [
    (_zero_link, "not a regular file (a device)"),
    (os.mkfifo, "not a regular file (a FIFO)"),
    (_sparse, (f"checkpoint of {limits.MAX_CHECKPOINT_BYTES + 1:,} bytes is over the "
               f"{limits.MAX_CHECKPOINT_BYTES:,}-byte limit")),
])
def test_an_unreadable_newest_candidate_falls_back_unread(tmp_path, plant, reason, capsys):
    good = checkpoint.write(tmp_path / "step-000007.pt", _payload())
    bad = tmp_path / "step-000999.pt"
    plant(bad)
    tracemalloc.start()
    try:
        with deadline(10):
            assert checkpoint.find_latest(tmp_path) == good
            with pytest.raises(checkpoint.CorruptCheckpoint) as e:
                checkpoint.load(bad)
            with pytest.raises(checkpoint.CorruptCheckpoint):
                checkpoint.read_header(bad)
            assert not checkpoint.is_checkpoint_file(bad)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak  # never read: not /dev/zero's endless bytes, not 2 GiB of zeros
    assert reason in str(e.value) and "\n" not in str(e.value)
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and reason in warning[0] and "falling back to the previous checkpoint " \
        "step-000007.pt" in warning[0], warning


def test_a_fifo_pointer_file_is_no_pointer(tmp_path):
    checkpoint.write(tmp_path / "step-000007.pt", _payload())
    os.mkfifo(tmp_path / checkpoint.BEST)
    (tmp_path / checkpoint.LAST).symlink_to("/dev/zero")
    with deadline(5):
        assert checkpoint.read_pointer(tmp_path, checkpoint.BEST) is None
        assert checkpoint.read_pointer(tmp_path, checkpoint.LAST) is None


def test_the_slow_save_fault_holds_a_fully_written_temp_file_before_the_rename(tmp_path, monkeypatch):
    """``helpers.inject.slow_save`` (what the kill-in-a-save test injects): while it pauses, the
    temporary file holds the whole checkpoint and the step file does not exist yet."""
    from helpers import inject

    seen = []

    def pause(seconds: float) -> None:
        tmp = list(tmp_path.glob(".step-000001.pt.tmp-*"))
        seen.append((seconds, [t.stat().st_size for t in tmp], (tmp_path / "step-000001.pt").exists()))

    inject.slow_save(checkpoint, 30.0, monkeypatch.setattr, pause)
    path = checkpoint.write(tmp_path / "step-000001.pt", _payload())
    assert seen == [(30.0, [path.stat().st_size], False)]
    checkpoint.verify(path)
    assert [p.name for p in tmp_path.iterdir()] == ["step-000001.pt"]


# --- resume: the checkpoint and the run's metrics file --------------------------------------

def test_resume_skips_a_fifo_checkpoint_and_refuses_a_fifo_metrics_file(tmp_path):
    from mnistflow.training import resume

    ck = tmp_path / "run" / checkpoint.CKPT_DIR
    good = checkpoint.write(ck / "step-000007.pt", _payload())
    os.mkfifo(ck / "step-000600.pt")
    with deadline(10):
        assert resume.locate_resume(True, tmp_path / "run", quiet=True) == (good, tmp_path / "run")
        found, _ = resume.locate_resume(str(ck / "step-000600.pt"), None)  # named: refused when read
        with pytest.raises(checkpoint.CorruptCheckpoint, match=r"not a regular file \(a FIFO\)"):
            resume.Resume.load(found)
        metrics = tmp_path / "run" / "metrics.jsonl"
        os.mkfifo(metrics)
        with pytest.raises(MnistflowError) as e:
            runlog.truncate_metrics(metrics, 7)
    assert str(e.value) == f"{metrics}: not a regular file (a FIFO); refusing to read it"
