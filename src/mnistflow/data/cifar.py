"""CIFAR-10 "python version": ``cifar-10-python.tar.gz`` or its ``cifar-10-batches-py`` folder.

Batches ``data_batch_1..k`` (train, consecutive from 1) and ``test_batch`` (optional) are
Python pickles of dicts with ``data`` (N, 3072) uint8 -- per image the R, G, B planes of
32x32, row-major -- and ``labels`` (N ints). They are unpickled by a *restricted* unpickler
that can rebuild numpy arrays and nothing else: any other global is refused. Tar members are
read in memory, never extracted to disk.
"""
from __future__ import annotations

import io
import os
import pickle
import re
import tarfile
from pathlib import Path

import numpy as np

from ..errors import MnistflowError, fail
from .sources import RawDataset, RawSplit, check_labels

_BATCH = re.compile(r"^(data_batch_(\d+)|test_batch)$")


def _allowed() -> dict[tuple[str, str], object]:
    import numpy.lib.format  # noqa: F401  (makes sure numpy's pickle helpers are loaded)

    try:
        from numpy._core import multiarray, numeric
    except ImportError:  # numpy < 2
        from numpy.core import multiarray, numeric  # type: ignore[no-redef]
    ok: dict[tuple[str, str], object] = {("numpy", "ndarray"): np.ndarray,
                                         ("numpy", "dtype"): np.dtype}
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        ok[mod, "_reconstruct"] = multiarray._reconstruct
        ok[mod, "scalar"] = multiarray.scalar
    if hasattr(numeric, "_frombuffer"):
        for mod in ("numpy.core.numeric", "numpy._core.numeric"):
            ok[mod, "_frombuffer"] = numeric._frombuffer
    return ok


class _SafeUnpickler(pickle.Unpickler):
    """Rebuilds numpy arrays, lists, dicts, bytes, str and numbers; refuses everything else."""

    def __init__(self, f, where: str):
        super().__init__(f, encoding="latin1")
        self.where = where
        self.ok = _allowed()

    def find_class(self, module: str, name: str):
        obj = self.ok.get((module, name))
        if obj is None:
            raise MnistflowError(f"refusing to unpickle {module}.{name}: a CIFAR batch holds "
                                 "only numpy arrays and lists (is this file tampered with?)",
                                 self.where)
        return obj

    def persistent_load(self, pid):
        raise MnistflowError("refusing to unpickle a persistent reference", self.where)


def safe_unpickle(data: bytes, where: str) -> object:
    """Unpickle ``data`` allowing numpy arrays only; any failure is a ``MnistflowError``."""
    try:
        return _SafeUnpickler(io.BytesIO(data), where).load()
    except MnistflowError:
        raise
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
            if _BATCH.match(p.name) and p.is_file():
                try:
                    out[p.name] = (str(p), p.read_bytes())
                except OSError as e:
                    fail(p, f"cannot read: {e.strerror or e}")
        return out
    try:
        with tarfile.open(path, "r:*") as tar:
            for m in tar:
                base = m.name.rsplit("/", 1)[-1]
                if m.isfile() and _BATCH.match(base):
                    f = tar.extractfile(m)
                    out[base] = (f"{path}: {m.name}", f.read() if f else b"")
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
