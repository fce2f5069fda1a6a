"""Readers for every input format -> ``RawDataset`` (uint8 NHWC arrays + labels + class names).

Formats: IDX pairs (MNIST's own), known datasets by name, a folder of class folders,
CSV (label,pixel0..), Keras-style .npz, TFRecord of tf.train.Example, CIFAR-10 python batches.
Detection looks at what ``--data`` points to; every failure is a ``MnistflowError``.

Readers hand over the label values as the files hold them; ``dataset_from_labels`` makes the
classes (no empty class for a value no image and no name has: EMNIST letters' 1..26 are 26
classes, shown a..z).
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from mnistflow.core.errors import MnistflowError, fail
from mnistflow.core.paths import home
from mnistflow.data import datasets
from mnistflow.data.formats.idx import (
    ZipMember,
    open_input,
    open_source,
    read_idx_pair,
    zip_names,
)
from mnistflow.data.formats.raw import (
    MAX_CLASSES,
    RawDataset,
    RawSplit,
    dataset_from_labels,
)
from mnistflow.core.fsutil import open_regular

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
                    class_names: list[str] | dict[int, str] | None = None) -> RawDataset:
    """An IDX folder; its classes are the label values the training labels use (named by
    ``class_names`` when given: a list for values 0..K-1, or {value: name})."""
    files = find_idx_files(folder)
    if ("train", "images") not in files or ("train", "labels") not in files:
        fail(folder, "no train-images-idx3-ubyte[.gz] / train-labels-idx1-ubyte[.gz] pair here")
    return _idx_dataset(name or folder.name, files["train", "images"], files["train", "labels"],
                        files.get(("test", "images")), files.get(("test", "labels")),
                        class_names, sorted(files.values()))


def _idx_dataset(name: str, images: Path | ZipMember, labels: Path | ZipMember,
                 test_images: Path | ZipMember | None, test_labels: Path | ZipMember | None,
                 names, files: list[Path], *, transpose: bool = False) -> RawDataset:
    """A train pair and an optional test pair of IDX files as a ``RawDataset`` whose classes
    come from the original label values (and ``names``)."""
    x, y = read_idx_pair(images, labels, transpose=transpose)
    test = None
    if test_images is not None and test_labels is not None:
        tx, ty = read_idx_pair(test_images, test_labels, transpose=transpose)
        if tx.shape[1:] != x.shape[1:]:
            fail(test_images, f"test images are {tx.shape[1:]}, train images {x.shape[1:]}")
        test = RawSplit(tx, ty)
    return dataset_from_labels(name, RawSplit(x, y), test, files, names,
                               where=str(labels),
                               test_where=None if test_labels is None else str(test_labels))


def _md5(f) -> str:
    """md5 of a binary stream, read in chunks (never the whole file in memory)."""
    h = hashlib.md5()
    for chunk in iter(lambda: f.read(1 << 22), b""):
        h.update(chunk)
    return h.hexdigest()


def verify_known_files(ds: datasets.KnownDataset, folder: Path) -> None:
    """Check local files against the published sums: the file's md5, or the md5 of its
    uncompressed content when that is known (a recompressed .gz is still the real data).
    EMNIST's separate files have no published sums: their reader checks their structure."""
    for f in ds.files:
        p = folder / f.name
        if ds.format == "emnist" and not p.is_file():
            continue  # the separate files, placed by hand
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


def _loose_emnist(ds: datasets.KnownDataset, folder: Path) -> list[Path] | None:
    """EMNIST's separate files for ``ds``'s split placed by hand (each .gz or gunzipped;
    the mapping file beside them is optional), else None."""
    found = []
    for name in ds.loose_files:
        gz = folder / name
        plain = gz.with_suffix("")
        p = plain if plain.is_file() else gz  # prefer the uncompressed file, as for IDX folders
        if not p.is_file():
            return None
        found.append(p)
    mapping = folder / ds.mapping
    return found + ([mapping] if mapping.is_file() else [])


def known_files(ds: datasets.KnownDataset, folder: Path) -> list[Path] | None:
    """The files of ``ds`` in ``folder`` (what defines its content, in reading order), or None
    when some are missing. EMNIST: its zip, else the split's separate files."""
    if not folder.is_dir():
        return None
    paths = [folder / f.name for f in ds.files]
    if all(p.is_file() for p in paths):
        return paths
    if ds.format == "emnist":
        return _loose_emnist(ds, folder)
    return None


def _candidates(ds: datasets.KnownDataset, base: Path) -> list[Path]:
    return list(dict.fromkeys((base / ds.name, base / ds.home, base)))


def locate_known(ds: datasets.KnownDataset, data: Path | None = None,
                 download: bool = True) -> Path:
    """Where the raw files of a known dataset are: ``data``, else ``$MNISTFLOW_DATA``
    (itself or its ``<name>/`` or shared ``<folder>/`` sub-folder), else the cache, else a
    verified download."""
    if data is not None:
        for cand in _candidates(ds, data):
            if known_files(ds, cand):
                return cand
        if ds.format == "emnist":
            fail(data, f"missing {ds.name} files: put {ds.by_hand()} here")
        missing = [f.name for f in ds.files if not (data / f.name).is_file()]
        fail(data, f"missing {ds.name} file(s): {', '.join(missing)}")
    env = os.environ.get("MNISTFLOW_DATA")
    if env:
        for cand in _candidates(ds, Path(env)):
            if known_files(ds, cand):
                return cand
    cache = home() / "raw" / ds.home
    if known_files(ds, cache):
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
    if ds.format == "emnist":
        return read_emnist(ds, folder)
    files = [folder / f.name for f in ds.files]
    return _idx_dataset(ds.name, *files, ds.names, files)


MAX_MAPPING_BYTES = 1 << 16  # EMNIST's largest mapping (byclass, 62 lines) is ~600 bytes


def read_emnist(ds: datasets.KnownDataset, folder: Path) -> RawDataset:
    """One EMNIST split from the zip in ``folder`` (its members read in place), else from the
    split's separate files. Images come out upright (EMNIST stores them transposed); class
    names come from the split's mapping file, else from the table."""
    files = known_files(ds, folder)
    if not files:
        fail(folder, f"missing {ds.name} files: put {ds.by_hand()} here")
    if files[0].name == ds.files[0].name:  # the zip
        archive = files[0]
        members = {n.rsplit("/", 1)[-1]: n for n in zip_names(archive)}
        wanted = list(ds.loose_files)
        missing = [w for w in wanted if w not in members]
        if missing:
            fail(archive, f"is not EMNIST's zip: it has no {', '.join(missing)}")
        src = [ZipMember(archive, members[w]) for w in wanted]
        mapping = ZipMember(archive, members[ds.mapping]) if ds.mapping in members else None
    else:
        src = files[:4]
        mapping = files[4] if len(files) > 4 else None
    names = read_emnist_mapping(mapping) if mapping is not None else ds.names
    return _idx_dataset(ds.name, *src, names, files, transpose=True)


def read_emnist_mapping(src: Path | ZipMember) -> dict[int, str]:
    """{label: name} from an EMNIST mapping file: lines "label ascii_code [ascii_code]"; a
    label with two codes (letters: "1 65 97", upper and lower case merged) is named by the
    last, so that letters are 'a'..'z'."""
    with open_source(src, gz=False) as (f, _, _):
        data = f.read(MAX_MAPPING_BYTES + 1)
    if len(data) > MAX_MAPPING_BYTES:
        fail(src, f"more than {MAX_MAPPING_BYTES:,} bytes: not an EMNIST mapping file")
    names: dict[int, str] = {}
    for n, line in enumerate(data.decode("ascii", "replace").splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        nums = [int(p) for p in parts if p.isdigit()]
        if (len(nums) != len(parts) or not 2 <= len(nums) <= 3 or nums[0] >= MAX_CLASSES
                or not all(32 < c < 127 for c in nums[1:])):  # printable ASCII, no space
            fail(src, f"line {n}: expected 'label ascii_code [ascii_code]', got {line[:40]!r}")
        if nums[0] in names:
            fail(src, f"line {n}: label {nums[0]} is mapped twice")
        names[nums[0]] = chr(nums[-1])
    if not names:
        fail(src, "is empty: no 'label ascii_code' lines")
    return names


def _known_files_here(folder: Path) -> str | None:
    """'emnist-<split>' or 'qmnist' when ``folder`` holds their files (which only their
    names read: EMNIST's images need turning upright, QMNIST's labels are rows)."""
    if (folder / datasets.EMNIST_ZIP.name).is_file():
        return "emnist-<split>"
    for p in folder.iterdir():
        m = re.match(r"^(emnist-[a-z]+|qmnist)-train-images-idx3-ubyte", p.name)
        if m:
            return m.group(1)
    return None


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
        known = _known_files_here(path)
        if known:
            fail(path, f"holds {known}'s files: name the dataset, e.g. "
                       f"mnistflow prep {known} --data {path}")
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
