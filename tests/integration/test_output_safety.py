"""``export --out`` and ``report --out`` never replace what the user has without ``--force``;
report writes all of its files or none; a tampered or hostile run directory is one error line
(no traceback, bounded memory, no blocking read)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from helpers.cli import assert_one_line_error, run_cli
from mnistflow.core.errors import MnistflowError
from mnistflow.exporting import export


@pytest.fixture(scope="module")
def run(mnist_records, tmp_path_factory) -> Path:
    """A short finished softmax run."""
    from mnistflow.training.api import train

    r = tmp_path_factory.mktemp("outsafe") / "run"
    train(recipe="softmax", data=str(mnist_records), run_dir=str(r), max_steps=60, log_every=20,
          eval_every=30, quiet=True, threads=1, tensorboard=False)
    return r


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder`` (hidden ones too): a file's bytes, a link's target."""
    out: dict[str, bytes | str] = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = f"-> {os.readlink(p)}" if p.is_symlink() else (p.read_bytes() if p.is_file() else "dir")
    return out


# --- export --------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["npz", "safetensors", "pt2"])
def test_export_never_replaces_an_existing_out_file_without_force(run, tmp_path, fmt):
    other = tmp_path / "other-run"
    other.mkdir()
    target = other / f"model.{fmt}"
    target.write_bytes(b"precious\n")
    before = snapshot(tmp_path)
    proc = run_cli("export", str(run), "--format", fmt, "--out", str(target))
    assert_one_line_error(proc, f"{target}: already exists", "--force")
    assert snapshot(tmp_path) == before  # untouched, no temporary file
    proc = run_cli("export", str(run), "--format", fmt, "--out", str(target), "--force")
    assert proc.returncode == 0, proc.stderr
    assert target.read_bytes() != b"precious\n" and target.stat().st_size > 1000


def test_export_refuses_an_existing_int8_sibling(run, tmp_path):
    q = tmp_path / "q"
    q.mkdir()
    (q / "m.int8.onnx").write_text("mine\n")
    with pytest.raises(MnistflowError, match=r"m\.int8\.onnx: already exists \(the int8 model written beside "
                                             r".*m\.onnx\); --force replaces it"):
        export(run, "onnx", q / "m.onnx", quantize="int8")
    assert snapshot(q) == {"m.int8.onnx": b"mine\n"}


def test_export_default_places_stay_replaceable(run):
    for _ in range(2):  # RUN/model.npz is re-made from the run
        proc = run_cli("export", str(run), "--format", "npz", "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["out"] == str(run / "model.npz")
    res = export(run, "safetensors")
    assert res["out"] == str(run / "model.weights.safetensors")
    assert export(run, "safetensors")["out"] == res["out"]


def test_export_out_that_is_no_file_name(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.symlink("loop1", "loop1")
    assert_one_line_error(run_cli("export", str(run), "--format", "npz", "--out", "loop1"),
                          "loop1: already exists", "--force")
    assert os.readlink("loop1") == "loop1"
    assert_one_line_error(run_cli("export", str(run), "--format", "npz", "--out", "newdir/"),
                          "newdir/: ends with '/'", "newdir/model.npz")
    assert_one_line_error(run_cli("export", str(run), "--format", "npz", "--out", "newdir/."),
                          "newdir/.: ends with '.'")
    for empty in ("", " "):
        assert_one_line_error(run_cli("export", str(run), "--format", "npz", "--out", empty),
                              "mnistflow: error: --out is empty: name the file to write (e.g. model.npz)")
    assert not os.path.lexists("newdir")
    with pytest.raises(MnistflowError, match=r"x\.onnx: the name of an onnx file, not npz: name it \*\.npz"):
        export(run, "npz", "x.onnx")
    with pytest.raises(MnistflowError, match=r"m\.NPZ: the name of an npz file, not safetensors"):
        export(run, "safetensors", "m.NPZ")
    assert sorted(os.listdir(".")) == ["loop1"]
    export(run, "npz", "loop1", force=True)  # the link is replaced, not followed
    assert Path("loop1").is_file() and not Path("loop1").is_symlink()


# --- report: where it writes ---------------------------------------------------------------

pytest.importorskip("matplotlib")

from mnistflow import reporting  # noqa: E402
from mnistflow.reporting import HTML_FILE, PLOT_SIZES, report  # noqa: E402


def test_report_out_with_the_users_files_needs_force(run, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / HTML_FILE).write_text("mine\n")
    (site / "loss.png").write_bytes(b"my plot")
    (site / "notes.txt").write_text("keep\n")
    before = snapshot(tmp_path)
    proc = run_cli("report", str(run), "--out", str(site), "--device", "cpu")
    assert_one_line_error(proc, f"{site}: is not empty", "--force")
    assert snapshot(tmp_path) == before
    proc = run_cli("report", str(run), "--out", str(site), "--device", "cpu", "--force")
    assert proc.returncode == 0, proc.stderr
    assert "<title>mnistflow report: " in (site / HTML_FILE).read_text()
    assert (site / "loss.png").read_bytes().startswith(b"\x89PNG")
    assert (site / "notes.txt").read_text() == "keep\n"  # what the report does not write stays
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]  # no temporary folder left
    (site / "lr.png").unlink()
    (site / "lr.png").mkdir()  # a folder in the way of one file: refused before any file moves
    before = snapshot(tmp_path)
    with pytest.raises(MnistflowError, match=r"site/lr\.png: is a directory, not a file"):
        report(run, out=site, device="cpu", force=True)
    assert snapshot(tmp_path) == before


def test_report_out_holding_an_earlier_report(run, tmp_path):
    out = tmp_path / "rep"
    report(run, out=out, compare=[run], device="cpu")
    before = snapshot(tmp_path)
    with pytest.raises(MnistflowError, match=r"rep: holds an earlier report; --force replaces it"):
        report(run, out=out, device="cpu")
    assert snapshot(tmp_path) == before
    report(run, out=out, device="cpu", force=True)
    assert sorted(p.name for p in out.iterdir()) == sorted([*PLOT_SIZES, HTML_FILE])  # compare.png went
    empty = tmp_path / "empty"
    empty.mkdir()
    assert report(run, out=empty, device="cpu") == empty / HTML_FILE  # an empty folder is fine
    afile = tmp_path / "afile"
    afile.write_text("keep\n")
    for force in (False, True):  # a file is never replaced by the folder
        with pytest.raises(MnistflowError, match="afile: is a file"):
            report(run, out=afile, device="cpu", force=force)
        assert afile.read_text() == "keep\n"


def test_report_default_folder_stays_replaceable(run):
    for _ in range(2):
        proc = run_cli("report", str(run), "--device", "cpu")
        assert proc.returncode == 0, proc.stderr
    assert (run / "report" / HTML_FILE).is_file()


def test_a_failed_report_leaves_the_folder_as_it_was(run, tmp_path, monkeypatch):
    def broken(*a, **k):
        raise MnistflowError("the page failed")

    out = tmp_path / "new"
    monkeypatch.setattr(reporting, "render_html", broken)
    with pytest.raises(MnistflowError, match="the page failed"):
        report(run, out=out, device="cpu")
    assert list(tmp_path.iterdir()) == []  # no PNGs without a page, no temporary folder
    monkeypatch.undo()
    report(run, out=out, device="cpu")
    before = snapshot(tmp_path)
    monkeypatch.setattr(reporting, "render_html", broken)
    with pytest.raises(MnistflowError, match="the page failed"):
        report(run, out=out, device="cpu", force=True)
    assert snapshot(tmp_path) == before


# --- report: tampered run files ------------------------------------------------------------

@pytest.fixture
def copy(run, tmp_path) -> Path:
    c = tmp_path / "copy"
    shutil.copytree(run, c, ignore=shutil.ignore_patterns("report", "*.npz", "*.onnx", "*.weights.*"))
    return c


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "summary.json: is a list, not a JSON object"),
    ('"hello"', "summary.json: is a string, not a JSON object"),
    ('{"wall_s": "1.5"}', "summary.json: 'wall_s' is a string, not a number"),
    ('{"img_per_s": "fast"}', "summary.json: 'img_per_s' is a string, not a number"),
    ('{"test_acc": [0.9]}', "summary.json: 'test_acc' is a list, not a number"),
    ("[" * 100_000, "summary.json: is not valid JSON"),
])
def test_a_tampered_summary_is_one_line(copy, text, message):
    (copy / "summary.json").write_text(text)
    with pytest.raises(MnistflowError, match=message.replace("[", r"\[").replace(".", r"\.")):
        report(copy, device="cpu")
    assert not (copy / "report").exists()


@pytest.mark.parametrize("tamper, message", [
    (lambda f: f.write_text("[1, 2]"), "summary.json: is a list, not a JSON object"),
    (lambda f: f.write_text("null"), "summary.json: is null, not a JSON object"),
    (lambda f: os.truncate(f, 1 << 30), "summary.json: a run file of 1,073,741,824 bytes is over the"),
])
def test_eval_ignores_an_unusable_summary_with_one_warning(copy, tamper, message):
    """eval reads the summary only for the run's precision (``--precision auto``): a tampered
    one (was an AttributeError traceback; a 1 GiB sparse file made 2.4 GB RSS) is the same
    capped, checked reader's message as a warning, and the model is evaluated in fp32."""
    (copy / "summary.json").write_text("")
    tamper(copy / "summary.json")
    proc = run_cli("eval", str(copy), "--device", "cpu", env={"MNISTFLOW_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("mnistflow: warning: ") and message in lines[0], lines
    assert "evaluating in fp32" in lines[0] and "accuracy" in proc.stdout


def test_a_summary_lacking_fields_leaves_out_the_table(copy):
    (copy / "summary.json").write_text('{"x": 1}')
    page = report(copy, device="cpu").read_text()
    assert "summary.json lacks what the end-of-run table shows (wall_s, " in page


def test_a_tampered_config_is_one_line(copy):
    text = (copy / "config.toml").read_text()
    (copy / "config.toml").write_text(text + 'target_acc = "x"\n')
    proc = run_cli("report", str(copy), "--device", "cpu")
    assert_one_line_error(proc, "config.toml: target_acc is a string, not a number")
    (copy / "config.toml").write_bytes(b'model = "\xff\xfe"\n')
    with pytest.raises(MnistflowError, match=r"config\.toml: is not UTF-8 text"):
        report(copy, device="cpu")
    (copy / "config.toml").write_text("a = " + "[" * 100_000)
    with pytest.raises(MnistflowError, match=r"config\.toml: not valid TOML"):
        report(copy, device="cpu")
    (copy / "config.toml").write_text(text + "when = 1979-05-27T07:32:00Z\n")  # not JSON: shown as text
    assert "1979-05-27 07:32:00+00:00" in report(copy, device="cpu").read_text()


@pytest.mark.parametrize("name", ["metrics.jsonl", "summary.json", "config.toml"])
def test_a_fifo_is_refused_not_read(copy, name):
    (copy / name).unlink()
    os.mkfifo(copy / name)
    proc = run_cli("report", str(copy), "--device", "cpu", timeout=120)  # would block on the FIFO
    assert_one_line_error(proc, f"{name}: not a regular file (a FIFO); refusing to read it")


def test_run_files_are_read_with_a_cap(copy):
    from mnistflow.core import limits

    shutil.copy(copy / "metrics.jsonl", copy / "m.bak")
    with open(copy / "metrics.jsonl", "r+b") as f:  # sparse: no disk, no memory unless read
        f.truncate(limits.MAX_METRICS_BYTES + 1)
    over = limits.MAX_METRICS_BYTES + 1
    with pytest.raises(MnistflowError, match=rf"metrics\.jsonl: a metrics log of {over:,} bytes is over "
                                             rf"the {over - 1:,}-byte limit"):
        report(copy, device="cpu")
    os.replace(copy / "m.bak", copy / "metrics.jsonl")
    with open(copy / "summary.json", "r+b") as f:
        f.truncate(limits.MAX_RUN_FILE_BYTES + 1)
    with pytest.raises(MnistflowError, match=r"summary\.json: a run file of 4,194,305 bytes is over the "
                                             r"4,194,304-byte limit"):
        report(copy, device="cpu")


def test_hostile_metrics_lines_are_skipped(copy):
    from mnistflow.reporting.plots import plot_compare, plot_curve, plot_lr, plot_throughput
    from mnistflow.artifacts.runlog import load_run

    with open(copy / "metrics.jsonl", "ab") as f:
        f.write(b'{"kind": "train", "step": 1' + b"0" * 400 + b', "loss": 1}\n')  # a 400-digit step
        f.write(b'{"kind": "train", "step": 7, "epoch": "x", "loss": 1' + b"0" * 400 + b', "lr": true}\n')
        f.write(b'{"kind": "val", "step": 8, "acc": "high"}\n\xff\xfe not text\n' + b"[" * 100_000 + b"\n")
    run = load_run(copy)
    assert all(0 <= r["step"] < 2**53 for r in run.train + run.val)
    assert run.steps_per_epoch and run.steps_per_epoch > 0
    for png in (plot_curve(run, "loss"), plot_curve(run, "acc"), plot_lr(run), plot_throughput(run),
                plot_compare([run, run])):
        assert png.startswith(b"\x89PNG")
