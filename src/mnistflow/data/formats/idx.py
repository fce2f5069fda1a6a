"""IDX files (MNIST's own format), gzipped or not, validated strictly.

Layout: 2 zero bytes, a type code, the number of dimensions d, then d big-endian
uint32 sizes, then the data. MNIST uses type 0x08 (uint8): images (N, 28, 28), labels (N,);
QMNIST's labels are int32 (N, 8) rows whose first column is the digit. A file is a path or a
``ZipMember`` (EMNIST ships every split in one zip: its members are read in place, never
extracted). A folder of them (``train-images-idx3-ubyte[.gz]``, ``t10k-labels-idx1-ubyte``, ...)
reads as one dataset (:func:`read_idx_folder`).

Files are streamed: the header is checked from the first bytes, then exactly the declared
size is read into one array (more is refused). Before anything is allocated, the declared
size must fit what the file can hold: its own size, or for gzip what deflate can expand
the file to at most (``GZIP_MAX_RATIO``), and ``core.limits.MAX_DATASET_BYTES``.
"""
from __future__ import annotations

import contextlib
import gzip
import math
import re
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from mnistflow.core.errors import MnistflowError, fail
from mnistflow.core.fsutil import open_regular
from mnistflow.data.formats.raw import (
    Names,
    RawDataset,
    RawSplit,
    as_pixels,
    check_dataset_bytes,
    dataset_from_labels,
)

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
GZIP_MAX_RATIO = 1032  # deflate's largest expansion (258 bytes per 2 bits, plus framing)
_GZIP_ERRORS = (EOFError, OSError, zlib.error)
_CHUNK = 1 << 24
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError,
               EOFError, OSError, zlib.error)
IDX_NAME = re.compile(r"^(train|t10k|test)[-_.]?(images|labels)[-_.]idx[13]-ubyte(\.gz)?$")
# EMNIST's image files, by the names NIST publishes them under (in its zip or placed by hand):
# each image is stored transposed (its rows are the letter's columns)
EMNIST_IMAGES = re.compile(r"^emnist-[a-z]+-(train|test)-images-idx3-ubyte(\.gz)?$")


@dataclass(frozen=True)
class ZipMember:
    """One file inside a zip archive, named ``archive:member`` in messages."""
    archive: Path
    member: str

    def __str__(self) -> str:
        return f"{self.archive}:{self.member}"


def zip_names(archive: Path | str) -> list[str]:
    """The member names of a zip archive (its central directory only is read)."""
    with open_regular(archive) as f:
        try:
            with zipfile.ZipFile(f) as z:
                return z.namelist()
        except _ZIP_ERRORS as e:
            fail(archive, f"not a readable zip archive ({e})")


@contextlib.contextmanager
def open_member(src: ZipMember) -> Iterator[tuple[BinaryIO, int, bool]]:
    """(stream, size, gzipped) for a zip member, as ``open_input`` gives for a file. ``size``
    is the most bytes the member can hold: its declared size, bounded by what its stored
    bytes can expand to (a forged directory entry cannot raise the reader's limits). The
    member is decompressed as it is read; zipfile checks its CRC at the end."""
    with open_regular(src.archive) as f:
        archive_size = f.seek(0, 2)
        f.seek(0)
        try:
            z = zipfile.ZipFile(f)
        except _ZIP_ERRORS as e:
            fail(src.archive, f"not a readable zip archive ({e})")
        with z:
            try:
                info = z.getinfo(src.member)
            except KeyError:
                fail(src.archive, f"has no member {src.member}")
            stored = min(info.compress_size, archive_size)
            size = min(info.file_size, stored if info.compress_type == zipfile.ZIP_STORED
                       else max_expanded(stored, True))
            try:
                with z.open(info) as m:
                    gz = m.peek(2)[:2] == b"\x1f\x8b"
                    if src.member.endswith(".gz") and not gz:
                        fail(src, "not a gzip file (bad magic bytes)")
                    yield (gzip.GzipFile(fileobj=m, mode="rb") if gz else m), size, gz
            except MnistflowError:
                raise
            except _ZIP_ERRORS as e:
                fail(src, f"corrupt or truncated zip member ({getattr(e, 'strerror', None) or e})")


@contextlib.contextmanager
def open_input(path: Path | str, gz: bool | None = None) -> Iterator[tuple[BinaryIO, int, bool]]:
    """(stream, file size, gzipped) for a regular file, decompressed on the fly when it is
    gzip (a ``.gz`` name or gzip magic bytes; ``gz`` True/False decides instead); read
    errors become ``MnistflowError``s naming the file. The stream is never read whole here:
    callers read what they need."""
    with open_regular(path) as f:
        size = f.seek(0, 2)
        f.seek(0)
        magic = f.read(2)
        f.seek(0)
        if gz is None:
            gz = magic == b"\x1f\x8b"
        if (gz or str(path).endswith(".gz")) and magic != b"\x1f\x8b":
            fail(path, "not a gzip file (bad magic bytes)")
        stream = gzip.GzipFile(fileobj=f, mode="rb") if gz else f
        try:
            yield stream, size, gz
        except MnistflowError:
            raise
        except _GZIP_ERRORS as e:
            if not gz:
                fail(path, f"cannot read: {getattr(e, 'strerror', None) or e}")
            fail(path, f"corrupt or truncated gzip data ({e})")


def open_source(src: Path | str | ZipMember, gz: bool | None = None,
                ) -> contextlib.AbstractContextManager[tuple[BinaryIO, int, bool]]:
    """``open_input`` for a file, ``open_member`` for a zip member (gzip told by its bytes)."""
    return open_member(src) if isinstance(src, ZipMember) else open_input(src, gz)


def max_expanded(size: int, gz: bool) -> int:
    """The most bytes a file of ``size`` bytes can hold once decompressed."""
    return size * GZIP_MAX_RATIO + (1 << 16) if gz else size


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    out = stream.read(n)
    return out if out is not None else b""


def _header(head: bytes, path: Path | str) -> tuple[int, int]:
    """(dtype code, rank) from the first 4 bytes, checked."""
    if len(head) < 4:
        fail(path, f"too short for an IDX header ({len(head)} bytes)")
    if head[0] != 0 or head[1] != 0:
        fail(path, f"bad IDX magic number 0x{head[:4].hex()} (expected 0x0000 then type and rank)")
    code, ndim = head[2], head[3]
    if code not in _DTYPES:
        fail(path, f"unknown IDX data type 0x{code:02x}")
    if ndim == 0 or ndim > 4:
        fail(path, f"unsupported IDX rank {ndim}")
    return code, ndim


def _shape(dims: bytes, ndim: int, path: Path | str) -> tuple[int, ...]:
    if len(dims) < 4 * ndim:
        fail(path, "truncated IDX header")
    return tuple(int.from_bytes(dims[4 * i:4 * i + 4], "big") for i in range(ndim))


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return math.prod(shape) * dtype.itemsize  # Python ints: no int64 wrap-around


def parse_idx(data: bytes, path: Path | str = "<bytes>") -> np.ndarray:
    """Decode IDX bytes into an array; every inconsistency is a ``MnistflowError``."""
    code, ndim = _header(data[:4], path)
    shape = _shape(data[4:4 + 4 * ndim], ndim, path)
    header = 4 + 4 * ndim
    dtype = np.dtype(_DTYPES[code])
    expected = _nbytes(shape, dtype)
    got = len(data) - header
    if got < expected:
        fail(path, f"truncated: header says {shape} ({expected} bytes of data), file has {got}")
    if got > expected:
        fail(path, f"{got - expected} unexpected trailing bytes after the {shape} array")
    return np.frombuffer(data, dtype, offset=header).reshape(shape)


def stored_transposed(src: Path | str | ZipMember) -> bool:
    """Whether ``src`` is one of EMNIST's image files (told by its name), whose images are
    stored transposed: ``read_idx`` turns them upright, so every path that reads one (prep,
    train and eval ``--data``, predict, report) sees upright letters."""
    name = src.member.rsplit("/", 1)[-1] if isinstance(src, ZipMember) else Path(src).name
    return EMNIST_IMAGES.match(name) is not None


@contextlib.contextmanager
def _open_idx(path: Path | str | ZipMember) -> Iterator[tuple[BinaryIO, tuple[int, ...], np.dtype]]:
    """(stream at the first data byte, shape, dtype) of an IDX file, its header checked and its
    declared size against what the file can hold (exactly its size, or for gzip what deflate
    can expand it to) before anything is sized from it."""
    with open_source(path) as (f, size, gz):
        code, ndim = _header(_read_exact(f, 4), path)
        shape = _shape(_read_exact(f, 4 * ndim), ndim, path)
        dtype = np.dtype(_DTYPES[code])
        expected = _nbytes(shape, dtype)
        header = 4 + 4 * ndim
        if not gz and size - header != expected:
            got = size - header
            if got < expected:
                fail(path, f"truncated: header says {shape} ({expected} bytes of data), file has {got}")
            fail(path, f"{got - expected} unexpected trailing bytes after the {shape} array")
        if gz and expected > max_expanded(size, gz):
            fail(path, f"header says {shape} ({expected:,} bytes of data), more than this "
                       f"{size:,}-byte gzip file can hold: a corrupt or hostile header")
        yield f, shape, dtype


def _read_into(f: BinaryIO, out: np.ndarray, path: Path | str | ZipMember, shape: tuple[int, ...],
               declared: int, done: int = 0) -> None:
    """Fill ``out`` (a contiguous uint8 buffer) from ``f``: a file that ends first is truncated
    (``declared``: the array's bytes, ``done`` of them read before ``out``)."""
    view = memoryview(out.reshape(-1))
    got = 0
    while got < len(view):
        n = f.readinto(view[got:got + _CHUNK])
        if not n:
            fail(path, f"truncated: header says {shape} ({declared} bytes of data), file has {done + got}")
        got += n


def _check_end(f: BinaryIO, path: Path | str | ZipMember, shape: tuple[int, ...]) -> None:
    """No bytes after the declared array: counted, but never a bomb inflated to do it."""
    extra = 0
    while extra <= _CHUNK:
        more = f.read(1 << 20)
        if not more:
            break
        extra += len(more)
    if extra:
        many = f"more than {_CHUNK:,}" if extra > _CHUNK else str(extra)
        fail(path, f"{many} unexpected trailing bytes after the {shape} array")


def read_idx(path: Path | str | ZipMember, max_bytes: int | None = None) -> np.ndarray:
    """Read one IDX(.gz) file (or zip member) into a read-only array, streamed; the declared
    size is checked against what the file can hold and ``max_bytes`` (default
    ``core.limits.MAX_DATASET_BYTES``) before it is allocated. EMNIST's image files
    (``stored_transposed``) come out upright: the one place that turns them."""
    with _open_idx(path) as (f, shape, dtype):
        check_dataset_bytes(path, _nbytes(shape, dtype), max_bytes)
        buf = np.empty(_nbytes(shape, dtype), np.uint8)
        _read_into(f, buf, path, shape, len(buf))
        _check_end(f, path, shape)
    arr = buf.view(dtype).reshape(shape)
    if stored_transposed(path):
        _transpose_items(arr, path)
    arr.flags.writeable = False
    return arr


def _transpose_items(arr: np.ndarray, path: Path | str | ZipMember) -> None:
    """Swap the last two axes of each item in place, a few MB at a time (no second copy of
    a large dataset); the items must be square."""
    if arr.ndim != 3 or arr.shape[1] != arr.shape[2]:
        fail(path, f"expected square images (N, H, H) to turn upright, got shape {arr.shape}")
    step = max(1, (1 << 22) // max(1, arr.itemsize * arr.shape[1] * arr.shape[2]))
    for i in range(0, len(arr), step):
        arr[i:i + step] = arr[i:i + step].transpose(0, 2, 1).copy()


def read_idx_images(path: Path | str | ZipMember, ranks: tuple[int, ...] = (3, 4)) -> np.ndarray:
    """An IDX image file (``prep`` reads them here; ``predict`` a batch at a time,
    :class:`IdxImages`) as uint8 (N, H, W) or (N, H, W, C): of one of ``ranks``, at least one
    image, no side of size 0 (images of no pixels would become records every reader refuses, or
    predictions made from nothing), and pixels by the readers' one rule (``raw.as_pixels``: a
    float or wider-integer file whose values are integers 0..255 is accepted; NaN, fractions
    such as 0..1 floats, or values outside 0..255 are refused)."""
    x = read_idx(path)
    _check_images(path, x.shape, ranks)
    return as_pixels(x, path, "image data")


def _check_images(path: Path | str | ZipMember, shape: tuple[int, ...], ranks: tuple[int, ...]) -> None:
    if len(shape) not in ranks:
        want = " or ".join({3: "(N, H, W)", 4: "(N, H, W, C)"}[r] for r in ranks)
        fail(path, f"expected an IDX image file {want}, got shape {shape}")
    if 0 in shape[1:]:
        fail(path, f"IDX images of shape {shape}: a side of size 0, so the images hold no pixels")
    if not shape[0]:
        fail(path, f"holds no images (shape {shape})")


class IdxImages:
    """An IDX image file read a batch at a time (``predict``'s reader: memory bounded by the
    batch, whatever the file holds). Opening it reads and checks the header only (the shape,
    as :func:`read_idx_images` checks it, and the declared size against the file's);
    :meth:`batches` streams the images, each batch checked as :func:`read_idx_images` checks
    the whole file (pixels, EMNIST's files turned upright), and the end of the file at the
    end. A file found broken part-way (a truncated gzip stream) fails there."""

    def __init__(self, path: Path | str | ZipMember, ranks: tuple[int, ...] = (3, 4)):
        with _open_idx(path) as (_, shape, dtype):
            _check_images(path, shape, ranks)
        if stored_transposed(path) and (len(shape) != 3 or shape[1] != shape[2]):
            fail(path, f"expected square images (N, H, H) to turn upright, got shape {shape}")
        self.path, self.shape, self.dtype = path, shape, dtype

    def __len__(self) -> int:
        return self.shape[0]

    def batches(self, size: int) -> Iterator[np.ndarray]:
        """uint8 arrays of ``size`` images (the last one fewer), (B, H, W) or (B, H, W, C)."""
        item = self.shape[1:]
        item_bytes = _nbytes(item, self.dtype)
        declared = item_bytes * self.shape[0]
        upright = stored_transposed(self.path)
        with _open_idx(self.path) as (f, _, _):
            for start in range(0, self.shape[0], size):
                n = min(size, self.shape[0] - start)
                buf = np.empty(n * item_bytes, np.uint8)
                _read_into(f, buf, self.path, self.shape, declared, start * item_bytes)
                x = as_pixels(buf.view(self.dtype).reshape(n, *item), self.path, "image data")
                yield np.ascontiguousarray(x.transpose(0, 2, 1)) if upright else x
            _check_end(f, self.path, self.shape)


def read_idx_pair(images: Path | ZipMember, labels: Path | ZipMember) -> tuple[np.ndarray, np.ndarray]:
    """Images as (N, H, W, 1) uint8 (``read_idx_images``) and labels as (N,) int64, checked
    against each other. A rank-2 integer label file (QMNIST's: one row of facts per image)
    gives its first column."""
    x = read_idx_images(images)
    y = read_idx(labels)
    if y.ndim == 2 and y.dtype.kind in "iu" and y.shape[1] >= 1:
        y = y[:, 0]  # QMNIST: column 0 is the class, the others its provenance
    elif y.ndim != 1:
        fail(labels, f"expected a rank-1 label file (or rank-2 integer rows), got shape {y.shape}")
    if y.dtype.kind not in "iu":
        fail(labels, f"expected integer labels, got {y.dtype}")
    if len(x) != len(y):
        fail(labels, f"{len(y)} labels for {len(x)} images in {Path(images).name}")
    if x.ndim == 3:
        x = x[..., None]
    return x, y.astype(np.int64)


# --- an IDX folder: a train pair and an optional test pair ---------------------------------

def find_idx_files(folder: Path) -> dict[tuple[str, str], Path]:
    """{('train'|'test', 'images'|'labels'): path} for the IDX files in ``folder``."""
    found: dict[tuple[str, str], Path] = {}
    for p in sorted(folder.iterdir()):
        m = IDX_NAME.match(p.name)
        if not m:
            continue
        split = "train" if m.group(1) == "train" else "test"
        key = (split, m.group(2))
        # Prefer the uncompressed file when both are present (no decompression).
        if key not in found or not p.name.endswith(".gz"):
            found[key] = p
    return found


def read_idx_folder(folder: Path, name: str | None = None, class_names: Names = None) -> RawDataset:
    """An IDX folder; its classes are the label values the training labels use (named by
    ``class_names`` when given: a list for values 0..K-1, or {value: name})."""
    files = find_idx_files(folder)
    if ("train", "images") not in files or ("train", "labels") not in files:
        fail(folder, "no train-images-idx3-ubyte[.gz] / train-labels-idx1-ubyte[.gz] pair here")
    return idx_dataset(name or folder.name, files["train", "images"], files["train", "labels"],
                       files.get(("test", "images")), files.get(("test", "labels")),
                       class_names, sorted(files.values()))


def idx_dataset(name: str, images: Path | ZipMember, labels: Path | ZipMember,
                test_images: Path | ZipMember | None, test_labels: Path | ZipMember | None,
                names: Names, files: list[Path]) -> RawDataset:
    """A train pair and an optional test pair of IDX files as a ``RawDataset`` whose classes
    come from the original label values (and ``names``)."""
    x, y = read_idx_pair(images, labels)
    test = None
    if test_images is not None and test_labels is not None:
        tx, ty = read_idx_pair(test_images, test_labels)
        if tx.shape[1:] != x.shape[1:]:
            fail(test_images, f"test images are {tx.shape[1:]}, train images {x.shape[1:]}")
        test = RawSplit(tx, ty)
    return dataset_from_labels(name, RawSplit(x, y), test, files, names,
                               where=str(labels),
                               test_where=None if test_labels is None else str(test_labels))
