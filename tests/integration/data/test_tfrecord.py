"""TFRecord without TensorFlow: CRC32C, framing and tf.train.Example checked against independent
implementations (tensorboard's record reader/writer, the protobuf runtime), round trips, errors."""
from __future__ import annotations

import gzip
import os
import struct

import numpy as np
import pytest

from helpers.cli import assert_one_line_error, run_cli
from helpers import tfrecord_writer as W
from mnistflow.data.formats import tfrecord as T
from mnistflow.data.formats.idx import read_idx_pair
from mnistflow.data.formats import detect_format, read_source
from mnistflow.core.errors import MnistflowError


def digits(mnist_dir, n=50):
    x, y = read_idx_pair(mnist_dir / "t10k-images-idx3-ubyte.gz", mnist_dir / "t10k-labels-idx1-ubyte.gz")
    return np.array(x[:n]), np.array(y[:n])


# --- CRC32C ------------------------------------------------------------------------------

def test_crc32c_known_vectors():
    assert T.crc32c(b"123456789") == 0xE3069283  # the CRC catalogue's check value
    assert T.crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4
    assert T.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert T.crc32c(bytes(range(32))) == 0x46DD794E
    assert T.crc32c(b"") == 0


def test_crc32c_many_matches_single_and_tensorboard():
    rng = np.random.default_rng(0)
    sizes = [0, 1, 3, 7, 8, 9] + rng.integers(0, 3000, 200).tolist() + [70_000]
    bufs = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    many = T.crc32c_many(bufs)
    assert many.tolist() == [T._crc32c_py(b) for b in bufs]
    pw = pytest.importorskip("tensorboard.compat.tensorflow_stub.pywrap_tensorflow")
    for b in bufs[:40]:
        assert T._mask(T.crc32c(b)) == pw.masked_crc32c(b)


# --- framing against tensorboard's reader and writer ---------------------------------------

def test_framing_interoperates_with_tensorboard(tmp_path):
    pw = pytest.importorskip("tensorboard.compat.tensorflow_stub.pywrap_tensorflow")
    from tensorboard.summary.writer.record_writer import RecordWriter

    records = [os.urandom(n) for n in (0, 1, 100, 5000)]
    ours = tmp_path / "ours.tfrecord"
    ours.write_bytes(W.frame(records))
    reader = pw.PyRecordReader_New(str(ours))
    got = []
    while True:
        try:
            reader.GetNext()
        except Exception:
            break
        got.append(reader.record())
    assert got == records

    theirs = tmp_path / "theirs.tfrecord"
    with open(theirs, "wb") as f:
        w = RecordWriter(f)
        for r in records:
            w.write(r)
    assert [bytes(m) for m in T.read_frames(theirs.read_bytes(), theirs)] == records


# --- tf.train.Example against the protobuf runtime -----------------------------------------

def _example_class(syntax: str, packed: bool):
    pytest.importorskip("google.protobuf")
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name=f"mf_{syntax}_{packed}.proto", package="mf",
                                             syntax=syntax)

    def msg(name, scalar=None):
        m = fdp.message_type.add(name=name)
        if scalar is not None:
            f = m.field.add(name="value", number=1, type=scalar, label=F.LABEL_REPEATED)
            if scalar != F.TYPE_BYTES:
                f.options.packed = packed
        return m

    msg("BytesList", F.TYPE_BYTES)
    msg("FloatList", F.TYPE_FLOAT)
    msg("Int64List", F.TYPE_INT64)
    feat = msg("Feature")
    feat.oneof_decl.add(name="kind")
    for i, n in enumerate(("bytes_list", "float_list", "int64_list"), 1):
        tn = ".mf." + {1: "BytesList", 2: "FloatList", 3: "Int64List"}[i]
        feat.field.add(name=n, number=i, type=F.TYPE_MESSAGE, type_name=tn,
                       label=F.LABEL_OPTIONAL, oneof_index=0)
    feats = msg("Features")
    entry = feats.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, type_name=".mf.Feature",
                    label=F.LABEL_OPTIONAL)
    feats.field.add(name="feature", number=1, type=F.TYPE_MESSAGE,
                    type_name=".mf.Features.FeatureEntry", label=F.LABEL_REPEATED)
    ex = msg("Example")
    ex.field.add(name="features", number=1, type=F.TYPE_MESSAGE, type_name=".mf.Features",
                 label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("mf.Example"))


@pytest.mark.parametrize("syntax,packed", [("proto3", True), ("proto2", False), ("proto2", True)])
def test_example_decoding_matches_protobuf(syntax, packed):
    Example = _example_class(syntax, packed)
    ex = Example()
    f = ex.features.feature
    f["image"].bytes_list.value.append(b"\x00\x01\xff" * 50)
    f["label"].int64_list.value.extend([7])
    f["many"].int64_list.value.extend([0, 1, 127, 128, 300, 2**40, -1, -(2**63), 2**63 - 1])
    f["floats"].float_list.value.extend([0.5, -2.25, 1e30])
    f["names"].bytes_list.value.extend([b"a", b"", "\u00e9".encode()])
    f["empty"].SetInParent()
    f["ñame"].int64_list.value.append(3)
    got = T.parse_example(ex.SerializeToString())
    assert got["image"] == ("bytes", [b"\x00\x01\xff" * 50])
    assert got["label"] == ("int64", [7])
    assert got["many"] == ("int64", [0, 1, 127, 128, 300, 2**40, -1, -(2**63), 2**63 - 1])
    assert got["floats"] == ("float", [0.5, -2.25, np.float32(1e30).item()])
    assert got["names"] == ("bytes", [b"a", b"", "\u00e9".encode()])
    assert got["empty"] == (None, [])
    assert got["ñame"] == ("int64", [3])


def test_example_encoding_parses_with_protobuf():
    Example = _example_class("proto3", True)
    data = W.encode_example({"image": b"\x89PNG...", "label": 3, "vals": [1, -5, 2**50],
                             "f": [0.25, 3.0], "raw": np.arange(5)})
    ex = Example.FromString(data)
    f = ex.features.feature
    assert f["image"].bytes_list.value == [b"\x89PNG..."]
    assert list(f["label"].int64_list.value) == [3]
    assert list(f["vals"].int64_list.value) == [1, -5, 2**50]
    assert list(f["f"].float_list.value) == [0.25, 3.0]
    assert list(f["raw"].int64_list.value) == [0, 1, 2, 3, 4]


# --- round trips ---------------------------------------------------------------------------

@pytest.mark.parametrize("encode,suffix", [("png", ".tfrecord"), ("raw", ".tfrecord"),
                                           ("png", ".tfrecord.gz"), ("raw", ".tfrecords")])
def test_round_trip(tmp_path, mnist_dir, encode, suffix):
    x, y = digits(mnist_dir)
    p = W.write_tfrecord(tmp_path / f"digits{suffix}", x, y, encode=encode)
    assert detect_format(p) == "tfrecord"
    raw = read_source(p)
    np.testing.assert_array_equal(raw.train.x, x)
    np.testing.assert_array_equal(np.asarray(raw.values)[raw.train.y], y)
    assert raw.train.x.dtype == np.uint8 and raw.train.y.dtype == np.int64
    assert raw.class_names == [str(v) for v in np.unique(y)]
    if suffix.endswith(".gz"):
        assert p.read_bytes()[:2] == b"\x1f\x8b"


def test_gzip_without_gz_suffix_and_rgb(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (5, 6, 7, 3), dtype=np.uint8)
    y = np.array([0, 1, 2, 1, 0])
    p = W.write_tfrecord(tmp_path / "c.tfrecord.gz", x, y)
    plain = tmp_path / "c2.tfrecord"  # TF's GZIP option, file named without .gz
    plain.write_bytes(p.read_bytes())
    raw = T.read_tfrecord_dataset(plain)
    np.testing.assert_array_equal(raw.train.x, x)


def test_folder_with_test_split_and_keys(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 40)
    W.write_tfrecord(tmp_path / "train-00000-of-00002.tfrecord", x[:15], y[:15], "img", "cls")
    W.write_tfrecord(tmp_path / "train-00001-of-00002.tfrecord", x[15:30], y[15:30], "img", "cls",
                     encode="raw")
    W.write_tfrecord(tmp_path / "test.tfrecord", x[30:], y[30:], "img", "cls")
    assert detect_format(tmp_path) == "tfrecord"
    raw = T.read_tfrecord_dataset(tmp_path, image_key="img", label_key="cls")
    np.testing.assert_array_equal(raw.train.x, x[:30])
    np.testing.assert_array_equal(np.asarray(raw.values)[raw.train.y], y[:30])
    np.testing.assert_array_equal(raw.test.x, x[30:])
    np.testing.assert_array_equal(np.asarray(raw.values)[raw.test.y], y[30:])
    with pytest.raises(MnistflowError, match="no feature 'image'.*img"):
        T.read_tfrecord_dataset(tmp_path)


def test_pixel_list_and_inferred_shape(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 3)
    recs = [W.encode_example({"image": img.ravel().tolist(), "label": int(lab)})
            for img, lab in zip(x, y)]
    recs.append(W.encode_example({"image": x[0].tobytes(), "label": 1}))  # raw, no height/width
    p = tmp_path / "list.tfrecord"
    p.write_bytes(W.frame(recs))
    raw = T.read_tfrecord_dataset(p)
    np.testing.assert_array_equal(raw.train.x, np.concatenate([x, x[:1]]))


def test_resize(tmp_path):
    a = np.zeros((2, 10, 10, 1), np.uint8)
    b = np.full((2, 12, 8, 1), 200, np.uint8)
    p1 = W.write_tfrecord(tmp_path / "a.tfrecord", a, [0, 1])
    (tmp_path / "b.tfrecord").write_bytes(p1.read_bytes() + W.write_tfrecord(tmp_path / "x.tfr", b, [1, 0]).read_bytes())
    with pytest.raises(MnistflowError) as e:
        T.read_tfrecord_dataset(tmp_path / "b.tfrecord")
    assert "record 2" in str(e.value) and "12x8" in str(e.value) and "10x10" in str(e.value)
    raw = T.read_tfrecord_dataset(tmp_path / "b.tfrecord", resize=(9, 9))
    assert raw.train.x.shape == (4, 9, 9, 1) and raw.train.x[2:].min() == 200


# --- errors --------------------------------------------------------------------------------

def _err(path, *fragments, **kw) -> str:
    with pytest.raises(MnistflowError) as e:
        T.read_tfrecord_dataset(path, **kw)
    msg = str(e.value)
    assert msg.startswith(str(path)), msg
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


def _offsets(data: bytes) -> list[int]:
    pos, out = 0, []
    while pos < len(data):
        out.append(pos)
        pos += 16 + struct.unpack_from("<Q", data, pos)[0]
    return out


def test_corruption_names_file_and_record(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 6)
    good = W.write_tfrecord(tmp_path / "good.tfrecord", x, y).read_bytes()
    offs = _offsets(good)

    data = bytearray(good)
    data[offs[3] + 12 + 20] ^= 0x04
    (tmp_path / "data_crc.tfrecord").write_bytes(data)
    _err(tmp_path / "data_crc.tfrecord", "record 3", "CRC")

    data = bytearray(good)
    data[offs[2] + 9] ^= 0x01  # the length CRC itself
    (tmp_path / "len_crc.tfrecord").write_bytes(data)
    _err(tmp_path / "len_crc.tfrecord", "record 2", "CRC")

    data = bytearray(good)
    data[offs[4]] ^= 0x10  # the length
    (tmp_path / "len.tfrecord").write_bytes(data)
    _err(tmp_path / "len.tfrecord", "record 4")

    (tmp_path / "trunc.tfrecord").write_bytes(good[:offs[5] + 30])
    _err(tmp_path / "trunc.tfrecord", "record 5", "truncated")

    (tmp_path / "trunc.tfrecord.gz").write_bytes(gzip.compress(good)[:-30])
    _err(tmp_path / "trunc.tfrecord.gz", "gzip")

    (tmp_path / "empty.tfrecord").write_bytes(b"")
    _err(tmp_path / "empty.tfrecord", "no records")

    (tmp_path / "text.tfrecord").write_text("this is not a tfrecord file at all")
    _err(tmp_path / "text.tfrecord", "record 0")


def test_bad_examples(tmp_path):
    def one(name, feats):
        p = tmp_path / name
        p.write_bytes(W.frame([W.encode_example({"image": bytes(16), "label": 1}),
                               W.encode_example(feats)]))
        return p

    _err(one("nolabel.tfrecord", {"image": bytes(16)}), "record 1", "'label'")
    _err(one("noimage.tfrecord", {"pic": bytes(16), "label": 0}), "record 1", "'image'", "pic")
    _err(one("twolabels.tfrecord", {"image": bytes(16), "label": [1, 2]}), "record 1", "label")
    _err(one("neglabel.tfrecord", {"image": bytes(16), "label": -4}), "record 1", "-4")
    _err(one("shape.tfrecord", {"image": bytes(15), "label": 0}), "record 1", "15")
    _err(one("hw.tfrecord", {"image": bytes(16), "label": 0, "height": 3, "width": 4}), "record 1")
    _err(one("png.tfrecord", {"image": b"\x89PNG\r\n\x1a\nbroken", "label": 0}), "record 1", "image")
    _err(one("pixels.tfrecord", {"image": [0.5] * 16, "label": 0}), "record 1", "0..255")
    p = tmp_path / "proto.tfrecord"
    p.write_bytes(W.frame([b"\x0a\x05\x0a\x03\x0a"]))  # truncated nested message
    _err(p, "record 0", "tf.train.Example")


# --- CLI -----------------------------------------------------------------------------------

def test_cli_prep_and_records(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 30)
    d = tmp_path / "tfr"
    d.mkdir()
    W.write_tfrecord(d / "train.tfrecord", x[:20], y[:20], "image/encoded", "image/class/label")
    W.write_tfrecord(d / "test.tfrecord.gz", x[20:], y[20:], "image/encoded", "image/class/label")
    out = tmp_path / "rec"
    p = run_cli("prep", "--data", str(d), "--out", str(out), "--val-size", "5",
                "--image-key", "image/encoded", "--label-key", "image/class/label")
    assert p.returncode == 0, p.stderr
    r = run_cli("records", str(out))
    assert r.returncode == 0, r.stderr
    assert "28x28x1" in r.stdout and "test      10" in r.stdout


def test_cli_corrupt_record(tmp_path, mnist_dir):
    x, y = digits(mnist_dir, 10)
    p = W.write_tfrecord(tmp_path / "bad.tfrecord", x, y)
    data = bytearray(p.read_bytes())
    data[_offsets(bytes(data))[7] + 40] ^= 0xFF
    p.write_bytes(data)
    out = tmp_path / "rec"
    proc = run_cli("prep", "--data", str(p), "--out", str(out), "--val-size", "5")
    assert_one_line_error(proc, "bad.tfrecord", "record 7")
    assert not out.exists() and not list(tmp_path.glob(".rec.tmp-*"))
