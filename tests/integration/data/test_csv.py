"""CSV reader: round trips (grey, RGB, header, gzip, sibling test file), errors, the CLI."""
from __future__ import annotations

import gzip

import numpy as np
import pytest

from helpers.cli import assert_one_line_error, run_cli
from mnistflow.data.formats.csv import companion_files, read_csv
from mnistflow.data.formats.idx import read_idx_pair
from mnistflow.data.formats import detect_format
from mnistflow.core.errors import MnistflowError


def digits(mnist_dir, n=50):
    x, y = read_idx_pair(mnist_dir / "t10k-images-idx3-ubyte.gz", mnist_dir / "t10k-labels-idx1-ubyte.gz")
    return np.array(x[:n]), np.array(y[:n])


def csv_text(x, y, header=False, label_last=False):
    flat = x.reshape(len(x), -1)
    lines = []
    if header:
        names = [f"pixel{i}" for i in range(flat.shape[1])]
        lines.append(",".join(names + ["label"] if label_last else ["label"] + names))
    for img, lab in zip(flat.tolist(), y.tolist()):
        cells = [str(v) for v in img]
        lines.append(",".join(cells + [str(lab)] if label_last else [str(lab)] + cells))
    return "\n".join(lines) + "\n"


def _err(path) -> str:
    with pytest.raises(MnistflowError) as e:
        read_csv(path)
    assert str(e.value).startswith(str(path) + ":"), str(e.value)
    return str(e.value)


def test_round_trip_no_header(tmp_path, mnist_dir):
    x, y = digits(mnist_dir)
    p = tmp_path / "digits.csv"
    p.write_text(csv_text(x, y))
    raw = read_csv(p)
    np.testing.assert_array_equal(raw.train.x, x)
    np.testing.assert_array_equal(np.asarray(raw.values)[raw.train.y], y)
    assert raw.train.x.dtype == np.uint8 and raw.train.y.dtype == np.int64
    assert raw.class_names == [str(v) for v in np.unique(y)]
    assert raw.test is None and raw.name == "digits"
    assert detect_format(p) == "csv"


def test_header_label_column_gzip_crlf(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 20)
    p = tmp_path / "d.csv.gz"
    p.write_bytes(gzip.compress(csv_text(x, y, header=True, label_last=True).replace("\n", "\r\n").encode()))
    raw = read_csv(p)
    np.testing.assert_array_equal(raw.train.x, x)
    np.testing.assert_array_equal(np.asarray(raw.values)[raw.train.y], y)
    assert detect_format(p) == "csv"


def test_rgb_is_channel_last(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (7, 4, 4, 3), dtype=np.uint8)
    y = rng.integers(0, 3, 7)
    p = tmp_path / "rgb.csv"
    p.write_text(csv_text(x, y))
    raw = read_csv(p)
    assert raw.train.x.shape == (7, 4, 4, 3)
    np.testing.assert_array_equal(raw.train.x, x)


def test_integral_floats_accepted(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 3)
    p = tmp_path / "f.csv"
    p.write_text("\n".join(",".join(f"{v}.0" for v in [lab, *img]) for lab, img in
                           zip(y.tolist(), x.reshape(3, -1).tolist())))
    np.testing.assert_array_equal(read_csv(p).train.x, x)


def test_sibling_test_file(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 30)
    (tmp_path / "mnist_train.csv").write_text(csv_text(x[:20], y[:20]))
    (tmp_path / "mnist_test.csv").write_text(csv_text(x[20:], y[20:]))
    assert companion_files(tmp_path / "mnist_train.csv") == [tmp_path / "mnist_test.csv"]
    raw = read_csv(tmp_path / "mnist_train.csv")
    np.testing.assert_array_equal(raw.test.x, x[20:])
    np.testing.assert_array_equal(np.asarray(raw.values)[raw.test.y], y[20:])
    assert raw.source_files == [tmp_path / "mnist_train.csv", tmp_path / "mnist_test.csv"]


def test_unlabelled_sibling_is_ignored(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 10)
    (tmp_path / "train.csv").write_text(csv_text(x, y, header=True))
    flat = x.reshape(10, -1)
    (tmp_path / "test.csv").write_text("\n".join(",".join(map(str, r)) for r in flat.tolist()))
    raw = read_csv(tmp_path / "train.csv")
    assert raw.test is None
    np.testing.assert_array_equal(raw.train.x, x)


def test_errors(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 8)
    lines = csv_text(x, y).splitlines()

    p = tmp_path / "word.csv"
    bad = lines[:]
    bad[6] = bad[6].replace(",0,", ",x7,", 1)
    p.write_text("\n".join(bad))
    m = _err(p)
    assert "line 7" in m and "x7" in m

    p = tmp_path / "range.csv"
    bad = lines[:]
    bad[3] = bad[3].replace(",0,", ",256,", 1)
    p.write_text("\n".join(bad))
    m = _err(p)
    assert "line 4" in m and "256" in m

    p = tmp_path / "neg.csv"
    bad = lines[:]
    bad[2] = bad[2].replace(",0,", ",-1,", 1)
    p.write_text("\n".join(bad))
    assert "line 3" in _err(p)

    p = tmp_path / "ragged.csv"
    bad = lines[:]
    bad[5] = bad[5] + ",0"
    p.write_text("\n".join(bad))
    assert "line 6" in _err(p)

    p = tmp_path / "frac.csv"
    bad = lines[:]
    bad[1] = bad[1].replace(",0,", ",0.5,", 1)
    p.write_text("\n".join(bad))
    assert "line 2" in _err(p)

    p = tmp_path / "badlabel.csv"
    bad = lines[:]
    bad[4] = "-3" + bad[4][bad[4].index(","):]
    p.write_text("\n".join(bad))
    assert "line 5" in _err(p)

    p = tmp_path / "nonsquare.csv"
    p.write_text("1,2,3\n4,5,6\n")
    assert "square" in _err(p)

    p = tmp_path / "empty.csv"
    p.write_text("\n\n")
    _err(p)

    p = tmp_path / "header_only.csv"
    p.write_text("label,pixel0\n")
    _err(p)

    p = tmp_path / "binary.csv"
    p.write_bytes(b"\xff\xfe\x00\x01garbage")
    _err(p)

    p = tmp_path / "notgz.csv.gz"
    p.write_text("1,2\n")
    _err(p)


def test_cli_prep_and_records(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 30)
    (tmp_path / "mnist_train.csv").write_text(csv_text(x[:20], y[:20], header=True))
    (tmp_path / "mnist_test.csv").write_text(csv_text(x[20:], y[20:], header=True))
    out = tmp_path / "rec"
    p = run_cli("prep", "--data", str(tmp_path / "mnist_train.csv"), "--out", str(out), "--val-size", "5")
    assert p.returncode == 0, p.stderr
    r = run_cli("records", str(out))
    assert r.returncode == 0, r.stderr
    assert "28x28x1" in r.stdout and "checksums OK" in r.stdout
    assert "test      10" in r.stdout


def test_cli_bad_csv(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 10)
    lines = csv_text(x, y).splitlines()
    lines[8] = lines[8].replace(",0,", ",oops,", 1)
    p = tmp_path / "bad.csv"
    p.write_text("\n".join(lines))
    out = tmp_path / "rec"
    proc = run_cli("prep", "--data", str(p), "--out", str(out), "--val-size", "5")
    assert_one_line_error(proc, "bad.csv", "line 9")
    assert not out.exists() and not list(tmp_path.glob(".rec.tmp-*"))
