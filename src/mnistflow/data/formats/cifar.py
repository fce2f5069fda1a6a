"""CIFAR-10 "python version": ``cifar-10-python.tar.gz`` or its ``cifar-10-batches-py`` folder.

Batches ``data_batch_1..k`` (train, consecutive from 1) and ``test_batch`` (optional) are
Python pickles of dicts with ``data`` (N, 3072) uint8 -- per image the R, G, B planes of
32x32, row-major -- and ``labels`` (N ints). They are unpickled by a *restricted* unpickler
that can rebuild numpy arrays and nothing else: any other global is refused. Tar members are
read in memory, never extracted to disk.

What a batch may cost is bounded by what a real one needs, checked before allocating: a
batch file (or tar member) holds at most ``limits.MAX_CIFAR_BATCH_BYTES``; an array is only ever built
from data bytes whose length matches its shape (``numpy.ndarray`` is not callable, so no
array can be made from a shape alone); a batch holds at most ``limits.MAX_CIFAR_BATCH_IMAGES`` images,
and unpickling stops after ``limits.MAX_PICKLE_OPS`` opcodes (a list of a million labels is refused).
"""
from __future__ import annotations

import io
import math
import os
import pickle
import re
import tarfile
from pathlib import Path
from typing import NoReturn

import numpy as np

from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError, fail
from mnistflow.core.fsutil import open_regular, regular_file
from mnistflow.data.formats.raw import RawDataset, RawSplit, check_labels

_BATCH = re.compile(r"^(data_batch_(\d+)|test_batch)$")


_SIMPLE_DTYPE = re.compile(r"^[<>|=]?(u1|u2|u4|u8|i1|i2|i4|i8|f4|f8|b1)$")


class _Refused(pickle.UnpicklingError):
    pass


def _latin1(text: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode``, for latin-1 only: how Python 3 writes bytes at protocol 2."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Refused(f"_codecs.encode with {encoding!r}")
    return text.encode("latin1")


def _empty_bytes(*args) -> bytes:
    if args:
        raise _Refused("bytes() with arguments")
    return b""


def _dtype(spec, align=False, copy=False) -> np.dtype:
    """``numpy.dtype`` for plain numeric types only (no objects, records or void)."""
    if not isinstance(spec, str) or not _SIMPLE_DTYPE.match(spec):
        raise _Refused(f"numpy.dtype({spec!r:.40})")
    return np.dtype(spec)


def _multiarray():
    try:
        from numpy._core import multiarray, numeric
    except ImportError:  # numpy < 2
        from numpy.core import multiarray, numeric  # type: ignore[no-redef]
    return multiarray, numeric


class _NdarrayType:
    """What the global ``numpy.ndarray`` resolves to: a name ``_reconstruct`` accepts as its
    subtype, never a callable (``ndarray(shape)`` would allocate without any data)."""

    def __call__(self, *args, **kwargs):
        raise _Refused("numpy.ndarray called directly (an array made from a shape alone)")

    def __reduce__(self):
        raise _Refused("numpy.ndarray")


_NDARRAY = _NdarrayType()


def _shape_bytes(shape, dtype: np.dtype) -> int:
    if not (isinstance(shape, tuple) and all(type(n) is int and n >= 0 for n in shape)):
        raise _Refused("a numpy array with an unusual shape")
    return math.prod(shape) * dtype.itemsize


def _reconstruct(subtype, shape, code):
    if subtype is not _NDARRAY or shape != (0,) or code not in (b"b", "b"):
        raise _Refused("numpy _reconstruct with unusual arguments")
    return _multiarray()[0]._reconstruct(np.ndarray, (0,), b"b")  # empty: BUILD fills it


def _frombuffer(buf, dtype, shape, order):
    if not isinstance(dtype, np.dtype) or dtype.kind not in "uifb" or order not in ("C", "F"):
        raise _Refused("numpy _frombuffer with unusual arguments")
    if not isinstance(buf, (bytes, bytearray)) or len(buf) != _shape_bytes(shape, dtype):
        raise _Refused("numpy _frombuffer with data that does not match the shape")
    return np.frombuffer(buf, dtype=dtype).reshape(shape, order=order)


_ALLOWED: dict[tuple[str, str], object] = {
    ("numpy", "ndarray"): _NDARRAY, ("numpy", "dtype"): _dtype,
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("_codecs", "encode"): _latin1, ("builtins", "bytes"): _empty_bytes,
}


def _check_dtype_state(state) -> None:
    # numpy writes (3, byteorder, None, None, None, -1, -1, 0) for plain numeric types.
    if not (isinstance(state, tuple) and len(state) == 8 and state[0] == 3
            and state[1] in ("<", ">", "|", "=") and state[2:] == (None, None, None, -1, -1, 0)):
        raise _Refused("a numpy dtype with unusual state")


def _check_array_state(state) -> None:
    """(version, shape, dtype, fortran, data): plain numeric, and exactly the data bytes the
    shape needs (a str holds them as latin-1, one character per byte)."""
    if not (isinstance(state, tuple) and len(state) == 5 and isinstance(state[1], tuple)
            and isinstance(state[2], np.dtype) and state[2].kind in "uifb"
            and isinstance(state[3], bool) and isinstance(state[4], (bytes, str))):
        raise _Refused("a numpy array with unusual state")
    if len(state[4]) != _shape_bytes(state[1], state[2]):
        raise _Refused(f"a numpy array of shape {state[1]} with {len(state[4])} bytes of data")


class _SafeUnpickler(pickle._Unpickler):  # the pure-Python one: its opcodes can be checked
    """Rebuilds plain numeric numpy arrays, lists, dicts, bytes, str and numbers; refuses
    every other global, and any object state (BUILD) but a plain dtype's or array's."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, f, where: str):
        super().__init__(f, encoding="latin1")
        self.where = where
        self.ops = 0

    def find_class(self, module: str, name: str) -> object:
        obj = _ALLOWED.get((module, name))
        if obj is None:
            raise MnistflowError(f"refusing to unpickle {module}.{name}: a CIFAR batch holds "
                                 "only numpy arrays and lists (is this file tampered with?)",
                                 self.where)
        return obj

    def persistent_load(self, pid: object) -> NoReturn:
        raise _Refused("a persistent reference")

    def load_build(self) -> None:
        state, inst = self.stack[-1], self.stack[-2]
        if isinstance(inst, np.dtype):
            _check_dtype_state(state)
        elif type(inst) is np.ndarray:
            _check_array_state(state)
        else:
            raise _Refused(f"setting the state of a {type(inst).__name__}")
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build


def _counted(op):
    def run(self):
        self.ops += 1
        if self.ops > limits.MAX_PICKLE_OPS:
            raise _Refused(f"a pickle of more than {limits.MAX_PICKLE_OPS:,} opcodes (far more than a "
                           f"batch of {limits.MAX_CIFAR_BATCH_IMAGES:,} images needs)")
        op(self)
    return run


# Every object the unpickler makes costs at least one opcode: counting them bounds memory.
_SafeUnpickler.dispatch = {k: _counted(v) for k, v in _SafeUnpickler.dispatch.items()}


def safe_unpickle(data: bytes, where: str) -> object:
    """Unpickle ``data`` allowing numpy arrays only; any failure is a ``MnistflowError``."""
    try:
        return _SafeUnpickler(io.BytesIO(data), where).load()
    except MnistflowError:
        raise
    except _Refused as e:
        fail(where, f"refusing to unpickle {e}: a CIFAR batch holds only plain numpy arrays "
                    "and lists (is this file tampered with?)")
    except Exception as e:  # a malformed pickle can raise almost anything
        fail(where, f"not a readable CIFAR batch pickle ({type(e).__name__}: {e})")


def _batch(data: bytes, where: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    d = safe_unpickle(data, where)
    if not isinstance(d, dict):
        fail(where, f"expected a dict batch, got {type(d).__name__}")
    d = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in d.items()}
    if "data" not in d or "labels" not in d:
        fail(where, f"batch lacks 'data'/'labels' (keys: {', '.join(map(str, d))})")
    x = d["data"]
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3072:
        desc = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
        fail(where, f"'data' should be uint8 (N, 3072), got {desc}")
    if len(x) > limits.MAX_CIFAR_BATCH_IMAGES:
        fail(where, f"{len(x):,} images in one batch; CIFAR-10 batches hold 10,000")
    try:
        y = np.asarray(d["labels"])
    except Exception:
        y = np.asarray([], object)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        fail(where, "'labels' should be a list of integers")
    if len(y) != len(x):
        fail(where, f"{len(y)} labels for {len(x)} images")
    y = y.astype(np.int64)
    check_labels(y, num_classes, where)
    return x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), y


def _members(path: Path) -> dict[str, tuple[str, bytes]]:
    """{batch name: (where, bytes)} from the archive or folder; ``where`` names the batch
    in errors: its file, or "<archive>: <member>"."""
    out: dict[str, tuple[str, bytes]] = {}
    if path.is_dir():
        folder = path / "cifar-10-batches-py" if (path / "cifar-10-batches-py").is_dir() else path
        for p in sorted(folder.iterdir()):
            if _BATCH.match(p.name):
                with open_regular(p) as f:
                    size = os.fstat(f.fileno()).st_size
                    if size > limits.MAX_CIFAR_BATCH_BYTES:
                        fail(p, f"{size:,} bytes, more than a CIFAR-10 batch can hold "
                                f"({limits.MAX_CIFAR_BATCH_BYTES:,})")
                    try:
                        out[p.name] = (str(p), f.read())
                    except OSError as e:
                        fail(p, f"cannot read: {e.strerror or e}")
        return out
    regular_file(path)
    try:
        with tarfile.open(path, "r:*") as tar:
            for i, m in enumerate(tar):
                if i >= limits.MAX_TAR_MEMBERS:
                    fail(path, f"more than {limits.MAX_TAR_MEMBERS:,} archive members; the CIFAR-10 "
                               "archive has 8")
                base = m.name.rsplit("/", 1)[-1]
                if m.isfile() and _BATCH.match(base):
                    if m.size > limits.MAX_CIFAR_BATCH_BYTES:  # the header's size, before reading any of it
                        fail(path, f"{m.name}: {m.size:,} bytes, more than a CIFAR-10 batch "
                                   f"can hold ({limits.MAX_CIFAR_BATCH_BYTES:,})")
                    f = tar.extractfile(m)
                    out[base] = (f"{path}: {m.name}", f.read() if f else b"")
    except MnistflowError:
        raise
    except OSError as e:
        if not path.exists():
            fail(path, "no such file")
        fail(path, f"not a readable CIFAR-10 archive ({e})")
    except Exception as e:  # TarError, EOFError, zlib.error, ...
        fail(path, f"not a readable CIFAR-10 archive ({type(e).__name__}: {e})")
    return out


def read_cifar10(path: str | os.PathLike, class_names: list[str], name: str = "cifar10") -> RawDataset:
    """Read CIFAR-10 python batches (archive or folder) into a ``RawDataset`` (N, 32, 32, 3)."""
    path = Path(path)
    batches = _members(path)
    nums = sorted(int(_BATCH.match(k).group(2)) for k in batches if k != "test_batch")
    if not nums:
        fail(path, "no data_batch_1 found (expected the CIFAR-10 python batches)")
    if nums != list(range(1, len(nums) + 1)):
        missing = sorted(set(range(1, max(nums) + 1)) - set(nums))
        fail(path, f"data_batch_{missing[0]} is missing")
    parts = [_batch(batches[f"data_batch_{i}"][1], batches[f"data_batch_{i}"][0],
                    len(class_names)) for i in nums]
    train = RawSplit(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    test = None
    if "test_batch" in batches:
        where, data = batches["test_batch"]
        test = RawSplit(*_batch(data, where, len(class_names)))
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and _BATCH.match(p.name))
    else:
        files = [path]
    return RawDataset(name, list(class_names), train, test, files)
