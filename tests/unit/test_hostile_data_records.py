"""Hostile or damaged record sets and what a killed ``prep`` leaves (issue 19,
HOSTILE-INPUTS.md D11, D13): synthetic records, in process."""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from helpers.synthetic import raw_dataset
from mnistflow.core.errors import MnistflowError
from mnistflow.core import fsutil
from mnistflow.core.fsutil import sha256_file
from mnistflow.data import write_records as writer
from mnistflow.data.records import meta_checksum, open_records
from mnistflow.data.write_records import write_records


@pytest.fixture
def recs(synthetic_records, tmp_path) -> Path:
    """A private copy of the synthetic record set (600 train / 100 val / 200 test)."""
    return Path(shutil.copytree(synthetic_records, tmp_path / "r"))


def edit_meta(path: Path, change, reseal: bool = True) -> None:
    """Change meta.json; ``reseal`` recomputes its checksum (a careful editor, or a bug)."""
    meta = json.loads((path / "meta.json").read_text())
    change(meta)
    if reseal:
        meta["meta_sha256"] = meta_checksum(meta)
    (path / "meta.json").write_text(json.dumps(meta))


def replace_npy(path: Path, name: str, arr: np.ndarray) -> None:
    """Swap a payload file and update its checksum, as a tamperer who knows the format would."""
    np.save(path / name, arr, allow_pickle=True)
    edit_meta(path, lambda m: m["files"].__setitem__(name, sha256_file(path / name)))


def refused(path: Path, *fragments: str) -> str:
    with pytest.raises(MnistflowError) as e:
        open_records(path)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


# --- D13: meta.json is covered by a checksum, and the files must agree with it -------------

def test_d13_meta_json_is_covered_by_its_checksum(recs):
    meta = json.loads((recs / "meta.json").read_text())
    assert meta["meta_sha256"] == meta_checksum(meta)
    edit_meta(recs, lambda m: m.__setitem__("shape", [32, 32, 3]), reseal=False)
    refused(recs, "meta.json", "checksum does not match", "prep --force")


def test_d13_a_shape_that_disagrees_with_the_files_is_an_error(recs):
    def to_cifar(m):
        m["shape"], m["mean"], m["std"] = [32, 32, 3], [1.0] * 3, [1.0] * 3
    edit_meta(recs, to_cifar)  # was: RuntimeError mat1 and mat2 shapes cannot be multiplied
    refused(recs, "train_x.npy", "(600, 28, 28, 1)", "(600, 32, 32, 3)", "inconsistent")


@pytest.mark.parametrize("names,fragment", [
    (["0", "1", "2"], "label 9 is outside 0..2"),       # was: IndexError Target 3 is out of bounds
    ([], "'class_names' should be"),
    ([1, 2], "'class_names' should be"),
])
def test_d13_class_names_must_cover_the_labels(recs, names, fragment):
    edit_meta(recs, lambda m: m.update(class_names=names, label_values=list(range(len(names)))))
    refused(recs, fragment)


def test_d13_an_object_array_is_refused_from_its_header(recs):
    replace_npy(recs, "val_y.npy", np.array([{"a": 1}] * 100, dtype=object))
    refused(recs, "val_y.npy", "object", "inconsistent")  # was: ValueError Object arrays ...


def test_d13_a_label_beyond_the_classes_is_an_error(recs):
    y = np.load(recs / "train_y.npy")
    y[5] = 999
    replace_npy(recs, "train_y.npy", y)
    refused(recs, "train_y.npy", "label 999 is outside 0..9")  # was: IndexError Target 999


def test_d13_label_and_image_counts_must_match(recs):
    replace_npy(recs, "train_y.npy", np.load(recs / "train_y.npy")[:5])
    refused(recs, "train_y.npy", "(5,)", "(600,)")  # was: trained one step on 5 images, rc 0


def test_d13_a_truncated_file_is_caught_before_it_is_mapped(recs):
    p = recs / "test_x.npy"
    p.write_bytes(p.read_bytes()[:-100])
    edit_meta(recs, lambda m: m["files"].__setitem__("test_x.npy", sha256_file(p)))
    refused(recs, "test_x.npy", "truncated or corrupt")


def test_d13_meta_json_cannot_name_files_outside_the_set(recs):
    edit_meta(recs, lambda m: m["files"].__setitem__("../../../../etc/hostname", "0" * 64))
    refused(recs, "../../../../etc/hostname", "not a file of this record set")


@pytest.mark.parametrize("key,value", [
    ("mean", [float("nan")]), ("std", [0.0]), ("std", [1.0, 2.0]), ("splits", {"train": -1}),
    ("splits", {"bogus": 3}), ("shape", [28, 28]), ("variants", -1), ("name", 3),
])
def test_d13_every_meta_field_is_checked(recs, key, value):
    edit_meta(recs, lambda m: m.__setitem__(key, value))
    refused(recs, "meta.json", key)


def test_d13_a_record_set_without_its_meta_checksum_is_refused(recs):
    assert open_records(recs).size("train") == 600
    edit_meta(recs, lambda m: m.pop("meta_sha256"), reseal=False)
    msg = refused(recs, "meta.json", "lacks 'meta_sha256'", "re-run 'mnistflow prep --force'")
    assert "\n" not in msg


# --- D11: what a killed prep leaves is cleaned by the next one -----------------------------

def dead_pid() -> int:
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while pid > 1:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except OSError:
            pass
        pid -= 1
    pytest.skip("no free pid")


def leftover(parent: Path, name: str, age_s: float = 0) -> Path:
    p = parent / name
    p.mkdir()
    (p / "train_x.npy").write_bytes(b"\0" * 1000)
    if age_s:
        t = time.time() - age_s
        os.utime(p, (t, t))
    return p


def test_d11_a_later_prep_removes_what_killed_ones_left(tmp_path):
    host = fsutil.owner().rsplit("-", 1)[0]
    dead = leftover(tmp_path, f".recs.tmp-{host}-{dead_pid()}-ab12cd")
    legacy_old = leftover(tmp_path, ".recs.tmp-6mh245gv", age_s=2 * fsutil.STALE_AFTER_S)
    other_host_old = leftover(tmp_path, f".recs.tmp-elsewhere-{os.getpid()}-x1", age_s=2 * fsutil.STALE_AFTER_S)
    live = leftover(tmp_path, f".recs.tmp-{host}-{os.getppid()}-zz9")  # a prep still running
    legacy_new = leftover(tmp_path, ".recs.tmp-q8w7e6r5")  # maybe an older mnistflow, running
    other_host_new = leftover(tmp_path, f".recs.tmp-elsewhere-{dead_pid()}-x2")
    unrelated = leftover(tmp_path, ".other.tmp-abc")
    write_records(raw_dataset(60, 20), tmp_path / "recs", key="k", options={}, source_checksums={},
                  val_size=10)
    assert open_records(tmp_path / "recs").size("train") == 50
    for gone in (dead, legacy_old, other_host_old):
        assert not gone.exists(), gone
    for kept in (live, legacy_new, other_host_new, unrelated):
        assert kept.exists(), kept
    assert [p.name for p in tmp_path.glob(f".recs.tmp-{host}-{os.getpid()}-*")] == []


def test_d11_a_writer_killed_between_its_renames_gets_its_records_back(tmp_path):
    out = tmp_path / "recs"
    write_records(raw_dataset(60, 20), out, key="k", options={}, source_checksums={}, val_size=10)
    host = fsutil.owner().rsplit("-", 1)[0]
    old = tmp_path / f".recs.old-{host}-{dead_pid()}"
    os.rename(out, old)  # the moment after 'out -> old', before 'tmp -> out'
    assert fsutil.sweep_stale(out.parent) == [old]
    assert open_records(out).size("train") == 50 and not old.exists()


def test_d11_sigterm_during_prep_removes_the_temporary_set(tmp_path, monkeypatch):
    real_save = writer._save_npy
    calls = []

    def save_then_terminated(folder, name, arr, checksums):
        real_save(folder, name, arr, checksums)
        calls.append(folder)
        os.kill(os.getpid(), signal.SIGTERM)  # `kill PID` halfway through writing

    monkeypatch.setattr(writer, "_save_npy", save_then_terminated)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as e:
        write_records(raw_dataset(60, 20), tmp_path / "recs", key="k", options={},
                      source_checksums={}, val_size=10)
    assert e.value.code == 128 + signal.SIGTERM
    assert calls and not calls[0].exists()  # the half-written set is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is put back


def test_two_preps_of_different_datasets_into_one_out_at_once_lose_nothing(tmp_path, monkeypatch):
    """Both checked ``--out`` before either wrote it, and both succeeded: the records the
    first wrote were replaced without a word. The second is refused at the swap now."""
    import dataclasses

    out = tmp_path / "recs"
    first = dataclasses.replace(raw_dataset(300, 100), name="first")
    real_sweep = writer.sweep_stale

    def the_other_prep_finishes_meanwhile(*args):  # after the first check, before the swap
        monkeypatch.setattr(writer, "sweep_stale", real_sweep)
        write_records(first, out, key="a", options={}, source_checksums={}, val_size=50)
        real_sweep(*args)

    monkeypatch.setattr(writer, "sweep_stale", the_other_prep_finishes_meanwhile)
    with pytest.raises(MnistflowError, match="holds the records of another dataset \\('first', not 'synthetic'\\)"):
        write_records(raw_dataset(300, 100), out, key="b", options={}, source_checksums={}, val_size=50)
    assert open_records(out).name == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["recs"]  # no temporary folder left
