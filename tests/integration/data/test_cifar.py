"""CIFAR-10 python batches: a small fake archive with the real structure, the restricted
unpickler refusing anything but numpy arrays, errors naming the member, the CLI."""
from __future__ import annotations

import io
import os
import pickle
import tarfile

import numpy as np
import pytest

from helpers.cli import assert_one_line_error, run_cli
from mnistflow.data.formats.cifar import read_cifar10, safe_unpickle
from mnistflow.data.known import KNOWN
from mnistflow.data.formats import detect_format, read_source
from mnistflow.core.errors import MnistflowError

NAMES = list(KNOWN["cifar10"].class_names)


def batch(n, seed, keys=bytes, labels=None):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    labels = rng.integers(0, 10, n).tolist() if labels is None else labels
    k = (lambda s: s.encode()) if keys is bytes else (lambda s: s)
    return {k("batch_label"): k(f"batch {seed}"), k("labels"): labels, k("data"): data,
            k("filenames"): [k(f"img_{i}.png") for i in range(n)]}


def make_tar(path, members: dict[str, bytes]):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def fake_members(sizes=(4, 3, 5), test=6, **kw):
    out = {f"data_batch_{i}": pickle.dumps(batch(n, i, **kw), protocol=2)
           for i, n in enumerate(sizes, 1)}
    if test:
        out["test_batch"] = pickle.dumps(batch(test, 99, **kw), protocol=2)
    out["batches.meta"] = pickle.dumps({b"label_names": [n.encode() for n in NAMES]}, protocol=2)
    return out


def expected(members):
    """(x, y) decoded independently: pixel (r, c) of channel ch is data[ch*1024 + r*32 + c]."""
    xs, ys = [], []
    for name in members:
        d = pickle.loads(members[name])
        d = {k.decode() if isinstance(k, bytes) else k: v for k, v in d.items()}
        if "data" not in d:
            continue
        img = np.zeros((len(d["data"]), 32, 32, 3), np.uint8)
        for ch in range(3):
            for r in range(32):
                img[:, r, :, ch] = d["data"][:, ch * 1024 + r * 32: ch * 1024 + r * 32 + 32]
        xs.append(img)
        ys.append(np.array(d["labels"]))
    return xs, ys


def test_archive_round_trip(tmp_path):
    members = fake_members()
    p = make_tar(tmp_path / "cifar-10-python.tar.gz", members)
    assert detect_format(p) == "cifar"
    raw = read_source(p)
    xs, ys = expected(members)
    np.testing.assert_array_equal(raw.train.x, np.concatenate(xs[:3]))
    np.testing.assert_array_equal(raw.train.y, np.concatenate(ys[:3]))
    np.testing.assert_array_equal(raw.test.x, xs[3])
    np.testing.assert_array_equal(raw.test.y, ys[3])
    assert raw.train.x.shape == (12, 32, 32, 3) and raw.class_names == NAMES
    assert not (tmp_path / "cifar-10-batches-py").exists()  # nothing extracted


def test_extracted_folder_str_keys_and_old_numpy_paths(tmp_path):
    members = fake_members(sizes=(3, 2), test=0, keys=str)
    # Batches pickled by old numpy name numpy.core.multiarray._reconstruct (the real files do).
    members = {k: v.replace(b"numpy._core.multiarray", b"numpy.core.multiarray") for k, v in members.items()}
    assert b"cnumpy.core.multiarray\n_reconstruct" in members["data_batch_1"]
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for k, v in members.items():
        (folder / k).write_bytes(v)
    xs, ys = expected(members)
    for path in (folder, tmp_path):  # the batches folder, or the folder holding it
        assert detect_format(path) == "cifar"
        raw = read_cifar10(path, NAMES, "c")
        np.testing.assert_array_equal(raw.train.x, np.concatenate(xs))
        np.testing.assert_array_equal(raw.train.y, np.concatenate(ys))
        assert raw.test is None


class _Evil:
    def __init__(self, fn, arg):
        self.fn, self.arg = fn, arg

    def __reduce__(self):
        return (self.fn, (self.arg,))


@pytest.mark.parametrize("fn", [os.system, eval, __import__])
def test_malicious_pickle_is_refused(tmp_path, fn):
    marker = tmp_path / "pwned"
    arg = {os.system: f"touch {marker}", eval: f"open({str(marker)!r}, 'w')",
           __import__: "subprocess"}[fn]
    members = fake_members()
    evil = batch(4, 2)
    evil[b"labels"] = _Evil(fn, arg)  # hidden inside an otherwise normal batch
    members["data_batch_2"] = pickle.dumps(evil, protocol=2)
    p = make_tar(tmp_path / "cifar-10-python.tar.gz", members)
    with pytest.raises(MnistflowError) as e:
        read_cifar10(p, NAMES)
    msg = str(e.value)
    assert msg.startswith(f"{p}: cifar-10-batches-py/data_batch_2:"), msg
    assert "refusing to unpickle" in msg
    assert not marker.exists()


def test_safe_unpickle_allows_only_arrays():
    arr = np.arange(12, dtype=np.uint8).reshape(3, 4)
    for proto in (2, 4, 5):
        out = safe_unpickle(pickle.dumps({"a": arr, "b": [1, 2]}, protocol=proto), "x")
        np.testing.assert_array_equal(out["a"], arr)
    with pytest.raises(MnistflowError, match="refusing to unpickle collections.OrderedDict"):
        from collections import OrderedDict

        safe_unpickle(pickle.dumps(OrderedDict(a=1)), "x")


def _err(path, *fragments) -> str:
    with pytest.raises(MnistflowError) as e:
        read_cifar10(path, NAMES)
    msg = str(e.value)
    assert msg.startswith(str(path)), msg
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


def test_errors(tmp_path):
    m = fake_members()
    del m["data_batch_2"]
    _err(make_tar(tmp_path / "gap.tar.gz", m), "data_batch_2")

    m = fake_members()
    m["data_batch_1"] = pickle.dumps(batch(4, 1, labels=[0, 1, 10, 2]), protocol=2)
    _err(make_tar(tmp_path / "label.tar.gz", m), "data_batch_1", "record 2", "10")

    m = fake_members()
    b = batch(4, 1)
    b[b"data"] = b[b"data"][:, :3000]
    m["data_batch_1"] = pickle.dumps(b, protocol=2)
    _err(make_tar(tmp_path / "shape.tar.gz", m), "data_batch_1", "3072")

    m = fake_members()
    m["data_batch_3"] = pickle.dumps(batch(4, 1, labels=[0, 1]), protocol=2)
    _err(make_tar(tmp_path / "count.tar.gz", m), "data_batch_3", "2 labels for 4")

    m = fake_members()
    m["test_batch"] = pickle.dumps(batch(4, 1), protocol=2)[:-40]
    _err(make_tar(tmp_path / "trunc_pickle.tar.gz", m), "test_batch")

    m = fake_members()
    m["data_batch_1"] = pickle.dumps([1, 2, 3], protocol=2)
    _err(make_tar(tmp_path / "list.tar.gz", m), "data_batch_1", "dict")

    good = make_tar(tmp_path / "good.tar.gz", fake_members()).read_bytes()
    (tmp_path / "trunc.tar.gz").write_bytes(good[: len(good) // 2])
    _err(tmp_path / "trunc.tar.gz")

    (tmp_path / "text.tar.gz").write_text("not an archive")
    _err(tmp_path / "text.tar.gz", "archive")

    make_tar(tmp_path / "none.tar.gz", {"readme.txt": b"hi"})
    _err(tmp_path / "none.tar.gz", "data_batch_1")


def test_cli_prep_and_records(tmp_path):
    members = fake_members(sizes=(6, 6))  # the test batch draws from the classes train has:
    train_labels = pickle.loads(members["data_batch_1"])[b"labels"]  # a class only in test is an error
    members["test_batch"] = pickle.dumps(batch(6, 99, labels=train_labels), protocol=2)
    p = make_tar(tmp_path / "cifar-10-python.tar.gz", members)
    out = tmp_path / "rec"
    proc = run_cli("prep", "--data", str(p), "--out", str(out), "--val-size", "5")
    assert proc.returncode == 0, proc.stderr
    r = run_cli("records", str(out))
    assert r.returncode == 0, r.stderr
    assert "32x32x3" in r.stdout and "airplane" in r.stdout


def test_cli_malicious(tmp_path):
    members = fake_members()
    members["test_batch"] = pickle.dumps(_Evil(os.system, f"touch {tmp_path / 'pwned'}"), protocol=2)
    p = make_tar(tmp_path / "evil.tar.gz", members)
    out = tmp_path / "rec"
    proc = run_cli("prep", "--data", str(p), "--out", str(out), "--val-size", "5")
    assert_one_line_error(proc, "evil.tar.gz", "test_batch", "refusing to unpickle")
    assert not (tmp_path / "pwned").exists()
    assert not out.exists() and not list(tmp_path.glob(".rec.tmp-*"))
