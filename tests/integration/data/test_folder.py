"""Folder of class folders: round trips with real MNIST digits, layouts, errors, the CLI."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, run_cli
from mnistflow.data.formats.folder import read_image_folder
from mnistflow.data.formats.idx import read_idx_pair
from mnistflow.data.formats import detect_format, read_source
from mnistflow.core.errors import MnistflowError


def digits(mnist_dir, n=50, start=0):
    x, y = read_idx_pair(mnist_dir / "t10k-images-idx3-ubyte.gz", mnist_dir / "t10k-labels-idx1-ubyte.gz")
    return np.array(x[start:start + n]), np.array(y[start:start + n])


def write_folder(root, x, y, ext="png"):
    """Write digit i as root/<label>/<i:03d>.<ext>; return the expected (x, y, classes)."""
    for i, (img, lab) in enumerate(zip(x, y)):
        d = root / str(lab)
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img[..., 0]).save(d / f"{i:03d}.{ext}")
    classes = sorted({str(v) for v in y.tolist()})
    order = sorted(range(len(y)), key=lambda i: (classes.index(str(y[i])), i))
    return x[order], np.array([classes.index(str(y[i])) for i in order]), classes


def assert_no_output(out):
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.tmp-*"))


def test_round_trip_png(tmp_path, mnist_dir):
    x, y = digits(mnist_dir)
    ex, ey, classes = write_folder(tmp_path / "digits", x, y)
    raw = read_image_folder(tmp_path / "digits")
    assert raw.class_names == classes
    assert raw.train.x.shape == (50, 28, 28, 1) and raw.train.x.dtype == np.uint8
    assert raw.train.y.dtype == np.int64
    np.testing.assert_array_equal(raw.train.x, ex)
    np.testing.assert_array_equal(raw.train.y, ey)
    assert raw.test is None and raw.name == "digits"
    assert detect_format(tmp_path / "digits") == "folder"
    np.testing.assert_array_equal(read_source(tmp_path / "digits").train.x, ex)


@pytest.mark.parametrize("names", [("train", "test"), ("training", "testing")])
def test_train_test_layout(tmp_path, mnist_dir, names):
    x, y = digits(mnist_dir, 40)
    ex, ey, classes = write_folder(tmp_path / "d" / names[0], x[:30], y[:30])
    tx, ty, tclasses = write_folder(tmp_path / "d" / names[1], x[30:], y[30:])
    raw = read_image_folder(tmp_path / "d")
    assert raw.class_names == classes
    np.testing.assert_array_equal(raw.train.x, ex)
    np.testing.assert_array_equal(raw.train.y, ey)
    np.testing.assert_array_equal(raw.test.x, tx)
    np.testing.assert_array_equal(raw.test.y, [classes.index(tclasses[i]) for i in ty])


def test_rgb_makes_every_image_rgb(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 6)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    Image.fromarray(x[0, ..., 0]).save(tmp_path / "a" / "grey.png")
    rgb = np.stack([x[1, ..., 0], x[2, ..., 0], x[3, ..., 0]], -1)
    Image.fromarray(rgb).save(tmp_path / "b" / "colour.png")
    raw = read_image_folder(tmp_path)
    assert raw.train.x.shape == (2, 28, 28, 3)
    np.testing.assert_array_equal(raw.train.x[0], np.repeat(x[0], 3, -1))
    np.testing.assert_array_equal(raw.train.x[1], rgb)
    np.testing.assert_array_equal(raw.train.y, [0, 1])


def test_grey_palette_stays_grey(tmp_path, mnist_dir):
    x, _ = digits(mnist_dir, 1)
    (tmp_path / "c").mkdir()
    Image.fromarray(x[0, ..., 0]).convert("P").save(tmp_path / "c" / "p.png")
    raw = read_image_folder(tmp_path)
    assert raw.train.x.shape == (1, 28, 28, 1)


def test_jpeg(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 10)
    ex, ey, _ = write_folder(tmp_path / "j", x, y, ext="jpg")
    raw = read_image_folder(tmp_path / "j")
    assert raw.train.x.shape == (10, 28, 28, 1)
    np.testing.assert_array_equal(raw.train.y, ey)
    assert np.abs(raw.train.x.astype(int) - ex).mean() < 8  # lossy, but the same digits


def test_differing_sizes_error_and_resize(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 4)
    write_folder(tmp_path / "s", x, y)
    odd = tmp_path / "s" / str(y[0]) / "zzz_big.png"
    Image.fromarray(np.zeros((30, 29), np.uint8)).save(odd)
    with pytest.raises(MnistflowError) as e:
        read_image_folder(tmp_path / "s")
    msg = str(e.value)
    assert msg.startswith(str(odd)) and "30x29" in msg and "28x28" in msg
    raw = read_image_folder(tmp_path / "s", resize=(16, 20))
    assert raw.train.x.shape == (5, 16, 20, 1)


def _err(path, **kw) -> str:
    with pytest.raises(MnistflowError) as e:
        read_image_folder(path, **kw)
    return str(e.value)


def test_errors_name_the_file(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 4)
    (tmp_path / "empty").mkdir()
    assert _err(tmp_path / "empty").startswith(str(tmp_path / "empty"))

    write_folder(tmp_path / "nocls", x, y)
    (tmp_path / "nocls" / "zz").mkdir()
    assert _err(tmp_path / "nocls").startswith(str(tmp_path / "nocls" / "zz") + ":")

    write_folder(tmp_path / "txt", x, y)
    note = tmp_path / "txt" / str(y[0]) / "notes.txt"
    note.write_text("hello")
    assert _err(tmp_path / "txt").startswith(str(note) + ":")

    write_folder(tmp_path / "fake", x, y)
    fake = tmp_path / "fake" / str(y[1]) / "fake.png"
    fake.write_text("not a png")
    assert _err(tmp_path / "fake").startswith(str(fake) + ":")

    write_folder(tmp_path / "trunc", x, y)
    good = next((tmp_path / "trunc" / str(y[2])).glob("*.png"))
    good.write_bytes(good.read_bytes()[:60])
    assert _err(tmp_path / "trunc").startswith(str(good) + ":")

    assert _err(tmp_path / "missing").startswith(str(tmp_path / "missing"))


def test_cli_prep_and_records(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 30)
    write_folder(tmp_path / "digits", x, y)
    out = tmp_path / "rec"
    p = run_cli("prep", "--data", str(tmp_path / "digits"), "--out", str(out), "--val-size", "5")
    assert p.returncode == 0, p.stderr
    r = run_cli("records", str(out))
    assert r.returncode == 0, r.stderr
    assert "28x28x1" in r.stdout and "checksums OK" in r.stdout


def test_cli_bad_image(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 10)
    write_folder(tmp_path / "digits", x, y)
    (tmp_path / "digits" / str(y[0]) / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nrubbish")
    out = tmp_path / "rec"
    p = run_cli("prep", "--data", str(tmp_path / "digits"), "--out", str(out), "--val-size", "5")
    assert_one_line_error(p, "broken.png")
    assert_no_output(out)
