"""TFRecord files of ``tf.train.Example``, read without TensorFlow.

Framing of each record: uint64 length, uint32 masked CRC32C of the length, the data,
uint32 masked CRC32C of the data (all little-endian). Both CRCs are checked. A file may
be gzip-compressed (``.gz`` or gzip magic bytes). The data is a protobuf ``Example``:
``Features features = 1`` -> ``map<string, Feature> feature = 1`` -> one of
``BytesList bytes_list = 1``, ``FloatList float_list = 2``, ``Int64List int64_list = 3``
(packed or not), decoded by protobuf (installed with TensorBoard) from a descriptor built here:
TensorBoard's protos lack ``Example``, and TensorFlow would be a large install for it. (The tests' writer,
the inverse of this reader, lives in ``tests/helpers/tfrecord_writer.py``.)

Images: the ``image_key`` feature holds encoded PNG/JPEG bytes, or raw uint8 pixels whose
shape comes from ``height``/``width``/``depth`` int64 features (else a square grey image, or
3 x a square for RGB channel-last), or pixel values as an int64/float list. Labels: the
``label_key`` int64 feature (one value; the classes are the values training uses, see
``raw.from_original_labels``). A folder of ``*.tfrecord*`` files reads as one
dataset; files whose names contain "test" are the test split.
"""
from __future__ import annotations

import functools
import io
import os
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError, fail
from mnistflow.data.formats.folder import check_size, decode_image, stack_images
from mnistflow.data.formats.idx import open_input
from mnistflow.data.formats.raw import (
    RawDataset,
    RawSplit,
    as_pixels,
    check_dataset_bytes,
    dataset_from_labels,
)

# --- CRC32C (Castagnoli) -------------------------------------------------------------------

_POLY = 0x82F63B78  # reflected 0x1EDC6F41


def _make_table() -> np.ndarray:
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(_POLY), t >> 1).astype(np.uint32)
    return t


_TABLE = _make_table()
_TABLE_L = _TABLE.tolist()


def _crc32c_py(data: bytes) -> int:
    crc, t = 0xFFFFFFFF, _TABLE_L
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _find_accelerator():
    """An optional C implementation (google-crc32c or crc32c from PyPI), if installed and right."""
    cands = []
    try:
        import google_crc32c

        cands.append(lambda d: int(google_crc32c.value(bytes(d))))
    except Exception:
        pass
    try:
        import crc32c as _c

        cands.append(lambda d: int(_c.crc32c(bytes(d))))
    except Exception:
        pass
    for fn in cands:
        try:
            if fn(b"123456789") == 0xE3069283:
                return fn
        except Exception:
            pass
    return None


_FAST = _find_accelerator()


def crc32c(data: bytes) -> int:
    """CRC32C of ``data`` (0xE3069283 for b"123456789")."""
    return _FAST(data) if _FAST else _crc32c_py(data)


def crc32c_many(bufs: list) -> np.ndarray:
    """CRC32C of many buffers at once: numpy runs the table loop across records in lockstep
    (records sorted by length, right-aligned, so that leading padding leaves a CRC as it is)."""
    n = len(bufs)
    out = np.zeros(n, np.uint32)
    if _FAST:
        out[:] = [_FAST(b) for b in bufs]
        return out
    lens = np.fromiter((len(b) for b in bufs), np.int64, n)
    order = np.argsort(lens, kind="stable")
    i = 0
    while i < n:
        j, budget = i + 1, 1 << 24
        while j < n and (j - i + 1) * lens[order[j]] <= budget:
            j += 1
        idx = order[i:j]
        if len(idx) < 8:  # too few to vectorise: plain loop
            for k in idx:
                out[k] = _crc32c_py(bufs[k])
        else:
            width = int(lens[idx[-1]])
            m = np.zeros((len(idx), width), np.uint8)
            for r, k in enumerate(idx):
                if lens[k]:
                    m[r, width - lens[k]:] = np.frombuffer(bufs[k], np.uint8)
            start = width - lens[idx]
            crc = np.full(len(idx), 0xFFFFFFFF, np.uint32)
            same = bool((start == 0).all())
            for p in range(width):
                nxt = _TABLE[(crc ^ m[:, p]) & 0xFF] ^ (crc >> 8)
                crc = nxt if same else np.where(start <= p, nxt, crc)
            out[idx] = crc ^ np.uint32(0xFFFFFFFF)
        i = j
    return out


def _mask(crc):
    """TFRecord's masked CRC: rotate right by 15, add a constant (works on ints and arrays)."""
    if isinstance(crc, np.ndarray):
        c = crc.astype(np.uint64)
        return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# --- framing -------------------------------------------------------------------------------

def read_frames(data: bytes, path: str | os.PathLike) -> list[memoryview]:
    """The records of TFRecord bytes, both CRCs checked; errors name the record index."""
    return [memoryview(b) for b in _frames(io.BytesIO(data), len(data), path)]


def _frames(f: BinaryIO, size: int | None, path: str | os.PathLike) -> list[bytes]:
    """The records read one by one from a stream (``size``: the stream's length when known,
    None for decompressed data). Each length is checked (its CRC, ``limits.MAX_TFRECORD_BYTES``, what
    is left) before the record is read; the data CRCs are checked together at the end."""
    frames: list[bytes] = []
    crcs: list[int] = []
    pos = 0
    while True:
        i = len(frames)
        head = f.read(12)
        if not head:
            break
        if len(head) < 12:
            fail(path, f"record {i}: truncated header ({len(head)} bytes left, need 12)")
        length, lcrc = struct.unpack("<QI", head)
        if _mask(crc32c(head[:8])) != lcrc:
            fail(path, f"record {i}: length CRC mismatch at byte {pos} (corrupt or not a TFRecord file)")
        left = None if size is None else size - pos - 12
        if left is not None and length + 4 > left:
            fail(path, f"record {i}: truncated ({length} bytes of data declared, "
                       f"{max(left, 0)} bytes left)")
        if length > limits.MAX_TFRECORD_BYTES:
            fail(path, f"record {i}: {length:,} bytes declared, more than the "
                       f"{limits.MAX_TFRECORD_BYTES:,}-byte limit for one record")
        body = f.read(length + 4)
        if len(body) < length + 4:
            fail(path, f"record {i}: truncated ({length} bytes of data declared, "
                       f"{max(len(body), 0)} bytes left)")
        frames.append(body[:length])
        crcs.append(struct.unpack_from("<I", body, length)[0])
        pos += 16 + length
    got = _mask(crc32c_many(frames))
    bad = np.flatnonzero(got != np.asarray(crcs, np.uint64))
    if len(bad):
        fail(path, f"record {int(bad[0])}: data CRC mismatch (corrupt file)")
    return frames


def _file_frames(path: Path) -> list[bytes]:
    """The records of one TFRecord file, gzipped (``.gz`` or gzip magic bytes) or not,
    streamed: the file is never inflated whole."""
    gz = None
    if not path.name.lower().endswith(".gz"):
        with open_input(path, gz=False) as (f, _, _):
            head = f.read(12)
        if len(head) == 12 and _mask(crc32c(head[:8])) == struct.unpack_from("<I", head, 8)[0]:
            gz = False  # a valid first record whose length happens to start with gzip's magic
    with open_input(path, gz) as (f, size, gz):
        return _frames(f, None if gz else size, path)


# --- tf.train.Example, by protobuf ---------------------------------------------------------

_KINDS = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}


@functools.cache
def _example_class() -> type:
    """``tf.train.Example`` as a protobuf message class, built from its descriptor here (in a
    pool of its own, so a TensorFlow in the same process never clashes with it)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="mnistflow_example.proto", package="mf", syntax="proto3")

    def message(name: str, scalar: int | None = None) -> descriptor_pb2.DescriptorProto:
        m = fdp.message_type.add(name=name)
        if scalar is not None:  # (the parser takes packed and unpacked values alike)
            m.field.add(name="value", number=1, type=scalar, label=F.LABEL_REPEATED)
        return m

    message("BytesList", F.TYPE_BYTES)
    message("FloatList", F.TYPE_FLOAT)
    message("Int64List", F.TYPE_INT64)
    feature = message("Feature")
    feature.oneof_decl.add(name="kind")
    for number, (field, kind) in enumerate(zip(_KINDS, ("BytesList", "FloatList", "Int64List")), 1):
        feature.field.add(name=field, number=number, type=F.TYPE_MESSAGE, type_name=f".mf.{kind}",
                          label=F.LABEL_OPTIONAL, oneof_index=0)
    features = message("Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, type_name=".mf.Feature", label=F.LABEL_OPTIONAL)
    features.field.add(name="feature", number=1, type=F.TYPE_MESSAGE, type_name=".mf.Features.FeatureEntry",
                       label=F.LABEL_REPEATED)
    message("Example").field.add(name="features", number=1, type=F.TYPE_MESSAGE, type_name=".mf.Features",
                                 label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("mf.Example"))


def parse_example(data: bytes, where: str | os.PathLike = "<bytes>") -> dict[str, tuple[str | None, list]]:
    """Decode a serialized ``tf.train.Example`` to {name: (kind, values)}, kind one of
    "bytes", "float", "int64" (None for an empty feature). Errors name ``where``."""
    from google.protobuf.message import DecodeError

    try:
        example = _example_class().FromString(bytes(data))
    except DecodeError as e:
        fail(where, f"not a tf.train.Example ({e})")
    feats: dict[str, tuple[str | None, list]] = {}
    for key, feature in example.features.feature.items():
        field = feature.WhichOneof("kind")
        feats[key] = (_KINDS[field], list(getattr(feature, field).value)) if field else (None, [])
    return feats


# --- Examples -> images --------------------------------------------------------------------

_MAGIC = (b"\x89PNG", b"\xff\xd8", b"GIF8", b"BM")


def _one_int(feats: dict, key: str, where: str) -> int | None:
    kind, vals = feats.get(key, (None, []))
    if kind is None and not vals:
        return None
    if kind != "int64" or len(vals) != 1:
        fail(where, f"feature '{key}' should be one int64, got {kind} x{len(vals)}")
    return vals[0]


def _raw_shape(feats: dict, n: int, where: str) -> tuple[int, int, int]:
    h, w = _one_int(feats, "height", where), _one_int(feats, "width", where)
    d = _one_int(feats, "depth", where) or _one_int(feats, "channels", where)
    if h is not None and w is not None:
        if h <= 0 or w <= 0 or (d is not None and d not in (1, 3)):
            fail(where, f"bad image shape height={h} width={w} depth={d}")
        d = d or (n // (h * w) if n % (h * w) == 0 else 0)
        if h * w * d != n or d not in (1, 3):
            fail(where, f"{n} pixel values do not fit height={h} width={w} depth={d}")
        return h, w, d
    for d in (1, 3):
        s = int(round(np.sqrt(n / d)))
        if s > 0 and s * s * d == n:
            return s, s, d
    fail(where, f"{n} raw pixel values and no height/width features: cannot tell the image shape")


def _fits_raw(feats: dict, n: int) -> bool:
    """True when height/width(/depth) features say ``n`` bytes are raw pixels."""
    try:
        h, w = _one_int(feats, "height", ""), _one_int(feats, "width", "")
        d = _one_int(feats, "depth", "") or _one_int(feats, "channels", "")
    except MnistflowError:
        return False
    if not h or not w:
        return False
    return any(h * w * c == n for c in ((d,) if d else (1, 3)))


def _resized(arr: np.ndarray, resize: tuple[int, int] | None) -> np.ndarray:
    if resize is None or arr.shape[:2] == tuple(resize):
        return arr
    from PIL import Image

    from mnistflow.data.formats.folder import _resample

    img = Image.fromarray(arr[..., 0] if arr.shape[-1] == 1 else arr)
    out = np.asarray(img.resize((resize[1], resize[0]), _resample()), np.uint8)
    return out[..., None] if out.ndim == 2 else out


def _example_image(feats: dict, image_key: str, where: str, resize: tuple[int, int] | None,
                   max_pixels: int | None = None) -> np.ndarray:
    if image_key not in feats:
        fail(where, f"no feature '{image_key}' (features: {', '.join(sorted(feats)) or 'none'}; "
                    "see --image-key)")
    kind, vals = feats[image_key]
    if kind == "bytes":
        if len(vals) != 1:
            fail(where, f"feature '{image_key}' holds {len(vals)} byte strings, expected 1")
        raw = vals[0]
        if raw[:4].startswith(_MAGIC) and not _fits_raw(feats, len(raw)):
            return decode_image(raw, where, resize, max_pixels)
        pix = np.frombuffer(raw, np.uint8)
    elif kind in ("int64", "float"):
        pix = as_pixels(np.asarray(vals, np.float64 if kind == "float" else np.int64), where,
                        f"feature '{image_key}'")
    else:
        fail(where, f"feature '{image_key}' is empty")
    return _resized(pix.reshape(_raw_shape(feats, pix.size, where)), resize)


def _read_file(path: Path, image_key: str, label_key: str, resize, ref, xs: list, ys: list,
               max_pixels: int | None = None, total: list[int] | None = None):
    frames = _file_frames(path)
    if not frames:
        fail(path, "holds no records")
    total = [0] if total is None else total
    for i, rec in enumerate(frames):
        where = f"{path}: record {i}"
        feats = parse_example(rec, where)
        arr = _example_image(feats, image_key, where, resize, max_pixels)
        check_size(arr, where, ref)
        if ref is None:
            ref = (arr.shape[:2], where)
        total[0] += arr.nbytes
        check_dataset_bytes(path, total[0])
        label = _one_int(feats, label_key, where)
        if label is None:
            fail(where, f"no int64 feature '{label_key}' (features: {', '.join(sorted(feats))}; "
                        "see --label-key)")
        if label < 0 or label >= limits.MAX_CLASSES:
            fail(where, f"label {label} is not a class index")
        xs.append(arr)
        ys.append(label)
    return ref


def _is_tfrecord(p: Path) -> bool:
    return p.is_file() and not p.name.startswith(".") and ".tfrecord" in p.name.lower()


def tfrecord_files(folder: Path) -> list[Path]:
    """The TFRecord files directly in ``folder`` (names containing '.tfrecord')."""
    return sorted(p for p in folder.iterdir() if _is_tfrecord(p))


def read_tfrecord_dataset(path: str | os.PathLike, image_key: str = "image",
                          label_key: str = "label", resize: tuple[int, int] | None = None,
                          name: str | None = None, max_pixels: int | None = None) -> RawDataset:
    """Read one TFRecord file, or a folder of them ("test" in a name -> test split);
    ``max_pixels`` caps each encoded image before it is decoded (``core.limits.MAX_PIXELS``)."""
    path = Path(path)
    if path.is_dir():
        files = tfrecord_files(path)
        if not files:
            fail(path, "no *.tfrecord files here")
        test_files = [p for p in files if "test" in p.name.lower()]
        train_files = [p for p in files if p not in test_files]
        if not train_files:
            fail(path, "only test TFRecord files here (names containing 'test'); need training ones")
    else:
        train_files, test_files = [path], []
    xs: list = []
    ys: list = []
    ref = None
    total = [0]
    for f in train_files:
        ref = _read_file(f, image_key, label_key, resize, ref, xs, ys, max_pixels, total)
    n = len(xs)
    for f in test_files:
        ref = _read_file(f, image_key, label_key, resize, ref, xs, ys, max_pixels, total)
    x = stack_images(xs)
    y = np.asarray(ys, np.int64)
    test = RawSplit(x[n:], y[n:]) if test_files else None
    stem = path.name.split(".")[0]
    return dataset_from_labels(name or stem, RawSplit(x[:n], y[:n]), test, train_files + test_files,
                               where=path, test_where=test_files[0] if len(test_files) == 1 else path)
