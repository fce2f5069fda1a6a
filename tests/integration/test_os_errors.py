"""OS errors through the CLI are one line, exit 2, and leave no temporary file (issue 19, D10):
a full disk (a small tmpfs, and RLIMIT_FSIZE), a read-only folder (a read-only bind mount),
and a path of the wrong kind. We run as root, where chmod does not stop a write, so the
read-only and full cases need real mounts; they are skipped, saying why, where ``mount``
is not permitted."""
from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cli import assert_one_line_error, run_cli
from mnistflow.training.api import train


def _mount(*args: str) -> str | None:
    """Run ``mount``: None when it worked, else why not."""
    if shutil.which("mount") is None:
        return "no mount command"
    p = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    return None if p.returncode == 0 else (p.stderr.strip() or f"mount exited {p.returncode}")


@pytest.fixture
def mounts(tmp_path):
    """``tmpfs(size)`` and ``read_only()``: fresh mount points, unmounted after the test."""
    made: list[Path] = []
    count = iter(range(1000))

    def point() -> Path:
        d = tmp_path / f"mnt{next(count)}"
        d.mkdir()
        return d

    def tmpfs(size: str) -> Path:
        d = point()
        why = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d))
        if why:
            pytest.skip(f"cannot mount a tmpfs here ({why})")
        made.append(d)
        return d

    def read_only() -> Path:
        d = point()
        why = _mount("--bind", str(point()), str(d))
        if why:
            pytest.skip(f"cannot bind-mount here ({why})")
        made.append(d)
        why = _mount("-o", "remount,bind,ro", str(d))
        if why:
            pytest.skip(f"cannot make a bind mount read-only here ({why})")
        return d

    yield {"tmpfs": tmpfs, "read_only": read_only}
    for d in reversed(made):
        subprocess.run(["umount", "-l", str(d)], capture_output=True, check=False)


def leftovers(folder: Path) -> list[Path]:
    """Temporary files or record sets a failed write left under ``folder``."""
    return [p for p in folder.rglob(".*") if ".tmp" in p.name or ".old-" in p.name]


@pytest.fixture(scope="module")
def run(mnist_records, tmp_path_factory) -> Path:
    """A finished softmax run to export and report from."""
    r = tmp_path_factory.mktemp("oserr") / "run"
    train(recipe="softmax", data=mnist_records, run_dir=r, quiet=True, threads=1, tensorboard=False)
    return r


def test_prep_to_a_full_disk(mnist_dir, mounts):
    """D10: `prep mnist --out` on a 2 MB file system was an OSError traceback. The free space
    is checked before anything is written now (a write that fails midway anyway, past a file
    size limit: the test below)."""
    small = mounts["tmpfs"]("2m")
    out = small / "mnist"
    proc = run_cli("prep", "mnist", "--data", str(mnist_dir), "--out", str(out))
    assert_one_line_error(proc, f"{out}: the records need ~0.05 GiB (0 augmented copies of train); "
                                "0.00 GiB are free there")
    assert list(small.iterdir()) == []  # no temporary record set, nothing half written


def test_prep_past_the_file_size_limit(mnist_dir, tmp_path):
    """D10 where mount is not permitted: RLIMIT_FSIZE (with SIGXFSZ ignored, so a write past it
    fails with EFBIG instead of killing the process) is a full disk for one process."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    out = tmp_path / "new" / "mnist"
    proc = subprocess.run([sys.executable, "-m", "mnistflow", "prep", "mnist", "--data", str(mnist_dir),
                           "--out", str(out)], capture_output=True, text=True, preexec_fn=limit,
                          timeout=300, check=False)
    assert_one_line_error(proc, f"{out}: File too large")
    assert list(tmp_path.iterdir()) == []  # nor the folder it created for the records


@pytest.mark.parametrize("fmt", ["npz", "safetensors", "onnx"])
def test_export_to_a_read_only_folder(run, mounts, fmt):
    """D10: `export RUN --out RO/m.npz` was `OSError: [Errno 30] Read-only file system`."""
    ro = mounts["read_only"]()
    out = ro / f"m.{fmt}"
    proc = run_cli("export", str(run), "--format", fmt, "--out", str(out))
    assert_one_line_error(proc, f"{out}: Read-only file system")
    assert list(ro.iterdir()) == []


def test_report_to_a_read_only_folder(run, mounts):
    pytest.importorskip("matplotlib")
    ro = mounts["read_only"]()
    proc = run_cli("report", str(run), "--out", str(ro / "rep"))
    assert_one_line_error(proc, f"{ro / 'rep'}: Read-only file system")


def test_a_read_only_mnistflow_home(mnist_dir, mounts):
    """prep into the cache under a read-only MNISTFLOW_HOME."""
    ro = mounts["read_only"]()
    proc = run_cli("prep", "--data", str(mnist_dir), env={"MNISTFLOW_HOME": str(ro / "home")})
    assert_one_line_error(proc, f"{ro} cannot be written", "set $MNISTFLOW_HOME to a writable folder")
    assert list(ro.iterdir()) == []


@pytest.mark.parametrize("size", ["16k", "40k"])
def test_train_on_a_full_disk(mnist_records, mounts, size):
    """D10 at two fill levels (metrics.jsonl, then a checkpoint): one line, no temporary file."""
    small = mounts["tmpfs"](size)
    proc = run_cli("train", "--recipe", "softmax", "--data", str(mnist_records),
                   "--run-dir", str(small / "run"), "--quiet")
    assert_one_line_error(proc, "No space left on device")
    assert leftovers(small) == []


def test_train_run_dir_naming_a_file(mnist_records, tmp_path):
    """D10: `train --run-dir AFILE` was a FileExistsError traceback."""
    afile = tmp_path / "afile"
    afile.write_text("keep\n")
    proc = run_cli("train", "--recipe", "softmax", "--data", str(mnist_records), "--run-dir", str(afile))
    assert_one_line_error(proc, str(afile))
    assert afile.read_text() == "keep\n"
    assert sorted(tmp_path.iterdir()) == [afile]


@pytest.mark.parametrize("below", ["", "recs"])
def test_prep_out_naming_a_file(mnist_dir, tmp_path, below):
    """D10: `prep --out AFILE` (and `--out AFILE/recs`) was a NotADirectoryError traceback."""
    afile = tmp_path / "afile"
    afile.write_text("keep\n")
    for force in ([], ["--force"]):  # a file is never replaced
        proc = run_cli("prep", "mnist", "--data", str(mnist_dir), "--out", str(afile / below), *force)
        assert_one_line_error(proc, f"{afile}: ", "not a directory")
        assert afile.read_text() == "keep\n"
        assert sorted(tmp_path.iterdir()) == [afile]


def test_export_out_naming_a_folder(run, tmp_path):
    proc = run_cli("export", str(run), "--format", "npz", "--out", str(tmp_path))
    assert_one_line_error(proc, f"{tmp_path}: is a directory, not a file")
    # the temporary file would sit beside the target (other tests' folders are there too)
    assert list(tmp_path.parent.glob(f".{tmp_path.name}.*")) == [] and leftovers(tmp_path) == []


def test_only_the_systems_os_errors_become_one_line(monkeypatch, capsys):
    """The CLI's last resort: an OSError with an errno is one line naming its file; one
    without (not the system's, so a bug) keeps its traceback."""
    import argparse

    from mnistflow import cli

    def verb(exc):
        def func(args):
            raise exc
        return type("Parser", (), {"parse_args": lambda self, argv: argparse.Namespace(func=func)})()

    monkeypatch.setattr(cli, "build_parser", lambda argv: verb(PermissionError(13, "Permission denied", "/x")))
    assert cli.main(["x"]) == 2
    assert capsys.readouterr().err == "mnistflow: error: /x: Permission denied\n"
    monkeypatch.setattr(cli, "build_parser", lambda argv: verb(OSError("not from the system")))
    with pytest.raises(OSError, match="not from the system"):
        cli.main(["x"])
    monkeypatch.setattr(cli, "build_parser", lambda argv: verb(BrokenPipeError(32, "Broken pipe")))
    dup2 = []
    monkeypatch.setattr(os, "dup2", lambda a, b: dup2.append(b))
    monkeypatch.setattr(sys, "stdout", type("Out", (), {"fileno": lambda self: 1})())
    assert cli.main(["x"]) == 141 and dup2 == [1]  # a reader that left is still not an error
