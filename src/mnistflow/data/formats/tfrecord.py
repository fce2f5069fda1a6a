"""TFRecord files of ``tf.train.Example``, read without TensorFlow.

Framing of each record: uint64 length, uint32 masked CRC32C of the length, the data,
uint32 masked CRC32C of the data (all little-endian). Both CRCs are checked. A file may
be gzip-compressed (``.gz`` or gzip magic bytes). The data is a protobuf ``Example``:
``Features features = 1`` -> ``map<string, Feature> feature = 1`` -> one of
``BytesList bytes_list = 1``, ``FloatList float_list = 2``, ``Int64List int64_list = 3``
(packed or not). Only the wire format is needed, decoded here by hand: TensorBoard's protos (a
dependency) lack ``Example``, and TensorFlow or the ``tfrecord`` package would add a large
install (and, for the latter, its own unbounded reads) for three message types. (The tests' writer,
the inverse of this reader, lives in ``tests/helpers/tfrecord_writer.py``.)

Images: the ``image_key`` feature holds encoded PNG/JPEG bytes, or raw uint8 pixels whose
shape comes from ``height``/``width``/``depth`` int64 features (else a square grey image, or
3 x a square for RGB channel-last), or pixel values as an int64/float list. Labels: the
``label_key`` int64 feature (one value; the classes are the values training uses, see
``raw.from_original_labels``). A folder of ``*.tfrecord*`` files reads as one
dataset; files whose names contain "test" are the test split.
"""
from __future__ import annotations

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


# --- protobuf wire format ------------------------------------------------------------------

class _Bad(ValueError):
    pass


def _varint(b: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise _Bad("truncated varint")
        c = b[pos]
        pos += 1
        result |= (c & 0x7F) << shift
        if c < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7
        if shift >= 70:
            raise _Bad("varint longer than 10 bytes")


def _fields(b: bytes, pos: int, end: int):
    """Yield (field number, wire type, value): an int for varints, else a (start, end) span."""
    while pos < end:
        key = b[pos]  # one-byte varints inline: the common case, and much faster
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(b, pos, end)
        fno, wt = key >> 3, key & 7
        if fno == 0:
            raise _Bad("field number 0")
        if wt == 0:
            v, pos = _varint(b, pos, end)
            yield fno, wt, v
            continue
        if wt == 2:
            if pos < end and b[pos] < 0x80:
                size = b[pos]
                pos += 1
            else:
                size, pos = _varint(b, pos, end)
        elif wt in (1, 5):
            size = 8 if wt == 1 else 4
        else:
            raise _Bad(f"unsupported wire type {wt}")
        if pos + size > end:
            raise _Bad("truncated field")
        yield fno, wt, (pos, pos + size)
        pos += size


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _value_list(b: bytes, span: tuple[int, int], kind: str) -> list:
    out: list = []
    for fno, wt, v in _fields(b, *span):
        if fno != 1:
            continue
        if kind == "bytes":
            if wt != 2:
                raise _Bad("bytes_list value is not length-delimited")
            out.append(b[v[0]:v[1]])
        elif kind == "float":
            if wt == 5:
                out.append(struct.unpack_from("<f", b, v[0])[0])
            elif wt == 2:
                if (v[1] - v[0]) % 4:
                    raise _Bad("packed float_list length is not a multiple of 4")
                out.extend(np.frombuffer(b[v[0]:v[1]], "<f4").tolist())
            else:
                raise _Bad(f"float_list value has wire type {wt}")
        else:
            if wt == 0:
                out.append(_signed(v))
            elif wt == 2:
                p, e = v
                while p < e:
                    x, p = _varint(b, p, e)
                    out.append(_signed(x))
            else:
                raise _Bad(f"int64_list value has wire type {wt}")
    return out


_KINDS = {1: "bytes", 2: "float", 3: "int64"}


def _feature(b: bytes, span: tuple[int, int]) -> tuple[str | None, list]:
    kind, vals = None, []
    for fno, wt, v in _fields(b, *span):
        if fno in _KINDS:
            if wt != 2:
                raise _Bad("feature list is not length-delimited")
            kind, vals = _KINDS[fno], _value_list(b, v, _KINDS[fno])
    return kind, vals


def parse_example(data: bytes, where: str | os.PathLike = "<bytes>") -> dict[str, tuple[str | None, list]]:
    """Decode a serialized ``tf.train.Example`` to {name: (kind, values)}, kind one of
    "bytes", "float", "int64" (None for an empty feature). Errors name ``where``."""
    b = bytes(data)
    feats: dict[str, tuple[str | None, list]] = {}
    try:
        for fno, wt, v in _fields(b, 0, len(b)):
            if fno != 1:
                continue
            if wt != 2:
                raise _Bad("features is not length-delimited")
            for fno2, wt2, entry in _fields(b, *v):
                if fno2 != 1:
                    continue
                if wt2 != 2:
                    raise _Bad("feature map entry is not length-delimited")
                key, feat = "", (None, [])
                for fno3, wt3, w in _fields(b, *entry):
                    if fno3 == 1 and wt3 == 2:
                        key = b[w[0]:w[1]].decode("utf-8")
                    elif fno3 == 2 and wt3 == 2:
                        feat = _feature(b, w)
                feats[key] = feat
    except (_Bad, UnicodeDecodeError) as e:
        fail(where, f"not a tf.train.Example ({e})")
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
