"""The third sweep's run-directory findings (issue 40): a run never writes into another run's
directory, whatever a link on the way does meanwhile (R4); ``--resume`` never continues another
run's checkpoint, and an edit of config.toml is honoured or refused, never silently written
back (R5, G04); an int8 pair is never half replaced (R10); what a killed writer left beside
its output is swept by the next one (R11)."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import inject
from helpers.cli import assert_one_line_error, run_cli

from mnistflow.artifacts.rundir import RunDir
from mnistflow.core import fsutil
from mnistflow.training.api import train

QUICK = dict(quiet=True, threads=1, tensorboard=False)


def _files(run: Path) -> dict[str, str]:
    """Every file under ``run`` (its path inside) -> sha256: what a test compares before/after."""
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file() and not p.is_symlink()}


# --- R4: a run directory reached through a link that moves during the run ---------------------

def test_a_run_keeps_writing_where_it_was_locked_when_its_link_is_repointed(synthetic_records, tmp_path):
    """R4 (F01-F03): ``--run-dir sw/L`` with L -> A repointed to B (a finished run) mid-run.
    Before: B's model, summary and a checkpoint replaced (rc 0); now everything goes to A."""
    sw = tmp_path / "sw"
    train(recipe="softmax", data=synthetic_records, run_dir=sw / "B", max_steps=5, **QUICK)
    b_before = _files(sw / "B")
    (sw / "A").mkdir()
    (sw / "L").symlink_to("A")
    args = ["train", "--recipe", "softmax", "--data", str(synthetic_records), "--run-dir", str(sw / "L"),
            "--epochs", "10", "--max-steps", "40", "--checkpoint-every", "20", "--log-every", "5",
            "--lr", "0.05", "--seed", "3", "--no-tensorboard", "--quiet", "--threads", "1"]
    proc = subprocess.Popen([sys.executable, "-m", "mnistflow", *args], env={**os.environ,
                            **inject.env(data_delay=0.03)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    t0 = time.monotonic()
    while not (sw / "A" / "metrics.jsonl").is_file() or not (sw / "A" / "metrics.jsonl").stat().st_size:
        assert proc.poll() is None and time.monotonic() - t0 < 60, proc.communicate()
        time.sleep(0.02)
    tmp = sw / "L.new"
    tmp.symlink_to("B")
    os.replace(tmp, sw / "L")  # ln -sfn B sw/L
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert _files(sw / "B") == b_before  # not one byte of the other run changed
    a = RunDir(sw / "A")
    assert a.model.is_file() and a.summary.is_file() and (a.checkpoints / "step-000040.pt").is_file()
    assert not a.lock.exists() and not RunDir(sw / "B").lock.exists()


def test_a_resume_through_a_link_continues_the_directory_it_locked(synthetic_records, tmp_path):
    """R4, resumed: ``--resume --run-dir L`` locks and writes the directory L named when it
    started (its config.toml records the real directory)."""
    real = tmp_path / "real"
    train(recipe="softmax", data=synthetic_records, run_dir=real, max_steps=6, epochs=5, checkpoint_every=3, **QUICK)
    link = tmp_path / "current"
    link.symlink_to(real)
    s = train(run_dir=link, resume=True, max_steps=9, **QUICK)
    assert s["steps"] == 9 and s["run_dir"] == str(real)
    assert f'run_dir = "{real}"' in RunDir(real).config.read_text()


# --- R5: a checkpoint of another run in checkpoints/ ----------------------------------------------

def _two_runs(records_a, records_b, tmp_path, epochs_b: int = 40) -> tuple[Path, Path]:
    """``g1`` and ``xsmall``: softmax with the same seed and optimizer, each with a checkpoint
    at step 4."""
    run, other = tmp_path / "g1", tmp_path / "xsmall"
    train(recipe="softmax", data=records_a, run_dir=run, max_steps=4, epochs=5, checkpoint_every=4, **QUICK)
    train(recipe="softmax", data=records_b, run_dir=other, max_steps=4, epochs=epochs_b, checkpoint_every=4, **QUICK)
    return run, other


def test_a_same_recipe_checkpoint_of_another_run_is_refused_naming_the_difference(
        synthetic_records, mnist_records, tmp_path):
    """R5 (G01): same model, seed and optimizer, other data and epochs. Before: resumed (rc 0),
    config.toml, model and summary rewritten to the other run's; now one line, nothing touched."""
    run, other = _two_runs(mnist_records, synthetic_records, tmp_path)
    shutil.copy(other / "checkpoints" / "step-000004.pt", run / "checkpoints" / "step-000999.pt")
    before = _files(run)
    proc = run_cli("train", "--resume", "--run-dir", str(run))
    assert_one_line_error(proc, "step-000999.pt: was written by another run than the one in",
                          f"data '{synthetic_records}' (the run's: '{mnist_records}')", "epochs 40 (the run's: 5)")
    assert _files(run) == before


def test_a_linked_checkpoint_of_another_run_is_refused(synthetic_records, tmp_path):
    """R5 (G09): ``step-000999.pt`` a symbolic link to another run's checkpoint, and the other
    run the same in every setting: its run id tells it apart."""
    run, other = _two_runs(synthetic_records, synthetic_records, tmp_path, epochs_b=5)
    (run / "checkpoints" / "step-000999.pt").symlink_to(other / "checkpoints" / "step-000004.pt")
    before = _files(run)
    proc = run_cli("train", "--resume", "--run-dir", str(run), "--epochs", "40")
    assert_one_line_error(proc, "step-000999.pt: was written by another run than the one in", "run id ",
                          "with the same settings")
    assert _files(run) == before
    (run / "checkpoints" / "step-000999.pt").unlink()  # its own checkpoint still resumes
    s = train(run_dir=run, resume=True, max_steps=5, **QUICK)
    assert s["steps"] == 5 and s["resumed_from"] == str(run / "checkpoints" / "step-000004.pt")


def test_a_run_without_ids_compares_its_data_and_identity(synthetic_records, mnist_records, tmp_path):
    """R5 for runs of an older mnistflow (no run id in config.toml): the data and the rest of
    the run's identity are compared."""
    run, other = _two_runs(mnist_records, synthetic_records, tmp_path)
    cfg = RunDir(run).config
    cfg.write_text("".join(ln for ln in cfg.read_text().splitlines(True) if not ln.startswith("run_id")))
    shutil.copy(other / "checkpoints" / "step-000004.pt", run / "checkpoints" / "step-000999.pt")
    proc = run_cli("train", "--resume", "--run-dir", str(run))
    assert_one_line_error(proc, "step-000999.pt: does not match the config.toml of the run in",
                          f"data '{synthetic_records}' (the run's: '{mnist_records}')")


# --- G04: config.toml edited before --resume -------------------------------------------------------

def test_an_edited_config_is_honoured_and_said_or_refused_naming_the_key(synthetic_records, tmp_path):
    """G04: lr 0.3 -> 0.01 in config.toml was silently ignored and written back. Now a setting
    that may change is honoured (a note names it); one that changes the model or data is refused."""
    run = tmp_path / "run"
    train(recipe="softmax", data=synthetic_records, run_dir=run, max_steps=4, epochs=5, checkpoint_every=4, **QUICK)
    cfg = RunDir(run).config
    text = cfg.read_text()
    assert "\nlr = 0.3\n" in text and "\nseed = 0\n" in text
    cfg.write_text(text.replace("\nseed = 0\n", "\nseed = 5\n"))
    proc = run_cli("train", "--resume", "--run-dir", str(run), "--max-steps", "6")
    assert_one_line_error(proc, "config.toml: seed = 5 here, but the checkpoint's run has 0",
                          "a resume cannot change the model or data")
    cfg.write_text(text.replace("\nlr = 0.3\n", "\nlr = 0.01\n"))
    proc = run_cli("train", "--resume", "--run-dir", str(run), "--max-steps", "6")
    assert proc.returncode == 0, proc.stderr
    assert "config.toml: resuming with its lr = 0.01 (the checkpoint's: 0.3)" in proc.stderr
    assert "\nlr = 0.01\n" in cfg.read_text()
    proc = run_cli("train", "--resume", "--run-dir", str(run), "--max-steps", "8", "--lr", "0.02")
    assert proc.returncode == 0 and "\nlr = 0.02\n" in cfg.read_text()  # a flag still wins


def _names(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --- R11: temporary names with an owner, swept when it is gone ------------------------------------

def _killed_writer(path) -> str:
    """What a writer of ``path`` killed with -9 leaves: a process makes its temporary folder
    (``fsutil.temp_name``) and a file in it, and is killed."""
    code = ("import os, sys, time; from mnistflow.core.fsutil import temp_name; p = temp_name(sys.argv[1]); "
            "os.mkdir(p); open(os.path.join(p, 'loss.png'), 'wb').write(b'x' * 1000); print(p, flush=True); "
            "time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    left = proc.stdout.readline().strip()
    proc.kill()
    proc.wait()
    return os.path.basename(left)


def test_the_sweep_removes_what_gone_owners_left_of_any_name_and_keeps_the_rest(tmp_path):
    """R11 / PS02: a killed ``report --out D/rep`` and ``prep --out D/recs`` left their folders;
    the next writer into D (any name) removes them; a live writer's, another host's recent one,
    a link and an unrelated dot-file stay."""
    rep, recs = _killed_writer(tmp_path / "rep"), _killed_writer(tmp_path / "recs")
    host = fsutil.owner().rsplit("-", 1)[0]
    live = tmp_path / f".model.onnx.tmp-{host}-{os.getppid()}-ab12"
    live.write_bytes(b"being written")
    unnamed_old = tmp_path / ".rep.0123456789abcdef.tmp"  # an older mnistflow's report folder
    unnamed_old.mkdir()
    t = time.time() - 2 * fsutil.STALE_AFTER_S
    os.utime(unnamed_old, (t, t))
    elsewhere = tmp_path / ".rep.tmp-otherhost-1-cd34"
    elsewhere.mkdir()
    link = tmp_path / f".x.tmp-{host}-999999999-ef"
    link.symlink_to(tmp_path)
    unrelated = tmp_path / ".config.tmp"
    unrelated.write_text("mine")
    users = tmp_path / ".notes.tmp-backup"  # no owner in its name: maybe a user's own file
    users.write_text("mine")
    os.utime(users, (t, t))
    assert sorted(p.name for p in fsutil.sweep_stale(tmp_path)) == sorted([rep, recs])
    assert sorted(p.name for p in fsutil.sweep_stale(tmp_path, "rep")) == [unnamed_old.name]  # the writer of rep
    assert _names(tmp_path) == sorted([live.name, elsewhere.name, link.name, unrelated.name, users.name])


def test_an_old_name_whose_file_is_missing_is_put_back(tmp_path):
    """Killed between 'NAME -> old' and 'tmp -> NAME': the old one is the live one."""
    host = fsutil.owner().rsplit("-", 1)[0]
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    old = tmp_path / f".m.onnx.old-{host}-{proc.stdout.strip()}-ab"
    old.write_bytes(b"the model")
    assert fsutil.sweep_stale(tmp_path) == [old]
    assert _names(tmp_path) == ["m.onnx"] and (tmp_path / "m.onnx").read_bytes() == b"the model"


def test_report_and_prep_sweep_what_killed_writers_left_beside_their_out(synthetic_records, mnist_dir, tmp_path):
    """R11 (D-rep-k9, D02, PS02): a kill -9 of ``report --out D/rep`` left ``.rep.*`` and nothing
    removed it; a killed ``prep --out D/recs`` was swept only by a prep of the same --out. Now
    the next report or prep into D removes them (their owner is gone)."""
    run = tmp_path / "run"
    train(recipe="softmax", data=synthetic_records, run_dir=run, max_steps=5, **QUICK)
    d = tmp_path / "D"
    d.mkdir()
    _killed_writer(d / "rep"), _killed_writer(d / "recs")
    proc = run_cli("report", str(run), "--out", str(d / "rep"))
    assert proc.returncode == 0, proc.stderr
    assert _names(d) == ["rep"]
    _killed_writer(d / "recs")
    proc = run_cli("prep", "mnist", "--data", str(mnist_dir), "--out", str(d / "other"))
    assert proc.returncode == 0, proc.stderr
    assert _names(d) == ["other", "rep"]


def _chattr(path, flag: str) -> bool:
    return shutil.which("chattr") is not None and subprocess.run(
        ["chattr", flag, str(path)], capture_output=True).returncode == 0


def test_an_int8_pair_export_whose_second_write_fails_keeps_the_old_pair(synthetic_records, tmp_path):
    """R10 (C09): with ``m.int8.onnx`` immutable, ``export OTHER --force`` ended rc 2 with
    m.onnx already the other run's. Now the old pair stays whole (and no temporary name)."""
    r1, r2, pair = tmp_path / "r1", tmp_path / "r2", tmp_path / "pair"
    train(recipe="softmax", data=synthetic_records, run_dir=r1, max_steps=5, **QUICK)
    train(recipe="softmax", data=synthetic_records, run_dir=r2, max_steps=5, seed=7, **QUICK)
    proc = run_cli("export", str(r1), "--format", "onnx", "--quantize", "int8", "--out", str(pair / "m.onnx"))
    assert proc.returncode == 0, proc.stderr
    before = _files(pair)
    if not _chattr(pair / "m.int8.onnx", "+i"):
        pytest.skip("chattr +i is not allowed here (tests/unit/test_hostile_runs_files.py injects the fault)")
    try:
        proc = run_cli("export", str(r2), "--format", "onnx", "--quantize", "int8", "--out", str(pair / "m.onnx"),
                       "--force")
    finally:
        _chattr(pair / "m.int8.onnx", "-i")
    assert_one_line_error(proc, "m.int8.onnx: Operation not permitted")
    assert _files(pair) == before and _names(pair) == ["m.int8.onnx", "m.onnx"]


# --- R12: train --compile with a full TMPDIR --------------------------------------------------------

def test_compile_with_a_full_tmpdir_is_one_line(synthetic_records, tmp_path):
    """R12 (CO02), as reproduced: TMPDIR a full 256 KB tmpfs (in a mount namespace of its own).
    Before: rc 1, 136 lines (inductor's traceback and g++'s output) after ~20 s of CPU."""
    full, run = tmp_path / "full", tmp_path / "rd"
    full.mkdir()
    if os.geteuid() != 0 or not shutil.which("unshare") or subprocess.run(
            ["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs a mount namespace (root, unshare -m): "
                    "tests/unit/test_hostile_runs_api.py injects the same fault")
    train_cmd = " ".join([sys.executable, "-m", "mnistflow", "train", "--recipe", "softmax", "--data",
                          str(synthetic_records), "--run-dir", str(run), "--compile", "--max-steps", "20",
                          "--no-tensorboard"])
    script = (f"mount -t tmpfs -o size=256k tmpfs {full} && (dd if=/dev/zero of={full}/fill bs=4k 2>/dev/null; "
              f"TMPDIR={full} {train_cmd}; echo rc=$? >&2; ls -A {full} >&2)")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    lines = proc.stderr.splitlines()
    assert len(lines) == 3 and lines[1] == "rc=2" and lines[2] == "fill", proc.stderr  # nothing else left there
    assert lines[0] == (f"mnistflow: error: {full}: --compile needs room for the code it generates: the "
                        "temporary directory (TMPDIR) the C++ compiler writes to has 0.0 MB free (at least "
                        "64 MB): free some, set TMPDIR to a folder with room, or train without --compile")
    assert not run.exists()


# --- minor findings: a run read while it trains, $MNISTFLOW_HOME where nothing can be kept ----------

def test_a_run_read_while_it_trains_says_so_and_export_does_not_sit_beside_it(synthetic_records, tmp_path):
    """Before: ``eval``/``export RUN`` of a run in progress silently used its newest checkpoint,
    and ``export`` left RUN/model.* of that mid-run checkpoint beside the final model. Now a
    read says so in one line; an export into the run is refused (its files would look like the
    export of the finished run); one to a file named with --out is made, said the same way."""
    run = tmp_path / "run"
    args = ["train", "--recipe", "softmax", "--data", str(synthetic_records), "--run-dir", str(run), "--epochs",
            "100", "--checkpoint-every", "3", "--no-tensorboard", "--quiet", "--threads", "1"]
    proc = subprocess.Popen([sys.executable, "-m", "mnistflow", *args], env={**os.environ,
                            **inject.env(data_delay=0.2)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        t0 = time.monotonic()
        while not list(RunDir(run).checkpoints.glob("step-*.pt")):
            assert proc.poll() is None and time.monotonic() - t0 < 60, proc.communicate()
            time.sleep(0.05)
        said = f"{run}: a training is writing this run now (pid {proc.pid}): reading its newest checkpoint, step-"
        ev = run_cli("eval", str(run))
        assert ev.returncode == 0 and said in ev.stderr, ev.stderr
        ex = run_cli("export", str(run), "--format", "npz")
        assert_one_line_error(ex, f"{run}: a training is writing this run now (pid {proc.pid}): its export would "
                              "be of a mid-run checkpoint", "name the file with --out")
        ex = run_cli("export", str(run), "--format", "npz", "--out", str(tmp_path / "mid.npz"))
        assert ex.returncode == 0 and said in ex.stderr and (tmp_path / "mid.npz").is_file(), ex.stderr
    finally:
        proc.kill()
        proc.communicate()
    assert not list(run.glob("model.*npz"))


def test_a_mnistflow_home_that_can_hold_nothing_is_named(mnist_dir, tmp_path):
    """Before: ``MNISTFLOW_HOME=/proc/self`` said "the records need ~0.00 GiB; 0.00 GiB are free
    there", not the cause."""
    proc = run_cli("prep", "mnist", "--data", str(mnist_dir), env={"MNISTFLOW_HOME": "/proc/self"})
    assert_one_line_error(proc, "/proc/self: $MNISTFLOW_HOME is on a file system that holds no files (like /proc)")
    (tmp_path / "file").write_text("x")
    proc = run_cli("prep", "mnist", "--data", str(mnist_dir), env={"MNISTFLOW_HOME": str(tmp_path / "file" / "sub")})
    assert_one_line_error(proc, f"{tmp_path / 'file'}: $MNISTFLOW_HOME is a file, not a folder")
