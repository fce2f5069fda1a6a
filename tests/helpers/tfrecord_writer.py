"""A TFRecord writer for the tests: the inverse of ``mnistflow.data.formats.tfrecord``'s reader.

Framing (with both masked CRC32Cs), ``tf.train.Example`` serialization and a one-call
``write_tfrecord`` of uint8 images and labels. It lives with the tests because mnistflow only
reads TFRecord; the CRC it shares with the reader is imported from the package.
"""
from __future__ import annotations

import gzip
import io
import os
import struct
from pathlib import Path

import numpy as np

from mnistflow.data.formats.tfrecord import _mask, crc32c, crc32c_many


def frame(records: list[bytes]) -> bytes:
    """TFRecord framing of ``records`` (with both masked CRCs)."""
    crcs = _mask(crc32c_many(records))
    out = bytearray()
    for rec, dcrc in zip(records, crcs.tolist()):
        head = struct.pack("<Q", len(rec))
        out += head + struct.pack("<I", _mask(crc32c(head))) + rec + struct.pack("<I", dcrc)
    return bytes(out)


def _enc_varint(v: int) -> bytes:
    v &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _ld(fno: int, payload: bytes) -> bytes:
    return _enc_varint(fno << 3 | 2) + _enc_varint(len(payload)) + payload


def encode_example(features: dict) -> bytes:
    """Serialize a ``tf.train.Example``. Values: bytes (or a list of bytes) -> bytes_list;
    int or ints -> int64_list (packed); float or floats -> float_list (packed)."""
    entries = b""
    for key, val in features.items():
        if isinstance(val, (bytes, bytearray)):
            val = [bytes(val)]
        if isinstance(val, (int, np.integer)):
            val = [int(val)]
        if isinstance(val, float):
            val = [val]
        vals = list(val)
        if vals and isinstance(vals[0], (bytes, bytearray)):
            feat = _ld(1, b"".join(_ld(1, bytes(x)) for x in vals))
        elif all(isinstance(x, (int, np.integer)) for x in vals):
            feat = _ld(3, _ld(1, b"".join(_enc_varint(int(x)) for x in vals)))
        else:
            feat = _ld(2, _ld(1, np.asarray(vals, "<f4").tobytes()))
        entries += _ld(1, _ld(1, key.encode("utf-8")) + _ld(2, feat))
    return _ld(1, entries)


def write_tfrecord(path: str | os.PathLike, images: np.ndarray, labels: np.ndarray,
                   image_key: str = "image", label_key: str = "label",
                   encode: str = "png") -> Path:
    """Write uint8 images (N,H,W[,C]) and int labels as a TFRecord of Examples.

    ``encode="png"`` stores PNG bytes; ``"raw"`` stores the pixel bytes plus
    ``height``/``width``/``depth`` features. A path ending in ``.gz`` is gzip-compressed."""
    from PIL import Image

    path = Path(path)
    images = np.asarray(images)
    if images.ndim == 3:
        images = images[..., None]
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ValueError(f"{path}: expected uint8 images (N,H,W[,C]) with C 1 or 3, got "
                         f"{images.dtype} {images.shape}")
    if encode not in ("png", "raw"):
        raise ValueError(f"{path}: encode must be 'png' or 'raw', not '{encode}'")
    if len(labels) != len(images):
        raise ValueError(f"{path}: {len(labels)} labels for {len(images)} images")
    records = []
    h, w, c = images.shape[1:]
    for img, lab in zip(images, np.asarray(labels).tolist()):
        if encode == "png":
            buf = _png(Image.fromarray(img[..., 0] if c == 1 else img))
            feats = {image_key: buf, label_key: int(lab)}
        else:
            feats = {image_key: img.tobytes(), label_key: int(lab),
                     "height": h, "width": w, "depth": c}
        records.append(encode_example(feats))
    data = frame(records)
    if path.name.lower().endswith(".gz"):
        data = gzip.compress(data, compresslevel=6)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _png(img) -> bytes:
    b = io.BytesIO()
    img.save(b, format="PNG")
    return b.getvalue()
