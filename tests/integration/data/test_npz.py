"""Keras-style .npz: round trips, dtypes and shapes, refusing pickles, errors, the CLI."""
from __future__ import annotations

import re

import numpy as np
import pytest

from helpers.cli import assert_one_line_error, run_cli
from mnistflow.data.formats.idx import read_idx_pair
from mnistflow.data.formats.npz import read_npz
from mnistflow.data.formats import detect_format
from mnistflow.core.errors import MnistflowError


def digits(mnist_dir, n=50):
    x, y = read_idx_pair(mnist_dir / "t10k-images-idx3-ubyte.gz", mnist_dir / "t10k-labels-idx1-ubyte.gz")
    return np.array(x[:n, ..., 0]), np.array(y[:n])


def _err(path, *fragments) -> str:
    with pytest.raises(MnistflowError) as e:
        read_npz(path)
    msg = str(e.value)
    assert msg.startswith(str(path) + ":"), msg
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_round_trip_keras_layout(tmp_path, mnist_dir, save):
    x, y = digits(mnist_dir)
    p = tmp_path / "mnist.npz"
    save(p, x_train=x[:40], y_train=y[:40].astype(np.uint8), x_test=x[40:], y_test=y[40:])
    raw = read_npz(p)
    np.testing.assert_array_equal(raw.train.x[..., 0], x[:40])
    np.testing.assert_array_equal(np.asarray(raw.values)[raw.train.y], y[:40])
    np.testing.assert_array_equal(raw.test.x[..., 0], x[40:])
    np.testing.assert_array_equal(np.asarray(raw.values)[raw.test.y], y[40:])
    assert raw.train.x.shape == (40, 28, 28, 1) and raw.train.x.dtype == np.uint8
    assert raw.train.y.dtype == np.int64
    assert raw.class_names == [str(v) for v in np.unique(y)]
    assert detect_format(p) == "npz" and raw.name == "mnist"


def test_train_only_rgb_float_and_column_labels(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (6, 5, 5, 3)).astype(np.float32)  # integral floats are fine
    y = rng.integers(0, 4, (6, 1))  # Keras CIFAR labels are (N, 1)
    p = tmp_path / "c.npz"
    np.savez(p, x_train=x, y_train=y)
    raw = read_npz(p)
    assert raw.test is None
    np.testing.assert_array_equal(raw.train.x, x.astype(np.uint8))
    np.testing.assert_array_equal(np.asarray(raw.values)[raw.train.y], y[:, 0])


def test_errors(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 10)

    p = tmp_path / "pickled.npz"
    np.savez(p, x_train=np.array([object(), 1], dtype=object)[:1].repeat(10), y_train=y)
    _err(p, "x_train", "pickle")

    p = tmp_path / "count.npz"
    np.savez(p, x_train=x, y_train=y[:9])
    _err(p, "10", "9")

    p = tmp_path / "testcount.npz"
    np.savez(p, x_train=x, y_train=y, x_test=x[:3], y_test=y[:4])
    _err(p, "x_test", "y_test")

    p = tmp_path / "normalised.npz"
    np.savez(p, x_train=x / 255.0, y_train=y)
    _err(p, "x_train", "integer")

    p = tmp_path / "range.npz"
    np.savez(p, x_train=x.astype(np.int16) * 2, y_train=y)
    _err(p, "0..255")

    p = tmp_path / "keys.npz"
    np.savez(p, images=x, labels=y)
    _err(p, "x_train", "images")

    p = tmp_path / "half.npz"
    np.savez(p, x_train=x, y_train=y, x_test=x)
    _err(p, "y_test")

    p = tmp_path / "neglabel.npz"
    np.savez(p, x_train=x, y_train=y - 5)
    _err(p, "label")

    p = tmp_path / "shape.npz"
    np.savez(p, x_train=x.reshape(10, -1), y_train=y)
    _err(p, "shape")

    p = tmp_path / "testshape.npz"
    np.savez(p, x_train=x, y_train=y, x_test=x[:, :20], y_test=y)
    _err(p, "x_test")

    p = tmp_path / "single.npz"
    np.save(tmp_path / "single.npy", x)
    (tmp_path / "single.npy").rename(p)
    _err(p, ".npy")

    p = tmp_path / "text.npz"
    p.write_text("hello")
    _err(p)

    good = tmp_path / "good.npz"
    np.savez(good, x_train=x, y_train=y)
    p = tmp_path / "trunc.npz"
    p.write_bytes(good.read_bytes()[:3000])
    _err(p)

    _err(tmp_path / "missing.npz")


def test_cli_prep_and_records(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 30)
    p = tmp_path / "mnist.npz"
    np.savez_compressed(p, x_train=x[:20], y_train=y[:20], x_test=x[20:], y_test=y[20:])
    out = tmp_path / "rec"
    proc = run_cli("prep", "--data", str(p), "--out", str(out), "--val-size", "5")
    assert proc.returncode == 0, proc.stderr
    r = run_cli("records", str(out))
    assert r.returncode == 0, r.stderr
    assert "28x28x1" in r.stdout and "test      10" in r.stdout


def test_cli_pickled_npz(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 10)
    p = tmp_path / "evil.npz"
    np.savez(p, x_train=np.array([{"a": 1}] * 10, dtype=object), y_train=y)
    out = tmp_path / "rec"
    proc = run_cli("prep", "--data", str(p), "--out", str(out), "--val-size", "5")
    assert_one_line_error(proc, "evil.npz", "pickle")
    assert not out.exists() and not list(tmp_path.glob(".rec.tmp-*"))


def test_prep_refuses_more_variants_than_the_cap_and_records_that_would_not_fit(tmp_path, mnist_dir, monkeypatch):
    """--variants 1000000000 started writing thousands of full copies of train until the disk
    filled: a cap, and a check of the free space before anything is written."""
    import collections

    import mnistflow
    from mnistflow.data import prepare as prep

    x, y = digits(mnist_dir, n=200)
    src = tmp_path / "d.npz"
    np.savez(src, x_train=x[:150], y_train=y[:150], x_test=x[150:], y_test=y[150:])
    with pytest.raises(MnistflowError, match=r"--variants must be an integer from 0 to 100 \(each is a full "
                                             r"augmented copy of the training images\), got 1000000000"):
        mnistflow.prepare(data=src, out=tmp_path / "r0", variants=10**9, val_size=10, quiet=True)
    bad = [(dict(seed=-1), "--seed must be an integer from 0 to 4294967295, got -1"),  # (numpy's ValueError)
           (dict(seed=2**40), "--seed must be an integer from 0 to 4294967295"),  # (was accepted)
           (dict(val_size="5"), "--val-size must be an integer from 0 to"),  # (a TypeError)
           (dict(variants=1.5), "--variants must be an integer from 0 to 100"),  # (a TypeError)
           (dict(resize=(100000, 100000)), "--resize must be an integer from 1 to 4096, got 100000"),
           (dict(resize=(28,)), "--resize must be (height, width), got (28,)")]
    for kwargs, message in bad:
        with pytest.raises(MnistflowError, match=re.escape(message)):
            mnistflow.prepare(data=src, out=tmp_path / "r0", quiet=True, **kwargs)
    assert not (tmp_path / "r0").exists()
    need = 150 * 784 * 3 + 50 * 784  # train and 2 copies, test (bytes, labels aside)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(prep.shutil, "disk_usage", lambda p: usage(1 << 40, 0, need - 1))
    with pytest.raises(MnistflowError, match=r"r1: the records need ~0\.00 GiB \(2 augmented copies of "
                                             r"train\); 0\.00 GiB are free there"):
        mnistflow.prepare(data=src, out=tmp_path / "r1", variants=2, val_size=10, quiet=True)
    assert not (tmp_path / "r1").exists()
    monkeypatch.setattr(prep.shutil, "disk_usage", lambda p: usage(1 << 40, 0, 1 << 30))
    out = mnistflow.prepare(data=src, out=tmp_path / "r1", variants=2, val_size=10, quiet=True)
    assert mnistflow.open_records(out).variants == 2
