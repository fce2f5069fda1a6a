"""Readers for every input format -> ``RawDataset`` (uint8 NHWC arrays + labels + class names).

Formats: IDX pairs (MNIST's own), known datasets by name, a folder of class folders,
CSV (label,pixel0..), Keras-style .npz, TFRecord of tf.train.Example, CIFAR-10 python batches.
Detection looks at what ``--data`` points to; every failure is a ``MnistflowError``.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from mnistflow.core.errors import MnistflowError, fail
from mnistflow.core.paths import home
from mnistflow.data import datasets
from mnistflow.data.formats.idx import open_input, read_idx_pair
from mnistflow.data.formats.raw import (
    RawDataset,
    RawSplit,
    check_labels,
    class_count,
    open_regular,
    warn_empty_classes,
)

_IDX_RE = re.compile(r"^(train|t10k|test)[-_.]?(images|labels)[-_.]idx[13]-ubyte(\.gz)?$")


def find_idx_files(folder: Path) -> dict[tuple[str, str], Path]:
    """{('train'|'test', 'images'|'labels'): path} for the IDX files in ``folder``."""
    found: dict[tuple[str, str], Path] = {}
    for p in sorted(folder.iterdir()):
        m = _IDX_RE.match(p.name)
        if not m:
            continue
        split = "train" if m.group(1) == "train" else "test"
        key = (split, m.group(2))
        # Prefer the uncompressed file when both are present (no decompression).
        if key not in found or not p.name.endswith(".gz"):
            found[key] = p
    return found


def read_idx_folder(folder: Path, name: str | None = None,
                    class_names: list[str] | None = None) -> RawDataset:
    files = find_idx_files(folder)
    if ("train", "images") not in files or ("train", "labels") not in files:
        fail(folder, "no train-images-idx3-ubyte[.gz] / train-labels-idx1-ubyte[.gz] pair here")
    x, y = read_idx_pair(files["train", "images"], files["train", "labels"])
    test = None
    if ("test", "images") in files and ("test", "labels") in files:
        tx, ty = read_idx_pair(files["test", "images"], files["test", "labels"])
        if tx.shape[1:] != x.shape[1:]:
            fail(files["test", "images"], f"test images are {tx.shape[1:]}, train images {x.shape[1:]}")
        test = RawSplit(tx, ty)
    if class_names is None:  # "0".."K-1", K bounded before any name is made
        k = class_count(files["train", "labels"], y, test.y if test else None)
        warn_empty_classes(files["train", "labels"], y, k)
        class_names = [str(i) for i in range(k)]
    check_labels(y, len(class_names), files["train", "labels"])
    if test is not None:
        check_labels(test.y, len(class_names), files["test", "labels"])
    return RawDataset(name or folder.name, list(class_names), RawSplit(x, y), test,
                      sorted(files.values()))


def _md5(f) -> str:
    """md5 of a binary stream, read in chunks (never the whole file in memory)."""
    h = hashlib.md5()
    for chunk in iter(lambda: f.read(1 << 22), b""):
        h.update(chunk)
    return h.hexdigest()


def verify_known_files(ds: datasets.KnownDataset, folder: Path) -> None:
    """Check local files against the published sums: the file's md5, or the md5 of its
    uncompressed content when that is known (a recompressed .gz is still the real data)."""
    for f in ds.files:
        p = folder / f.name
        with open_regular(p) as fh:
            got = _md5(fh)
        if got == f.md5:
            continue
        if f.raw_md5 and p.name.endswith(".gz"):
            with open_input(p) as (stream, _, _):
                if _md5(stream) == f.raw_md5:
                    continue
        fail(p, f"checksum does not match the published {ds.name} file {f.name} "
                f"(md5 {got}, expected {f.md5}); is this really {ds.name}?")


def _has_files(ds: datasets.KnownDataset, folder: Path) -> bool:
    return folder.is_dir() and all((folder / f.name).is_file() for f in ds.files)


def locate_known(ds: datasets.KnownDataset, data: Path | None = None,
                 download: bool = True) -> Path:
    """Where the raw files of a known dataset are: ``data``, else ``$MNISTFLOW_DATA``
    (itself or its ``<name>/`` sub-folder), else the cache, else a verified download."""
    if data is not None:
        for cand in (data / ds.name, data):
            if _has_files(ds, cand):
                return cand
        missing = [f.name for f in ds.files if not (data / f.name).is_file()]
        fail(data, f"missing {ds.name} file(s): {', '.join(missing)}")
    env = os.environ.get("MNISTFLOW_DATA")
    if env:
        for cand in (Path(env) / ds.name, Path(env)):
            if _has_files(ds, cand):
                return cand
    cache = home() / "raw" / ds.name
    if _has_files(ds, cache):
        return cache
    if not download:
        fail(cache, f"{ds.name} is not downloaded")
    from mnistflow.data.download import (
        fetch_known,  # only when needed: it pulls in urllib
    )

    return fetch_known(ds, cache)


def read_known(name: str, data: Path | None = None) -> RawDataset:
    ds = datasets.lookup(name)
    if ds is None:
        known = ", ".join(sorted(datasets.KNOWN))
        raise MnistflowError(f"unknown dataset '{name}' (known: {known}; or pass --data PATH)")
    folder = locate_known(ds, data)
    verify_known_files(ds, folder)
    if ds.format == "cifar":
        from mnistflow.data.formats.cifar import read_cifar10

        return read_cifar10(folder / ds.files[0].name, list(ds.class_names), ds.name)
    files = [folder / f.name for f in ds.files]
    x, y = read_idx_pair(files[0], files[1])
    tx, ty = read_idx_pair(files[2], files[3])
    names = list(ds.class_names)
    check_labels(y, len(names), files[1])
    check_labels(ty, len(names), files[3])
    return RawDataset(ds.name, names, RawSplit(x, y), RawSplit(tx, ty), files)


def detect_format(path: Path) -> str:
    """One of: idx, folder, csv, npz, tfrecord, cifar, records."""
    if not path.exists():
        fail(path, "no such file or directory")
    if path.is_dir():
        if (path / "meta.json").is_file():
            return "records"
        if find_idx_files(path):
            return "idx"
        if (path / "data_batch_1").is_file() or (path / "cifar-10-batches-py").is_dir():
            return "cifar"
        if any(p.is_file() and ".tfrecord" in p.name.lower() for p in path.iterdir()):
            return "tfrecord"
        return "folder"
    name = path.name.lower()
    for suffix, fmt in ((".csv", "csv"), (".csv.gz", "csv"), (".npz", "npz"),
                        (".tar.gz", "cifar"), (".tgz", "cifar")):
        if name.endswith(suffix):
            return fmt
    if ".tfrecord" in name:  # x.tfrecord, x.tfrecords(.gz), x.tfrecord-00000-of-00004
        return "tfrecord"
    if _IDX_RE.match(path.name):
        return "idx"
    fail(path, "cannot tell the format (expected an IDX folder, a folder of class folders, "
               ".csv, .npz, .tfrecord, a CIFAR-10 archive or a records directory)")


def read_source(path: Path, *, name: str | None = None, resize: tuple[int, int] | None = None,
                tfrecord_keys: tuple[str, str] = ("image", "label"),
                max_pixels: int | None = None) -> RawDataset:
    """Read any supported raw input at ``path`` into a ``RawDataset``; ``max_pixels`` caps
    each encoded picture (image folders, TFRecord) before it is decoded (default
    ``picture.MAX_PIXELS``)."""
    path = Path(path)
    fmt = detect_format(path)
    if fmt == "idx":
        return read_idx_folder(path if path.is_dir() else path.parent, name)
    if fmt == "folder":
        from mnistflow.data.formats.folder import read_image_folder

        return read_image_folder(path, resize=resize, name=name, max_pixels=max_pixels)
    if fmt == "csv":
        from mnistflow.data.formats.csv import read_csv

        return read_csv(path, name=name)
    if fmt == "npz":
        from mnistflow.data.formats.npz import read_npz

        return read_npz(path, name=name)
    if fmt == "tfrecord":
        from mnistflow.data.formats.tfrecord import read_tfrecord_dataset

        return read_tfrecord_dataset(path, image_key=tfrecord_keys[0],
                                     label_key=tfrecord_keys[1], resize=resize, name=name,
                                     max_pixels=max_pixels)
    if fmt == "cifar":
        from mnistflow.data.formats.cifar import read_cifar10

        return read_cifar10(path, list(datasets.KNOWN["cifar10"].class_names), name or "cifar10")
    fail(path, "is already a records directory; nothing to prepare")
