"""Whole-or-nothing writes (``core.fsutil``): an OS error is one ``MnistflowError`` naming the
file, nothing half written is left, and new files follow the umask (issue 19, D10 and the
umask finding). OS failures are simulated by patching ``os`` functions; the CLI runs against
real full and read-only file systems are in tests/integration/test_os_errors.py."""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from helpers.blocking import deadline
from helpers.synthetic import raw_dataset
from mnistflow.core import fsutil
from mnistflow.core.errors import MnistflowError, os_error
from mnistflow.core.fsutil import (
    atomic_write,
    atomic_write_bytes,
    atomic_write_text,
    make_dirs,
)
from mnistflow.data import write_records as writer


@pytest.fixture
def umask():
    """``umask(mask)`` sets the process umask for this test (fsutil's cached copy too)."""
    old = os.umask(0o022)
    os.umask(old)

    def set_mask(mask: int) -> None:
        os.umask(mask)
        fsutil.umask.cache_clear()

    yield set_mask
    os.umask(old)
    fsutil.umask.cache_clear()


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def everything(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def oserror(code: int, filename: str | None = None):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code), filename)
    return fail


@pytest.mark.parametrize("mask, want", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_follow_the_umask(tmp_path, umask, mask, want):
    """Files a run writes follow the umask (0644 under 022), not mkstemp's 0600."""
    umask(mask)
    atomic_write_text(tmp_path / "config.toml", "x = 1\n")
    assert mode(tmp_path / "config.toml") == want
    atomic_write_bytes(tmp_path / "config.toml", b"x = 2\n")  # a replacement too
    assert mode(tmp_path / "config.toml") == want


def test_umask_is_read_without_changing_it(umask):
    umask(0o027)
    assert fsutil.umask() == 0o027
    assert os.umask(0o027) == 0o027  # still what the process had
    assert fsutil.file_mode() == 0o640


def test_a_record_set_folder_follows_the_umask(tmp_path, umask):
    """The record set's folder has the mode mkdir gives under the umask (not mkdtemp's 0700)."""
    umask(0o022)
    out = writer.write_records(raw_dataset(60, 20), tmp_path / "r", key="k", options={},
                                source_checksums={}, val_size=10)
    assert mode(out) == 0o755
    assert {mode(p) for p in out.iterdir()} == {0o644}


@pytest.mark.parametrize("step, code", [("replace", errno.EROFS), ("fsync", errno.ENOSPC),
                                        ("create", errno.EACCES)])
def test_a_failed_write_is_one_error_naming_the_file_and_leaves_the_old_one(tmp_path, monkeypatch,
                                                                             step, code):
    """D10: disk full, read-only or no permission is a MnistflowError(path, strerror); the
    previous content survives and no temporary file is left."""
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"old")
    patched = {"replace": (os, "replace"), "fsync": (os, "fsync"),
               "create": (os, "open")}[step]
    monkeypatch.setattr(*patched, oserror(code, str(tmp_path / ".model.safetensors.x.tmp")))
    with pytest.raises(MnistflowError) as ei:
        atomic_write_bytes(target, b"new")
    assert ei.value.path == str(target)  # the file the user named, not the temporary one
    assert ei.value.detail == os.strerror(code)
    assert str(ei.value) == f"{target}: {os.strerror(code)}"
    assert target.read_bytes() == b"old"
    assert everything(tmp_path) == ["model.safetensors"]


def test_an_error_inside_the_writer_is_named_too(tmp_path):
    """A write that fails midway (EFBIG from RLIMIT_FSIZE, ENOSPC) is about that file."""
    def write(f):
        f.write(b"partial")
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))

    with pytest.raises(MnistflowError, match="File too large"):
        atomic_write(tmp_path / "a" / "b.npz", write)
    assert everything(tmp_path) == []  # the folders it made are gone with the temporary file


def test_a_non_os_failure_is_not_rewrapped(tmp_path):
    def write(f):
        raise ValueError("bug")

    with pytest.raises(ValueError, match="bug"):
        atomic_write(tmp_path / "x", write)
    assert everything(tmp_path) == []


def test_a_directory_where_a_file_goes_is_named(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(MnistflowError) as ei:
        atomic_write_text(tmp_path / "out", "x")
    assert str(ei.value) == f"{tmp_path / 'out'}: is a directory, not a file"
    assert everything(tmp_path) == ["out"]


@pytest.mark.parametrize("below", ["x.npz", "sub/deeper/x.npz"])
def test_a_file_where_a_folder_goes_is_named(tmp_path, below):
    """``--out afile/x.npz``: the error names the file in the way, not a path below it."""
    (tmp_path / "afile").write_text("keep")
    with pytest.raises(MnistflowError) as ei:
        atomic_write_text(tmp_path / "afile" / below, "x")
    assert str(ei.value) == f"{tmp_path / 'afile'}: is a file, not a directory"
    assert (tmp_path / "afile").read_text() == "keep"


def test_make_dirs_reports_what_it_created_and_undoes_a_partial_tree(tmp_path, monkeypatch):
    assert make_dirs(tmp_path) == []
    made = make_dirs(tmp_path / "a" / "b")
    assert made == [tmp_path / "a" / "b", tmp_path / "a"]
    real_mkdir = os.mkdir

    def mkdir(path, mode=0o777, **kw):  # the second level hits a read-only file system
        if Path(path).name == "d":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        real_mkdir(path, mode, **kw)

    monkeypatch.setattr(os, "mkdir", mkdir)
    with pytest.raises(MnistflowError) as ei:
        make_dirs(tmp_path / "c" / "d" / "e")
    assert str(ei.value) == f"{tmp_path / 'c' / 'd'}: Read-only file system"
    assert not (tmp_path / "c").exists()


def test_os_error_wording():
    assert str(os_error(OSError(errno.ENOSPC, "No space left on device"), "m.npz")) == \
        "m.npz: No space left on device"
    # a rename names the destination; an error without errno keeps its own text
    e = OSError(errno.EXDEV, os.strerror(errno.EXDEV), "/t/.x.tmp", None, "/t/x")
    assert os_error(e).path == "/t/x"
    assert str(os_error(OSError("Not enough free space to write 8 bytes"), "r")) == \
        "r: Not enough free space to write 8 bytes"
    assert str(os_error(OSError(errno.ENOSPC, "No space left on device"))) == "No space left on device"


def test_write_records_out_of_space_is_one_error_and_leaves_nothing(tmp_path, monkeypatch):
    """D10: prep on a full disk (numpy's own OSError has no errno) names the record set and
    leaves neither the temporary record set nor the folders it created."""
    calls = []
    real = writer._save_npy

    def save(folder, name, arr, checksums):
        calls.append(name)
        if len(calls) == 3:
            raise OSError(f"Not enough free space to write {arr.nbytes} bytes after offset 128")
        real(folder, name, arr, checksums)

    monkeypatch.setattr(writer, "_save_npy", save)
    out = tmp_path / "new" / "recs"
    with pytest.raises(MnistflowError) as ei:
        writer.write_records(raw_dataset(60, 20), out, key="k", options={}, source_checksums={},
                              val_size=10)
    assert ei.value.path == str(out)
    assert "Not enough free space" in ei.value.detail
    assert everything(tmp_path) == []


def _then_interrupted(make):
    """``make`` (os.open, os.mkdir), then the KeyboardInterrupt a signal handler raises when
    the signal lands just after it returns, before the caller has bound its result."""
    def call(*args, **kwargs):
        made = make(*args, **kwargs)
        if isinstance(made, int):
            os.close(made)
        raise KeyboardInterrupt
    return call


def test_an_interruption_just_after_the_temporary_file_is_created_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"old")
    monkeypatch.setattr(os, "open", _then_interrupted(os.open))
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(target, b"new")
    monkeypatch.undo()
    assert everything(tmp_path) == ["model.safetensors"] and target.read_bytes() == b"old"


def test_an_interruption_just_after_the_temporary_record_folder_is_made_leaves_nothing(tmp_path,
                                                                                       monkeypatch):
    """CI caught a SIGTERM here leaving ``.recs.tmp-*`` behind (mkdtemp had made the folder, its
    name not yet returned); prep must leave nothing the next run has to sweep."""
    monkeypatch.setattr(os, "mkdir", _then_interrupted(os.mkdir))
    with pytest.raises(KeyboardInterrupt):
        writer.write_records(raw_dataset(60, 20), tmp_path / "r", key="k", options={},
                              source_checksums={}, val_size=10)
    monkeypatch.undo()
    assert everything(tmp_path) == []


# --- regular_file / open_regular / read_regular: THE check before an input file is read --------


def _one_line(e: pytest.ExceptionInfo, path: Path, *fragments: str) -> None:
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path}: "), msg
    for f in fragments:
        assert f in msg, (f, msg)


@pytest.mark.parametrize("check", ["regular_file", "open_regular", "read_regular"])
def test_a_fifo_a_device_and_a_folder_are_refused_without_blocking(tmp_path, check):
    fifo, dev, folder = tmp_path / "m.pt", tmp_path / "z.onnx", tmp_path / "d.npz"
    os.mkfifo(fifo)
    dev.symlink_to("/dev/zero")
    folder.mkdir()
    fn = getattr(fsutil, check)
    for path, kind in ((fifo, "(a FIFO)"), (dev, "(a device)"), (folder, "(a folder)")):
        with deadline(5), pytest.raises(fsutil.NotReadable) as e:
            fn(path, 1 << 20, "model file")
        _one_line(e, path, "not a regular file", kind)


@pytest.mark.parametrize("check", ["regular_file", "open_regular", "read_regular"])
def test_a_sparse_file_over_the_cap_is_refused_unread(tmp_path, check):
    big = tmp_path / "big.onnx"
    with open(big, "wb") as f:
        f.truncate(3 << 30)  # 3 GiB that cost nothing on disk, everything once read
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(fsutil.NotReadable) as e:
            getattr(fsutil, check)(big, 1 << 20, "ONNX model")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _one_line(e, big, "ONNX model of 3,221,225,472 bytes is over the 1,048,576-byte limit")
    assert peak < 1 << 20


def test_missing_files_and_dangling_links(tmp_path):
    with pytest.raises(MnistflowError) as e:
        fsutil.read_regular(tmp_path / "nope.pt", 100)
    assert type(e.value) is MnistflowError and e.value.detail == "no such file"
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(fsutil.NotReadable, match="a broken symbolic link"):
        fsutil.regular_file(tmp_path / "dangling", 100)


def test_a_regular_file_within_the_cap_is_read(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(b"x" * 100)
    (tmp_path / "link").symlink_to(p)
    assert fsutil.regular_file(tmp_path / "link", 100) == tmp_path / "link"
    assert fsutil.read_regular(p, 100) == b"x" * 100
    with fsutil.open_regular(p) as f:  # no cap: only the kind of file is checked
        assert f.read() == b"x" * 100
    with pytest.raises(fsutil.NotReadable, match="over the 99-byte limit"):
        fsutil.read_regular(p, 99)
