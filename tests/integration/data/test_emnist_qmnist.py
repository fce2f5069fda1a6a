"""EMNIST and QMNIST end to end on small synthetic files (the real ones are not on this
machine): ``mnistflow prep emnist-<split> --data DIR`` with the zip or the separate files,
``prep qmnist --data DIR``, the record sets they write (upright images, original labels as
class ids, names a..z), the one-line errors, and EMNIST's zip downloaded once into the folder
every split shares."""
from __future__ import annotations

import functools
import gzip
import hashlib
import json
import http.server
import threading
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import assert_one_line_error, run_cli

from helpers.idx_files import idx_bytes, l_glyph
from mnistflow.data.known import KNOWN, RemoteFile, locate, lookup
from mnistflow.data.prepare import prepare
from mnistflow.data.records import open_records


def split_files(split: str, n: int) -> dict[str, bytes]:
    """EMNIST's four .gz files and mapping for ``split``: every image an 'L' stored transposed."""
    x = np.stack([l_glyph().T] * n)
    y = (np.arange(n) % 26 + 1) if split == "letters" else (np.arange(n) % 10)
    mapping = ("".join(f"{i} {64 + i} {96 + i}\n" for i in range(1, 27)) if split == "letters"
               else "".join(f"{i} {48 + i}\n" for i in range(10)))
    out = {}
    for s in ("train", "test"):
        out[f"emnist-{split}-{s}-images-idx3-ubyte.gz"] = gzip.compress(idx_bytes(x))
        out[f"emnist-{split}-{s}-labels-idx1-ubyte.gz"] = gzip.compress(idx_bytes(y.astype(np.uint8)))
    out[f"emnist-{split}-mapping.txt"] = mapping.encode()
    return out


def write_zip(folder: Path, splits=("letters", "digits"), n: int = 260) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gzip.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for split in splits:
            for name, data in split_files(split, n).items():
                z.writestr("gzip/" + name, data)
    return path


def write_loose(folder: Path, split: str = "letters", n: int = 260) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in split_files(split, n).items():
        (folder / name).write_bytes(data)


def write_qmnist(folder: Path, n: int = 200) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for s in ("train", "test"):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        rows = np.zeros((n, 8), np.int32)
        rows[:, 0] = np.arange(n) % 10
        rows[:, 2] = 500 + np.arange(n)  # the writer id: must not become a class
        (folder / f"qmnist-{s}-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(x)))
        (folder / f"qmnist-{s}-labels-idx2-int.gz").write_bytes(gzip.compress(idx_bytes(rows, 0x0C)))


def patch_sums(monkeypatch, folder: Path, *names: str) -> None:
    """The synthetic files' md5 become the 'published' ones of ``names``."""
    for name in names:
        ds = KNOWN[name]
        files = tuple(RemoteFile(f.name, hashlib.md5((folder / f.name).read_bytes()).hexdigest())
                      for f in ds.files)
        monkeypatch.setitem(KNOWN, name, replace(ds, files=files))


def assert_letters_records(out: Path, n_total: int) -> None:
    rec = open_records(out)
    assert rec.class_names == [chr(ord("a") + i) for i in range(26)]
    assert tuple(rec.label_values) == tuple(range(1, 27))
    n = 0
    for split in ("train", "val", "test"):
        x, y = rec.split(split)
        assert (np.asarray(x)[..., 0] == l_glyph()).all(), f"{split}: every image upright"
        assert 0 <= int(np.min(y)) and int(np.max(y)) <= 25
        n += len(y)
    assert n == n_total


def test_prep_emnist_letters_from_separate_files_writes_upright_a_to_z(tmp_path):
    write_loose(tmp_path / "raw")
    out = tmp_path / "rec"
    r = run_cli("prep", "emnist-letters", "--data", str(tmp_path / "raw"), "--out", str(out),
                env={"MNISTFLOW_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stderr
    assert_letters_records(out, 520)
    assert not (tmp_path / "home" / "raw").exists()  # nothing downloaded


def test_prep_emnist_from_the_zip_checks_the_published_sum(tmp_path):
    write_zip(tmp_path / "raw")
    r = run_cli("prep", "emnist-letters", "--data", str(tmp_path / "raw"), "--out", str(tmp_path / "rec"))
    assert_one_line_error(r, "gzip.zip", "checksum does not match the published emnist-letters file gzip.zip")


def test_one_zip_serves_every_split(tmp_path, monkeypatch):
    write_zip(tmp_path / "raw" / "emnist")  # the sub-folder every split shares
    patch_sums(monkeypatch, tmp_path / "raw" / "emnist", "emnist-letters", "emnist-digits")
    letters = prepare("emnist-letters", tmp_path / "raw", tmp_path / "letters", quiet=True)
    assert_letters_records(letters, 520)
    digits = open_records(prepare("emnist-digits", tmp_path / "raw", tmp_path / "digits", quiet=True))
    assert digits.class_names == list("0123456789") and tuple(digits.label_values) == tuple(range(10))
    x, _ = digits.split("test")
    assert (np.asarray(x)[..., 0] == l_glyph()).all()
    assert not list((tmp_path / "raw").rglob("*.gz"))  # read in the zip, never extracted


@pytest.mark.parametrize("args, fragments", [
    (["prep", "emnist"], ["emnist-letters", "emnist-byclass", "emnist-mnist"]),
    (["prep", "emnist-balanced"], ["missing emnist-balanced files", "gzip.zip",
                                   "emnist-balanced-train-images-idx3-ubyte.gz"]),
])
def test_emnist_errors_are_one_line(tmp_path, args, fragments):
    (tmp_path / "raw").mkdir()
    r = run_cli(*args, "--data", str(tmp_path / "raw"), "--out", str(tmp_path / "rec"))
    assert_one_line_error(r, *fragments)


def test_prep_qmnist_takes_the_digit_column_of_its_label_rows(tmp_path, monkeypatch):
    write_qmnist(tmp_path / "raw")
    r = run_cli("prep", "qmnist", "--data", str(tmp_path / "raw"), "--out", str(tmp_path / "rec"))
    assert_one_line_error(r, "checksum does not match the published qmnist file")
    patch_sums(monkeypatch, tmp_path / "raw", "qmnist")
    rec = open_records(prepare("qmnist", tmp_path / "raw", tmp_path / "rec", quiet=True))
    assert rec.class_names == list("0123456789") and rec.num_classes == 10
    _, y = rec.split("test")
    assert (np.asarray(y) == np.arange(200) % 10).all()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


def test_emnist_zip_is_downloaded_once_for_every_split(tmp_path, monkeypatch):
    """The zip lands in <home>/raw/emnist/; a second split finds it there, server gone."""
    served = tmp_path / "mirror"
    write_zip(served)
    patch_sums(monkeypatch, served, "emnist-letters", "emnist-digits")
    for k in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.setenv("MNISTFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MNISTFLOW_DATA", raising=False)
    srv = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(served)))
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        monkeypatch.setenv("MNISTFLOW_MIRROR", f"http://127.0.0.1:{srv.server_address[1]}/")
        got = locate(lookup("emnist-letters"))
    finally:
        srv.shutdown()
        srv.server_close()
    assert got == tmp_path / "home" / "raw" / "emnist"
    assert (got / "gzip.zip").read_bytes() == (served / "gzip.zip").read_bytes()
    assert locate(lookup("emnist-digits"), download=False) == got


# --- EMNIST's raw files mean the same on every path (issue 38) ------------------------------

def two_letter_files(folder: Path, n: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """EMNIST-letters' files named as NIST names them, holding two letters that differ only by
    a transposition: 'a' is an upright L, 'b' that L transposed. Each image is stored
    transposed, as NIST stores them; a path that forgets to turn them upright swaps a and b.
    Returns the upright test images and their labels."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    out = {}
    for s in ("train", "test"):
        y = (np.arange(n) % 2 + 1).astype(np.uint8)  # 1: a, 2: b
        up = np.stack([np.roll(l_glyph() if v == 1 else l_glyph().T, tuple(rng.integers(-2, 3, 2)), (0, 1))
                       for v in y])
        (folder / f"emnist-letters-{s}-images-idx3-ubyte.gz").write_bytes(
            gzip.compress(idx_bytes(up.transpose(0, 2, 1))))
        (folder / f"emnist-letters-{s}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(y)))
        out[s] = up, y
    (folder / "emnist-letters-mapping.txt").write_text("".join(f"{i} {64 + i} {96 + i}\n" for i in range(1, 27)))
    return out["test"]


def same_records(a: Path, b: Path) -> None:
    ra, rb = open_records(a), open_records(b)
    assert ra.name == rb.name == "emnist-letters" and ra.class_names == rb.class_names
    for split in ("train", "val", "test"):
        (xa, ya), (xb, yb) = ra.split(split), rb.split(split)
        assert (np.asarray(xa) == np.asarray(xb)).all() and (np.asarray(ya) == np.asarray(yb)).all()


def test_emnists_raw_files_are_upright_on_every_path(tmp_path):
    raw = tmp_path / "raw"
    test_x, test_y = two_letter_files(raw)
    known = prepare("emnist-letters", raw, tmp_path / "known", quiet=True)  # the known reader
    x, y = open_records(known).split("test")
    assert (np.asarray(x)[..., 0] == test_x).all() and (np.asarray(y) + 1 == test_y).all()

    # prep of the raw folder, or of one of its files, without naming the dataset
    for name, data in (("folder", raw), ("file", raw / "emnist-letters-train-images-idx3-ubyte.gz")):
        r = run_cli("prep", "--data", str(data), "--out", str(tmp_path / name))
        assert r.returncode == 0, r.stderr
        same_records(known, tmp_path / name)

    # train --data, eval --data, predict of the IDX file, report --data
    run = tmp_path / "run"
    r = run_cli("train", "--recipe", "softmax", "--data", str(raw), "--run-dir", str(run), "--max-steps", "40",
                "--no-tensorboard", "--threads", "1", "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["test_acc"] >= 0.95
    r = run_cli("eval", str(run), "--data", str(raw), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["acc"] >= 0.95  # transposed images would score ~0: a and b swapped
    r = run_cli("predict", str(run), str(raw / "emnist-letters-test-images-idx3-ubyte.gz"), "--json")
    assert r.returncode == 0, r.stderr
    preds = json.loads(r.stdout)
    assert len(preds) == len(test_y) and {p["preprocess"] for p in preds} == {"none"}
    assert np.mean([p["label"] == t for p, t in zip(preds, test_y)]) >= 0.95
    assert {p["name"] for p in preds} == {"a", "b"}
    from mnistflow.reporting.run import predict_split

    assert predict_split(run, data=raw).acc >= 0.95
    r = run_cli("report", str(run), "--data", str(raw), "--out", str(tmp_path / "report"))
    assert r.returncode == 0, r.stderr


def test_a_folder_of_several_emnist_splits_still_asks_which(tmp_path):
    write_loose(tmp_path / "raw", "letters")
    write_loose(tmp_path / "raw", "digits")
    r = run_cli("prep", "--data", str(tmp_path / "raw"), "--out", str(tmp_path / "rec"))
    assert_one_line_error(r, "holds emnist-", "name the dataset")
