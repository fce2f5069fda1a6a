"""What `prep --out DIR` may replace (issue 19, minor findings): only a record set. A file or
a folder of anything else is never deleted, --force or not (it recursively deleted a
non-record folder, and the refusal suggested --force); another dataset's record set is
replaced only with --force (it was replaced silently)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import assert_one_line_error, run_cli
from helpers.synthetic import digits, write_records
from mnistflow.data.prepare import prepare
from mnistflow.data.records import open_records


@pytest.fixture
def npz(tmp_path) -> Path:
    """A small raw dataset, 'digits.npz' (its records are named 'digits')."""
    x, y = digits(300)
    xt, yt = digits(60, seed=5)
    p = tmp_path / "digits.npz"
    np.savez(p, x_train=x[..., 0], y_train=y, x_test=xt[..., 0], y_test=yt)
    return p


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name != folder.name)


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_a_folder_that_is_not_a_record_set_is_never_deleted(mnist_dir, tmp_path, force):
    """`prep --force --out DIR` deleted DIR recursively when it held anything at all."""
    work = tmp_path / "project"
    (work / "src").mkdir(parents=True)
    (work / "src" / "train.py").write_text("print('mine')\n")
    (work / "notes.txt").write_text("keep\n")
    before = snapshot(work)
    proc = run_cli("prep", "mnist", "--data", str(mnist_dir), "--out", str(work), *force)
    assert_one_line_error(proc, f"{work}: ", "not a record set")
    assert "--force" not in proc.stderr  # it must not suggest the flag that would delete it
    assert snapshot(work) == before
    assert siblings(work) == []  # no temporary record set left next to it


def test_a_record_set_with_a_stranger_file_is_not_a_record_set(npz, tmp_path):
    out = tmp_path / "recs"
    prepare(data=npz, out=out, val_size=50, quiet=True)
    (out / "README.md").write_text("my notes about these records\n")
    before = snapshot(out)
    proc = run_cli("prep", "--data", str(npz), "--out", str(out), "--val-size", "60", "--force")
    assert_one_line_error(proc, f"{out}: ", "not a record set")
    assert snapshot(out) == before


def test_another_datasets_records_are_replaced_only_with_force(mnist_dir, tmp_path):
    """`prep --out EXISTING_RECORDS` of another dataset replaced them silently."""
    recs = write_records(tmp_path / "recs", n_train=200, n_test=50, val_size=20)  # 'synthetic'
    before = snapshot(recs)
    proc = run_cli("prep", "mnist", "--data", str(mnist_dir), "--out", str(recs))
    assert_one_line_error(proc, f"{recs}: ", "another dataset", "'synthetic'", "--force")
    assert snapshot(recs) == before and siblings(recs) == []

    proc = run_cli("prep", "mnist", "--data", str(mnist_dir), "--out", str(recs), "--force")
    assert proc.returncode == 0, proc.stderr
    rec = open_records(recs)
    assert rec.name == "mnist" and rec.size("train") == 55_000
    assert siblings(recs) == []  # the replaced set is gone, not left as .recs.old-*


def test_a_raw_input_of_another_dataset_is_refused_before_anything_is_written(npz, tmp_path):
    """A raw input's name is known only once read: the refusal still comes before writing."""
    recs = write_records(tmp_path / "w" / "recs", n_train=200, n_test=50, val_size=20)
    before = snapshot(recs)
    proc = run_cli("prep", "--data", str(npz), "--out", str(recs), "--val-size", "50")
    assert_one_line_error(proc, "another dataset", "'synthetic', not 'digits'")
    assert snapshot(recs) == before and siblings(recs) == []


def test_the_same_dataset_with_other_options_is_rebuilt_without_force(npz, tmp_path):
    out = tmp_path / "recs"
    prepare(data=npz, out=out, val_size=50, quiet=True)
    proc = run_cli("prep", "--data", str(npz), "--out", str(out), "--val-size", "80")
    assert proc.returncode == 0, proc.stderr
    assert open_records(out).size("val") == 80
    assert siblings(out) == [npz.name]


def test_an_empty_folder_is_used(npz, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    prepare(data=npz, out=out, val_size=50, quiet=True)
    assert open_records(out).name == "digits"


def test_a_damaged_record_set_needs_force_and_force_repairs_it(npz, tmp_path):
    """The damaged-records errors say "re-run 'mnistflow prep --force'": that must work,
    and without --force an unreadable set is not replaced silently."""
    out = tmp_path / "recs"
    prepare(data=npz, out=out, val_size=50, quiet=True)
    (out / "meta.json").write_text("{not json")
    proc = run_cli("prep", "--data", str(npz), "--out", str(out), "--val-size", "50")
    assert_one_line_error(proc, f"{out}: ", "cannot be read", "--force")
    assert (out / "meta.json").read_text() == "{not json"
    proc = run_cli("prep", "--data", str(npz), "--out", str(out), "--val-size", "50", "--force")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "meta.json").read_text())["name"] == "digits"
    open_records(out)


def test_a_symlinked_record_set_is_replaced_without_leaving_the_link(npz, tmp_path):
    real = write_records(tmp_path / "real", n_train=200, n_test=50, val_size=20)
    link = tmp_path / "recs"
    link.symlink_to(real)
    prepare(data=npz, out=link, val_size=50, force=True, quiet=True)
    assert not link.is_symlink() and open_records(link).name == "digits"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([npz.name, "real", "recs"])
    shutil.rmtree(real)
