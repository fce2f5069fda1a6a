"""Hostile inputs to the raw-format readers (issue 19, HOSTILE-INPUTS.md D1, D3, D4, D9, D14,
D15): each reproduction, in process and small, with the memory it takes measured. Every
one must end as one ``MnistflowError``, in bounded memory, before the declared size is
allocated (tracemalloc sees numpy's and Python's allocations)."""
from __future__ import annotations

import contextlib
import gzip
import io
import os
import pickle
import struct
import tarfile
import tracemalloc
import warnings
import zlib

import numpy as np
import pytest
from helpers.images import bomb_png

from helpers.blocking import deadline
from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError
from mnistflow.data.formats import cifar, csv, idx, npz, tfrecord
from mnistflow.data.formats.folder import decode_image, read_image_folder
from mnistflow.data.picture import read_picture
from mnistflow.data.prepare import prepare
from mnistflow.data.formats.idx import read_idx_folder

MiB = 1 << 20


@contextlib.contextmanager
def peak_memory(limit: int):
    """Fail if the block's traced allocations ever exceed ``limit`` bytes."""
    tracemalloc.start()
    try:
        yield
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < limit, f"peak {peak / MiB:.1f} MiB >= {limit / MiB:.1f} MiB"


def idx_bytes(shape, data: bytes, code: int = 0x08) -> bytes:
    return bytes([0, 0, code, len(shape)]) + b"".join(struct.pack(">I", s) for s in shape) + data


def zeros_gz(nbytes: int, level: int = 9) -> bytes:
    """A gzip of ``nbytes`` zero bytes (64 MiB -> ~65 KB)."""
    co = zlib.compressobj(level, zlib.DEFLATED, 31)
    block = b"\0" * min(nbytes, 16 * MiB)
    out = [co.compress(block) for _ in range(nbytes // len(block))]
    return b"".join(out) + co.flush()


def png(a: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


# --- D1: CIFAR pickles build arrays only from data bytes that match their shape -----------

def cifar_bomb(n: int) -> bytes:
    """The reproduction: ``numpy.ndarray((n, 3072), u1)`` through REDUCE, no data at all."""
    return (b"(S'data'\ncnumpy\nndarray\n((I%d\nI3072\ntcnumpy\ndtype\n(S'u1'\ntRtR" % n
            + b"S'labels'\n](" + b"K\x00" * n + b"ed.")


def test_d1_cifar_pickle_cannot_allocate_an_array_from_a_shape(tmp_path):
    p = cifar_bomb(500_000)  # 1 MB of pickle that used to allocate 1.5 GB
    with peak_memory(16 * MiB), pytest.raises(MnistflowError, match="refusing to unpickle"):
        cifar.safe_unpickle(p, "batch")
    tar = tmp_path / "cifar-bomb.tar.gz"
    with tarfile.open(tar, "w:gz") as t:
        ti = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
        ti.size = len(p)
        t.addfile(ti, io.BytesIO(p))
    assert tar.stat().st_size < 20_000
    with peak_memory(32 * MiB), pytest.raises(MnistflowError, match="refusing to unpickle") as e:
        cifar.read_cifar10(tar, [str(i) for i in range(10)])
    assert str(e.value).startswith(f"{tar}: cifar-10-batches-py/data_batch_1:")


def test_d1_array_data_must_match_its_shape():
    # A real array pickles and unpickles at every protocol (data matches shape)...
    a = np.arange(24, dtype=np.uint8).reshape(2, 12)
    for proto in (2, 4, 5):
        np.testing.assert_array_equal(cifar.safe_unpickle(pickle.dumps(a, protocol=proto), "x"), a)
    # ...but a BUILD whose shape claims more than its data holds is refused before numpy
    # sees it (numpy's own check would come after _reconstruct's allocation path).
    short = pickle.dumps(np.zeros((2, 12), np.uint8), protocol=4)
    bad = short.replace(b"K\x02K\x0c\x86", b"J\x00\x00\x01\x00K\x0c\x86")  # (2, 12) -> (65536, 12)
    assert bad != short
    with pytest.raises(MnistflowError, match=r"shape \(65536, 12\) with 24 bytes"):
        cifar.safe_unpickle(bad, "x")
    # protocol 5's _frombuffer: the buffer must be the shape's size too
    p5 = pickle.dumps(np.zeros((2, 12), np.uint8), protocol=5)
    bad5 = p5.replace(b"K\x02K\x0c\x86", b"K\x03K\x0c\x86")
    assert bad5 != p5
    with pytest.raises(MnistflowError, match="refusing to unpickle"):
        cifar.safe_unpickle(bad5, "x")


def test_d1_batches_are_capped_at_cifar_size(tmp_path):
    names = [str(i) for i in range(10)]
    # A real-sized batch (10,000 images) still reads.
    n = 10_000
    ok = {b"data": np.zeros((n, 3072), np.uint8), b"labels": [i % 10 for i in range(n)]}
    (tmp_path / "data_batch_1").write_bytes(pickle.dumps(ok, protocol=2))
    raw = cifar.read_cifar10(tmp_path, names)
    assert raw.train.x.shape == (n, 32, 32, 3)
    # More images than a batch holds: refused, whether by the count or the opcode budget.
    big = limits.MAX_CIFAR_BATCH_IMAGES + 1
    over = {b"data": np.zeros((big, 3072), np.uint8), b"labels": [0] * big}
    with pytest.raises(MnistflowError, match="images in one batch|opcodes"):
        cifar._batch(pickle.dumps(over, protocol=2), "x", 10)
    # A label list of a million entries (2 bytes each in the pickle) stops at the budget.
    with peak_memory(24 * MiB), pytest.raises(MnistflowError, match="opcodes"):
        cifar.safe_unpickle(pickle.dumps({b"labels": [0] * 1_000_000}, protocol=2), "x")
    # A file bigger than any batch is refused before it is read.
    huge = tmp_path / "big" / "data_batch_1"
    huge.parent.mkdir()
    with open(huge, "wb") as f:
        f.truncate(limits.MAX_CIFAR_BATCH_BYTES + 1)  # sparse: costs no disk
    with peak_memory(4 * MiB), pytest.raises(MnistflowError, match="more than a CIFAR-10 batch"):
        cifar.read_cifar10(huge.parent, names)


# --- D3: IDX labels are bounded before class names are made --------------------------------

def test_d3_one_huge_idx_label_is_an_error_not_billions_of_names(tmp_path):
    x = np.zeros((10, 28, 28), np.uint8)
    y = np.zeros(10, ">i4")
    y[3] = 2**31 - 1
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(x.shape, x.tobytes())))
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(y.shape, y.tobytes(), 0x0C)))
    with peak_memory(8 * MiB), pytest.raises(MnistflowError, match=r"record 3: label 2147483647 is not a class index"):
        read_idx_folder(tmp_path)
    # the cap is the one the other readers use: the largest class index is MAX_CLASSES - 1
    y[3] = limits.MAX_CLASSES
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(y.shape, y.tobytes(), 0x0C)))
    with pytest.raises(MnistflowError, match="not a class index"):
        read_idx_folder(tmp_path)


def test_d3_a_stray_label_is_its_own_class_with_a_warning(tmp_path, capsys):
    x = np.zeros((10, 28, 28), np.uint8)
    y = (np.arange(10) % 3).astype(np.uint8)
    y[0] = 200
    (tmp_path / "train-images-idx3-ubyte").write_bytes(idx_bytes(x.shape, x.tobytes()))
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(y.shape, y.tobytes()))
    raw = read_idx_folder(tmp_path)
    assert raw.num_classes == 4 and raw.label_values == (0, 1, 2, 200)  # no 197 phantom classes
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("mnistflow: warning: "), err
    assert "the labels take 4 values that are not consecutive (0, 1, 2, 200)" in err[0]


# --- D4: gzip is streamed; the header is checked first -------------------------------------

def test_d4_idx_gzip_bomb_fails_on_its_header_without_inflating(tmp_path):
    p = tmp_path / "train-images-idx3-ubyte.gz"
    p.write_bytes(zeros_gz(64 * MiB))
    with peak_memory(2 * MiB), pytest.raises(MnistflowError, match="unknown IDX data type 0x00"):
        idx.read_idx(p)


def test_d4_idx_reads_exactly_the_declared_size(tmp_path):
    x = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    p = tmp_path / "a-idx3-ubyte.gz"
    p.write_bytes(gzip.compress(idx_bytes(x.shape, x.tobytes())))
    got = idx.read_idx(p)
    np.testing.assert_array_equal(got, x)
    assert not got.flags.writeable
    # gzip trailing data: refused, counted without inflating more than a bounded amount
    p.write_bytes(gzip.compress(idx_bytes(x.shape, x.tobytes()) + b"\0" * 5))
    with pytest.raises(MnistflowError, match="5 unexpected trailing bytes"):
        idx.read_idx(p)
    p.write_bytes(gzip.compress(idx_bytes(x.shape, x.tobytes())) + zeros_gz(64 * MiB))
    with peak_memory(24 * MiB), pytest.raises(MnistflowError, match="more than 16,777,216 unexpected trailing"):
        idx.read_idx(p)
    # a raw file is checked against its size before anything is allocated
    raw = tmp_path / "b-idx3-ubyte"
    raw.write_bytes(idx_bytes((60000, 28, 28), b""))
    with peak_memory(MiB), pytest.raises(MnistflowError, match=r"truncated: header says \(60000, 28, 28\)"):
        idx.read_idx(raw)
    # a gzip that declares more than deflate can expand it to
    p.write_bytes(gzip.compress(idx_bytes((1 << 20, 1 << 10, 1 << 10), b"")))
    with peak_memory(MiB), pytest.raises(MnistflowError, match="more than this .*gzip file can hold"):
        idx.read_idx(p)
    # the dataset cap, checked from the header
    p.write_bytes(gzip.compress(idx_bytes(x.shape, x.tobytes())))
    with pytest.raises(MnistflowError, match="more than the 100-byte limit"):
        idx.read_idx(p, max_bytes=100)


def test_d4_tfrecord_gzip_bomb_fails_on_the_first_header(tmp_path):
    p = tmp_path / "bomb.tfrecord.gz"
    p.write_bytes(zeros_gz(64 * MiB))
    with peak_memory(2 * MiB), pytest.raises(MnistflowError, match="record 0: length CRC mismatch"):
        tfrecord.read_tfrecord_dataset(p)


def test_d4_tfrecord_record_length_is_capped_before_reading(tmp_path):
    length = struct.pack("<Q", limits.MAX_TFRECORD_BYTES + 1)
    head = length + struct.pack("<I", tfrecord._mask(tfrecord.crc32c(length)))
    p = tmp_path / "big.tfrecord.gz"
    p.write_bytes(gzip.compress(head + b"\0" * 100))
    with peak_memory(2 * MiB), pytest.raises(MnistflowError, match="record 0: .* bytes declared, more than"):
        tfrecord.read_tfrecord_dataset(p)


def test_d4_csv_gzip_with_one_huge_line_is_refused_at_the_line_cap(tmp_path):
    p = tmp_path / "huge.csv.gz"
    line = b"1," + b"0," * (20 * MiB) + b"0\n"  # 40 MiB on one line -> ~40 KB of gzip
    p.write_bytes(gzip.compress(line, 6))
    # at most the line cap twice (a buffered readline's copy), never the 40 MiB line itself
    with peak_memory(2 * limits.MAX_CSV_LINE_BYTES + 4 * MiB), pytest.raises(MnistflowError, match="line 1 is longer than"):
        csv.read_csv(p)


# --- D9: images are checked before decoding ------------------------------------------------

def test_d9_decompression_bomb_png_is_refused_before_decoding(tmp_path):
    p = tmp_path / "bomb.png"
    p.write_bytes(bomb_png(12000, 12000))  # 144 Mpx, 17 KB
    assert p.stat().st_size < 40_000
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with peak_memory(4 * MiB), pytest.raises(MnistflowError, match="12000x12000 = 144,000,000 pixels, more than the limit"):
            decode_image(p, p)
        with peak_memory(4 * MiB), pytest.raises(MnistflowError, match="more than the limit"):
            read_picture(p)
    assert not seen, [str(w.message) for w in seen]  # no raw DecompressionBombWarning line
    # above Pillow's own hard limit: still one MnistflowError (was a DecompressionBombError)
    p.write_bytes(bomb_png(14000, 14000))  # 196 Mpx: Pillow refuses it at open
    with pytest.raises(MnistflowError, match=str(p)):
        read_picture(p)
    with pytest.raises(MnistflowError, match=f"{p}: refusing to decode"):
        read_picture(p, max_pixels=14000 * 14000)


def test_d9_the_pixel_cap_is_documented_and_adjustable(tmp_path):
    assert limits.MAX_PIXELS == 4096 * 4096
    p = tmp_path / "wide.png"
    p.write_bytes(bomb_png(5000, 4000))  # 20 Mpx: over the default cap
    with pytest.raises(MnistflowError, match="--max-pixels"):
        read_picture(p)
    assert read_picture(p, max_pixels=20_000_000).shape == (4000, 5000)
    with pytest.raises(MnistflowError, match="784 pixels, more than the limit of 100 "):
        decode_image(png(np.zeros((28, 28), np.uint8)), "bytes", max_pixels=100)


def test_d9_folder_and_tfrecord_apply_the_cap(tmp_path):
    for c in "01":
        (tmp_path / "f" / c).mkdir(parents=True)
        (tmp_path / "f" / c / "a.png").write_bytes(png(np.full((8, 8), 7, np.uint8)))
    (tmp_path / "f" / "1" / "b.png").write_bytes(bomb_png(12000, 12000))
    with peak_memory(4 * MiB), pytest.raises(MnistflowError, match=r"b\.png: image is 12000x12000"):
        read_image_folder(tmp_path / "f")
    from helpers.tfrecord_writer import encode_example, frame

    rec = tmp_path / "t.tfrecord"
    rec.write_bytes(frame([encode_example({"image": bomb_png(12000, 12000), "label": 0})]))
    with pytest.raises(MnistflowError, match="record 0: image is 12000x12000"):
        tfrecord.read_tfrecord_dataset(rec)


# --- D14: IDX sizes are Python ints ---------------------------------------------------------

def test_d14_idx_header_whose_size_wraps_int64_is_a_clean_error(tmp_path):
    head = idx_bytes((65536,) * 4, b"")
    with pytest.raises(MnistflowError, match=r"truncated: header says \(65536, 65536, 65536, 65536\) "
                                             r"\(18446744073709551616 bytes"):
        idx.parse_idx(head, "mem")
    p = tmp_path / "train-images-idx3-ubyte.gz"
    p.write_bytes(gzip.compress(head))
    with peak_memory(MiB), pytest.raises(MnistflowError, match="more than this .*gzip file can hold"):
        idx.read_idx(p)
    raw = tmp_path / "w-idx3-ubyte"
    raw.write_bytes(head + b"\0" * 9)  # int64 wrap used to report '... unexpected trailing bytes'
    with pytest.raises(MnistflowError, match="truncated"):
        idx.read_idx(raw)


# --- D15: FIFOs and other non-regular files are refused, never read ------------------------

@pytest.fixture
def fifo(tmp_path):
    def make(name: str):
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(p)
        return p
    return make


def test_d15_fifos_are_refused_not_read(tmp_path, fifo):
    cases = [
        (lambda p: idx.read_idx(p), fifo("train-images-idx3-ubyte.gz")),
        (lambda p: read_picture(p), fifo("pipe.png")),
        (lambda p: decode_image(p, p), fifo("pipe2.png")),
        (lambda p: csv.read_csv(p), fifo("pipe.csv")),
        (lambda p: npz.read_npz(p), fifo("pipe.npz")),
        (lambda p: tfrecord.read_tfrecord_dataset(p), fifo("pipe.tfrecord")),
        (lambda p: cifar.read_cifar10(p.parent, [str(i) for i in range(10)]), fifo("cifar/data_batch_1")),
        (lambda p: prepare(data=p, out=tmp_path / "o1", quiet=True), fifo("in/x.csv")),
    ]
    for read, p in cases:
        with deadline(5), pytest.raises(MnistflowError, match="not a regular file") as e:
            read(p)
        assert str(p) in str(e.value)


def test_d15_a_fifo_in_an_image_folder_is_refused(tmp_path, fifo):
    for c in "01":
        (tmp_path / "ff" / c).mkdir(parents=True)
        (tmp_path / "ff" / c / "a.png").write_bytes(png(np.full((8, 8), 7, np.uint8)))
    pipe = fifo("ff/1/pipe.png")
    with deadline(5), pytest.raises(MnistflowError, match="not a regular file") as e:
        prepare(data=tmp_path / "ff", out=tmp_path / "ffo", val_size=1, quiet=True)
    assert str(pipe) in str(e.value)
    assert not (tmp_path / "ffo").exists()


def test_d4_a_raw_tfrecord_that_starts_like_gzip_is_still_read(tmp_path):
    """Streaming picks gzip from the magic bytes; a raw file whose first record length starts
    with 1f 8b 08 (a 559,903-byte record) has a valid length CRC and is read as it is."""
    from helpers.tfrecord_writer import encode_example, frame

    n = 0x088B1F
    pad = n
    while len(ex := encode_example({"image": bytes(784), "label": 1, "pad": bytes(pad)})) > n:
        pad -= len(ex) - n  # the varint lengths shrink with the padding: converge on n
    assert len(ex) == n
    p = tmp_path / "x.tfrecord"
    p.write_bytes(frame([ex]))
    assert p.read_bytes()[:3] == b"\x1f\x8b\x08"
    assert tfrecord.read_tfrecord_dataset(p).train.x.shape == (1, 28, 28, 1)


# --- sweep 2, D4: IDX images of no pixels are refused where IDX images are read ---------------

def _idx_folder(root, image_shape, n_test=20):
    """An MNIST-named IDX folder whose train images have ``image_shape`` (N first)."""
    root.mkdir()
    for split, shape in (("train", image_shape), ("t10k", (n_test, *image_shape[1:]))):
        (root / f"{split}-images-idx3-ubyte").write_bytes(idx_bytes(shape, bytes(int(np.prod(shape)))))
        (root / f"{split}-labels-idx1-ubyte").write_bytes(
            idx_bytes((shape[0],), bytes(i % 10 for i in range(shape[0]))))
    return root


@pytest.mark.parametrize("shape", [(100, 0, 28), (100, 28, 0), (100, 0, 0), (100, 0, 28, 1), (100, 28, 28, 0)])
def test_s2_d4_prep_refuses_idx_images_with_a_side_of_size_0(tmp_path, shape):
    """Were prepared (rc 0) into records every reader refuses, with advice ('prep --force')
    that rebuilt the same records."""
    raw = _idx_folder(tmp_path / "raw", shape)
    with pytest.raises(MnistflowError) as e:
        prepare(data=raw, out=tmp_path / "recs", quiet=True)
    assert str(e.value) == (f"{raw / 'train-images-idx3-ubyte'}: IDX images of shape {shape}: "
                            "a side of size 0, so the images hold no pixels")
    assert not (tmp_path / "recs").exists()


def test_s2_d4_idx_images_of_zero_count_stay_an_error(tmp_path):
    raw = _idx_folder(tmp_path / "raw", (0, 28, 28))
    with pytest.raises(MnistflowError, match=r"train-images-idx3-ubyte: holds no images \(shape \(0, 28, 28\)\)"):
        prepare(data=raw, out=tmp_path / "recs", quiet=True)
    assert not (tmp_path / "recs").exists()
    with pytest.raises(MnistflowError, match=r"expected an IDX image file \(N, H, W\), got shape \(2, 3, 3, 1\)"):
        p = tmp_path / "four.idx"
        p.write_bytes(idx_bytes((2, 3, 3, 1), bytes(18)))
        idx.read_idx_images(p, ranks=(3,))


# --- sweep 2, D8: one pixel rule (raw.as_pixels), one error line, no numpy warning -------------

@pytest.mark.parametrize("x,message", [
    (np.full((50, 28, 28), np.nan), r"x_train \(float64\) holds NaN or infinite values, not pixels 0\.\.255$"),
    (np.full((50, 28, 28), -np.inf, np.float32), r"x_train \(float32\) holds NaN or infinite values"),
    (np.where(np.arange(50 * 784).reshape(50, 28, 28) % 7, np.nan, 3.0), "holds NaN or infinite values"),
    (np.full((50, 28, 28), 0.5), r"holds non-integer values, not pixels 0\.\.255 \(0\.\.1 floats\? multiply by 255\)$"),
    (np.full((50, 28, 28), 300.5), r"holds non-integer values, not pixels 0\.\.255$"),
    (np.full((50, 28, 28), 256, np.int16), r"x_train \(int16\) holds values 256\.\.256, outside 0\.\.255$"),
])
def test_s2_d8_npz_pixels_that_are_not_pixels_are_one_error_without_a_numpy_warning(tmp_path, x, message):
    """An all-NaN x_train printed numpy's 'All-NaN slice encountered' (2 raw lines) first."""
    p = tmp_path / "bad.npz"
    np.savez(p, x_train=x, y_train=np.arange(50) % 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a raw RuntimeWarning fails the test
        with pytest.raises(MnistflowError, match=message) as e:
            npz.read_npz(p)
    assert str(e.value).startswith(f"{p}: x_train")


def test_s2_d8_the_pixel_rule_checks_every_chunk(monkeypatch):
    """``as_pixels`` checks a few MB at a time: a bad value in a later chunk is still found,
    the range is the whole array's, and integral values of any dtype come out as uint8."""
    from mnistflow.data.formats import raw

    monkeypatch.setattr(raw, "_PIXEL_CHUNK", 10)
    x = np.arange(100, dtype=np.float64)
    np.testing.assert_array_equal(raw.as_pixels(x, "f", "px"), np.arange(100, dtype=np.uint8))
    x[95] = np.nan
    with pytest.raises(MnistflowError, match="f: px .* NaN or infinite"):
        raw.as_pixels(x, "f", "px")
    x[95] = 95.25
    with pytest.raises(MnistflowError, match="non-integer"):
        raw.as_pixels(x, "f", "px")
    y = np.arange(-1, 299, dtype=np.int32)
    with pytest.raises(MnistflowError, match=r"holds values -1\.\.298, outside 0\.\.255"):
        raw.as_pixels(y, "f", "px")
    assert raw.as_pixels(np.array([True, False]), "f", "px").dtype == np.uint8
    with pytest.raises(MnistflowError, match="has dtype complex128; expected uint8 pixels"):
        raw.as_pixels(np.zeros(3, complex), "f", "px")
    u = np.zeros(3, np.uint8)
    assert raw.as_pixels(u, "f", "px") is u


def test_s2_d8_a_float_idx_image_file_follows_the_same_rule(tmp_path):
    """prep reads IDX images through ``idx.read_idx_images`` (as predict does): integral floats
    0..255 are pixels, NaN and 0..1 floats are one error."""
    x = np.arange(3 * 28 * 28).reshape(3, 28, 28) % 256
    p = tmp_path / "f-idx3"
    p.write_bytes(idx_bytes(x.shape, x.astype(">f4").tobytes(), code=0x0D))
    np.testing.assert_array_equal(idx.read_idx_images(p), x.astype(np.uint8))
    for bad, message in ((np.where(x > 9, x, np.nan), "NaN or infinite"), (x / 255.0, "multiply by 255")):
        p.write_bytes(idx_bytes(x.shape, bad.astype(">f4").tobytes(), code=0x0D))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(MnistflowError, match=f"{p}: image data \\(float32\\) holds .*{message}"):
                idx.read_idx_images(p)


def test_prep_resize_box_reduces_a_huge_picture_first(tmp_path, monkeypatch):
    """An image folder's --resize takes the shrink step predict and the server take: a 15 KB
    PNG of 16,000,000x1 pixels resized straight to 28x28 built ~260 MB of filter tables."""
    from PIL import Image

    from mnistflow.data.formats import folder

    Image.new("L", (4000, 3), 200).save(tmp_path / "wide.png")
    sides = []
    real = folder.shrink
    monkeypatch.setattr(folder, "shrink", lambda im, side: sides.append((im.size, side)) or real(im, side))
    a = folder.decode_image(tmp_path / "wide.png", "wide.png", (28, 28))
    assert a.shape == (28, 28, 1) and sides == [((4000, 3), 1024)]
    assert real(Image.new("L", (4000, 3)), 1024).size == (1000, 1)
    folder.decode_image(tmp_path / "wide.png", "wide.png", (2048, 2048))  # a larger target keeps its detail
    assert sides[-1] == ((4000, 3), 2048)
