"""Every raw input format -> ``RawDataset`` (uint8 NHWC arrays + labels + class names):
what ``--data`` points to is told apart (:func:`detect_format`) and read by its reader
(:func:`read_source`); a known dataset's files are read by its format (:func:`read_known`).

Formats: IDX (``idx``: MNIST's own, a folder or one file of it), a folder of class folders
(``folder``), CSV (``csv``: label,pixel0..), Keras-style .npz (``npz``), TFRecord of
tf.train.Example (``tfrecord``), CIFAR-10 python batches (``cifar``), EMNIST's zip or
separate files (``emnist``, by the dataset's name only). Every failure is a ``MnistflowError``.

Readers hand over the label values as the files hold them; ``raw.dataset_from_labels`` makes
the classes (no empty class for a value no image and no name has: EMNIST letters' 1..26 are 26
classes, shown a..z). Readers are imported when their format is met.
"""
from __future__ import annotations

import re
from pathlib import Path

from mnistflow.core.errors import fail
from mnistflow.data import known
from mnistflow.data.formats.idx import IDX_NAME, find_idx_files, idx_dataset, read_idx_folder
from mnistflow.data.formats.raw import RawDataset


def _known_files_here(folder: Path) -> str | None:
    """'emnist-<split>' or 'qmnist' when ``folder`` holds their files (which only their
    names read: EMNIST's images need turning upright, QMNIST's labels are rows)."""
    if (folder / known.EMNIST_ZIP.name).is_file():
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
        named = _known_files_here(path)
        if named:
            fail(path, f"holds {named}'s files: name the dataset, e.g. "
                       f"mnistflow prep {named} --data {path}")
        return "folder"
    name = path.name.lower()
    for suffix, fmt in ((".csv", "csv"), (".csv.gz", "csv"), (".npz", "npz"),
                        (".tar.gz", "cifar"), (".tgz", "cifar")):
        if name.endswith(suffix):
            return fmt
    if ".tfrecord" in name:  # x.tfrecord, x.tfrecords(.gz), x.tfrecord-00000-of-00004
        return "tfrecord"
    if IDX_NAME.match(path.name):
        return "idx"
    fail(path, "cannot tell the format (expected an IDX folder, a folder of class folders, "
               ".csv, .npz, .tfrecord, a CIFAR-10 archive or a records directory)")


def read_source(path: Path, *, name: str | None = None, resize: tuple[int, int] | None = None,
                tfrecord_keys: tuple[str, str] = ("image", "label"),
                max_pixels: int | None = None) -> RawDataset:
    """Read any supported raw input at ``path`` into a ``RawDataset``; ``max_pixels`` caps
    each encoded picture (image folders, TFRecord) before it is decoded (default
    ``core.limits.MAX_PIXELS``)."""
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

        return read_cifar10(path, list(known.KNOWN["cifar10"].class_names), name or "cifar10")
    fail(path, "is already a records directory; nothing to prepare")


def read_known(ds: known.KnownDataset, folder: Path) -> RawDataset:
    """The known dataset ``ds`` from its files in ``folder`` (``known.locate``), checked
    against the published sums first (``known.verify``)."""
    known.verify(ds, folder)
    if ds.format == "cifar":
        from mnistflow.data.formats.cifar import read_cifar10

        return read_cifar10(folder / ds.files[0].name, list(ds.class_names), ds.name)
    if ds.format == "emnist":
        from mnistflow.data.formats.emnist import read_emnist

        return read_emnist(ds, folder)
    files = [folder / f.name for f in ds.files]
    return idx_dataset(ds.name, *files, ds.names, files)
