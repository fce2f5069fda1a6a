"""IDX reading and the record format, on the real MNIST files."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil

import numpy as np
import pytest

from helpers.cli import assert_one_line_error, run_cli
from mnistflow.data.formats.idx import parse_idx, read_idx, read_idx_pair
from mnistflow.data.records import FORMAT_VERSION, open_records
from mnistflow.data.write_records import split_train_val
from mnistflow.core.errors import MnistflowError
from mnistflow.data.prepare import prepare


def test_real_mnist_idx(mnist_dir):
    x, y = read_idx_pair(mnist_dir / "train-images-idx3-ubyte.gz", mnist_dir / "train-labels-idx1-ubyte.gz")
    assert x.shape == (60000, 28, 28, 1) and x.dtype == np.uint8
    # The published uncompressed md5 of the image file matches what we decoded.
    raw = gzip.decompress((mnist_dir / "train-images-idx3-ubyte.gz").read_bytes())
    assert hashlib.md5(raw).hexdigest() == "6bbc9ace898e44ae57da46a324031adb"
    assert np.array_equal(np.frombuffer(raw, np.uint8, offset=16).reshape(60000, 28, 28), x[..., 0])
    assert y[:5].tolist() == [5, 0, 4, 1, 9]  # the famous first five training labels
    assert np.bincount(y).tolist()[1] == 6742  # MNIST's class counts: 6742 ones
    t = read_idx(mnist_dir / "t10k-labels-idx1-ubyte.gz")
    assert len(t) == 10000 and t[0] == 7


def _idx(shape, data: bytes, code=0x08):
    return bytes([0, 0, code, len(shape)]) + b"".join(int(s).to_bytes(4, "big") for s in shape) + data


@pytest.mark.parametrize("blob,fragment", [
    (b"\x00\x01\x08\x03" + b"\x00" * 12, "magic"),
    (_idx((2, 2, 2), b"\x00" * 7), "truncated"),
    (_idx((2, 2, 2), b"\x00" * 9), "trailing"),
    (_idx((2,), b"\x00" * 2, code=0x42), "data type"),
    (b"\x00\x00", "too short"),
])
def test_parse_idx_rejects(blob, fragment):
    with pytest.raises(MnistflowError, match=fragment):
        parse_idx(blob, "f.idx")


def test_records_split_and_stats(mnist_records, mnist_dir):
    rec = open_records(mnist_records)
    assert rec.meta["splits"] == {"train": 55000, "val": 5000, "test": 10000}
    assert rec.shape == (28, 28, 1) and rec.num_classes == 10
    xtr, ytr = rec.split("train")
    xva, yva = rec.split("val")
    x, y = read_idx_pair(mnist_dir / "train-images-idx3-ubyte.gz", mnist_dir / "train-labels-idx1-ubyte.gz")
    tr_idx, va_idx = split_train_val(60000, 5000, 0)
    assert np.array_equal(xtr, x[tr_idx]) and np.array_equal(yva, y[va_idx])
    assert isinstance(xtr, np.memmap)  # opened by memory map, not read into memory
    # mean/std recorded in 0..255 units, from the training split only
    assert rec.mean[0] == pytest.approx(xtr.astype(np.float64).mean(), rel=1e-9)
    assert rec.std[0] == pytest.approx(xtr.astype(np.float64).std(), rel=1e-6)


def test_split_is_a_function_of_the_seed():
    a = split_train_val(1000, 100, 1)
    b = split_train_val(1000, 100, 1)
    c = split_train_val(1000, 100, 2)
    assert np.array_equal(a[1], b[1]) and not np.array_equal(a[1], c[1])
    assert sorted(np.concatenate(a).tolist()) == list(range(1000))


def test_prep_is_a_noop_when_up_to_date_and_force_rebuilds(mnist_dir, tmp_path, capsys):
    out = prepare("mnist", mnist_dir, tmp_path / "r", val_size=1000)
    stamp = os.stat(out / "train_x.npy").st_mtime_ns
    prepare("mnist", mnist_dir, tmp_path / "r", val_size=1000)
    assert "up to date" in capsys.readouterr().out
    assert os.stat(out / "train_x.npy").st_mtime_ns == stamp
    prepare("mnist", mnist_dir, tmp_path / "r", val_size=2000)  # other options: rebuilt
    assert open_records(out).meta["splits"]["val"] == 2000
    prepare("mnist", mnist_dir, tmp_path / "r", val_size=2000, force=True)
    assert os.stat(out / "train_x.npy").st_mtime_ns != stamp


def test_variants_are_augmented_copies(mnist_dir, tmp_path):
    out = prepare("mnist", mnist_dir, tmp_path / "v", variants=1, quiet=True)
    rec = open_records(out)
    x0, y0 = rec.split("train")
    x1, y1 = rec.split("train", 1)
    assert x1.shape == x0.shape and np.array_equal(y0, y1)
    diff = np.abs(x1[:500].astype(int) - x0[:500].astype(int)).mean()
    assert 1 < diff < 60  # changed, but still the same digits (not noise)
    # the ink stays about the same: shifts and small rotations do not erase digits
    assert abs(x1[:500].mean() - x0[:500].mean()) < 0.15 * x0[:500].mean()


def test_records_cli_verifies_checksums(mnist_records, tmp_path):
    ok = run_cli("records", str(mnist_records))
    assert ok.returncode == 0 and "55,000" in ok.stdout and "checksums OK" in ok.stdout
    bad = tmp_path / "bad"
    shutil.copytree(mnist_records, bad)
    with open(bad / "val_y.npy", "r+b") as f:
        f.seek(-1, 2)
        f.write(b"\x07")
    assert_one_line_error(run_cli("records", str(bad)), "val_y.npy", "checksum")
    assert_one_line_error(run_cli("train", "--data", str(bad), "--max-steps", "1"), "val_y.npy")


def test_another_format_version_is_refused(mnist_records, tmp_path):
    new = tmp_path / "new"
    shutil.copytree(mnist_records, new)
    meta = json.loads((new / "meta.json").read_text())
    meta["format_version"] = FORMAT_VERSION + 1
    (new / "meta.json").write_text(json.dumps(meta))
    assert_one_line_error(run_cli("records", str(new)), f"record format {FORMAT_VERSION + 1}",
                          "re-run 'mnistflow prep --force'")


@pytest.mark.parametrize("damage,fragment", [
    ("truncate", "truncated"), ("not-gzip", "gzip"), ("count", "labels for"),
])
def test_bad_idx_input_exits_2_and_leaves_nothing(mnist_dir, tmp_path, damage, fragment):
    src = tmp_path / "src"
    src.mkdir()
    for f in mnist_dir.iterdir():
        if f.name.startswith("t10k"):
            shutil.copy(f, src / f.name)
    x = read_idx(mnist_dir / "t10k-images-idx3-ubyte.gz")[:300]
    y = read_idx(mnist_dir / "t10k-labels-idx1-ubyte.gz")[:300].copy()
    img = _idx(x.shape, x.tobytes())
    lab = _idx(y.shape, y.tobytes())
    target = "train-images-idx3-ubyte.gz"
    if damage == "truncate":
        img = gzip.compress(img)[:-200]
    elif damage == "not-gzip":
        img = b"this is not gzip data at all"
    elif damage == "count":
        lab = _idx((299,), y[:299].tobytes())
        target = "train-labels-idx1-ubyte.gz"
        img = gzip.compress(img)
    (src / "train-images-idx3-ubyte.gz").write_bytes(img)
    (src / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(lab))
    out = tmp_path / "out"
    proc = run_cli("prep", "--data", str(src), "--out", str(out), "--val-size", "10")
    assert_one_line_error(proc, target, fragment)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_known_dataset_checksum_mismatch(tmp_path):
    fake = tmp_path / "mnist"
    fake.mkdir()
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (fake / name).write_bytes(gzip.compress(b"not mnist"))
    proc = run_cli("prep", "mnist", "--data", str(fake), "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, "train-images-idx3-ubyte.gz", "checksum")
    assert not (tmp_path / "o").exists()


def test_idx_folder_takes_its_classes_from_the_labels(mnist_dir, tmp_path):
    x = read_idx(mnist_dir / "t10k-images-idx3-ubyte.gz")[:200]
    y = read_idx(mnist_dir / "t10k-labels-idx1-ubyte.gz")[:200].copy()
    y[17] = 11  # a 12th class: labels are not assumed to be 0-9
    (tmp_path / "train-images-idx3-ubyte").write_bytes(_idx(x.shape, x.tobytes()))
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(_idx(y.shape, y.tobytes()))
    rec = open_records(prepare(data=tmp_path, out=tmp_path / "r", val_size=20, quiet=True))
    assert rec.num_classes == 11 and rec.class_names[-1] == "11" and rec.label_values[-1] == 11  # no empty class 10
