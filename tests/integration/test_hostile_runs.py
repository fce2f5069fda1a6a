"""The third sweep's run-directory findings (issue 40): a run never writes into another run's
directory, whatever a link on the way does meanwhile (R4); ``--resume`` never continues another
run's checkpoint, and an edit of config.toml is honoured or refused, never silently written
back (R5, G04)."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from helpers import inject
from helpers.cli import assert_one_line_error, run_cli

from mnistflow.artifacts.rundir import RunDir
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
