"""The known datasets: what each is (files, published checksums, mirrors, class names,
augmentation policy), where its files are, whether they are the published ones, and fetching
them when they are nowhere.

    ds = lookup("fashion-mnist")          # or require(name): an error listing the known ones
    folder = locate(ds, data)             # --data, $MNISTFLOW_DATA, the cache, else a download
    verify(ds, folder)                    # md5 against the published sums

Where a known dataset's files are looked for: ``--data`` (itself, or its ``<name>/`` or shared
``<folder>/`` sub-folder), else ``$MNISTFLOW_DATA`` (the same), else the cache
(``$MNISTFLOW_HOME/raw/<folder>``), else a verified download into the cache (``download``).

EMNIST is published as one zip (``gzip.zip``) holding all six splits; each ``emnist-<split>``
names one of them, and all share the download (``folder``). Its class names come from the
split's mapping file when it is at hand; the table below holds the same names for when it
is not (and for listing).

Torch-free and light (the standard library only): the configuration imports ``HELP``.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import string
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from mnistflow.core import limits
from mnistflow.core.errors import MnistflowError, fail
from mnistflow.core.fsutil import open_regular
from mnistflow.core.paths import home


@dataclass(frozen=True)
class RemoteFile:
    name: str
    md5: str  # md5 of the file as published (the .gz / .tar.gz)
    raw_md5: str | None = None  # md5 of the uncompressed content, when known
    size: int | None = None  # bytes of the file as published (None: not in the table)
    raw_size: int | None = None  # bytes of the uncompressed content (with raw_md5)

    @property
    def max_bytes(self) -> int:
        """The most bytes a copy of it may hold (a download stops there): its published size;
        twice that where a re-compressed .gz is accepted (``raw_md5``: gzip -1 of MNIST's
        images is 1.1 times the published file); ``limits.MAX_DOWNLOAD_BYTES`` for a file the
        table gives no size."""
        if self.size is None:
            return limits.MAX_DOWNLOAD_BYTES
        return 2 * self.size if self.raw_md5 else self.size


@dataclass(frozen=True)
class KnownDataset:
    name: str
    format: str  # "idx" (files: train images, train labels, test images, test labels),
    #              "emnist" (files: the one zip) or "cifar"
    files: tuple[RemoteFile, ...]
    mirrors: tuple[str, ...]
    class_names: tuple[str, ...]
    augment: str  # the augmentation policy ``--augment auto`` uses (data/augment.py)
    # how a picture is made into one of its images (``data.picture.STYLES``): the ink's box
    # scaled and placed as its images were made, or the whole picture resized (photos)
    picture: str = "mnist"
    homepage: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)
    label_values: tuple[int, ...] = ()  # the label of each class name; () is 0..K-1
    folder: str = ""  # where the files live (cache and ``--data`` sub-folder); "" is ``name``
    split: str = ""  # EMNIST: the split's name inside the zip

    @property
    def names(self) -> dict[int, str]:
        """{original label value: class name}."""
        values = self.label_values or range(len(self.class_names))
        return dict(zip(values, self.class_names))

    @property
    def home(self) -> str:
        """The folder name of its files (shared by datasets that share a download)."""
        return self.folder or self.name

    @property
    def loose_files(self) -> tuple[str, ...]:
        """EMNIST: the split's own files inside the zip (train images, train labels, test
        images, test labels), which may also be placed in a folder by hand."""
        return tuple(f"emnist-{self.split}-{s}-{k}-ubyte.gz" for s in ("train", "test")
                     for k in ("images-idx3", "labels-idx1"))

    @property
    def mapping(self) -> str:
        """EMNIST's mapping file name ("label ascii_code [ascii_code]" per line)."""
        return f"emnist-{self.split}-mapping.txt"

    def by_hand(self) -> str:
        """The files to fetch by hand and place in a folder when no mirror can be reached."""
        where = self.mirrors[0].rstrip("/") + "/" + self.files[0].name if self.mirrors else self.homepage
        out = f"{', '.join(f.name for f in self.files)} (e.g. {where})"
        if self.format == "emnist":
            out += f", or the zip's {', '.join(self.loose_files)} and {self.mapping}"
        return out


DIGITS = tuple(str(i) for i in range(10))
UPPER = tuple(string.ascii_uppercase)
LOWER = tuple(string.ascii_lowercase)
# bymerge/balanced merge the 15 letters whose cases look alike (c i j k l m o p s u v w x y z)
# into their capital; the 11 others keep a lowercase class.
KEPT_LOWER = tuple("abdefghnqrt")

EMNIST_SPLITS = ("letters", "digits", "balanced", "byclass", "bymerge", "mnist")
EMNIST_ZIP = RemoteFile("gzip.zip", "58c8d27c78d21e728a6bc7b3cc06412e", size=561_753_746)
EMNIST_MIRRORS = ("https://biometrics.nist.gov/cs_links/EMNIST/",
                  "https://www.itl.nist.gov/iaui/vip/cs_links/EMNIST/")
_EMNIST_NAMES: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {
    "letters": (LOWER, tuple(range(1, 27))),  # labels 1..26, shown a..z
    "digits": (DIGITS, ()),
    "mnist": (DIGITS, ()),
    "balanced": (DIGITS + UPPER + KEPT_LOWER, ()),
    "bymerge": (DIGITS + UPPER + KEPT_LOWER, ()),
    "byclass": (DIGITS + UPPER + LOWER, ()),
}


def _emnist(split: str) -> KnownDataset:
    names, values = _EMNIST_NAMES[split]
    return KnownDataset(
        name=f"emnist-{split}", format="emnist", files=(EMNIST_ZIP,), mirrors=EMNIST_MIRRORS,
        class_names=names, augment="glyphs", picture="emnist", label_values=values, folder="emnist",
        split=split,
        homepage="https://www.nist.gov/itl/products-and-services/emnist-dataset",
        aliases=(f"emnist{split}",))

KNOWN: dict[str, KnownDataset] = {
    "mnist": KnownDataset(
        name="mnist",
        format="idx",
        files=(
            RemoteFile("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873",
                       "6bbc9ace898e44ae57da46a324031adb", size=9_912_422, raw_size=47_040_016),
            RemoteFile("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432",
                       "a25bea736e30d166cdddb491f175f624", size=28_881, raw_size=60_008),
            RemoteFile("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3",
                       "2646ac647ad5339dbf082846283269ea", size=1_648_877, raw_size=7_840_016),
            RemoteFile("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c",
                       "27ae3e4e09519cfbb04c329615203637", size=4_542, raw_size=10_008),
        ),
        mirrors=(
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
        ),
        class_names=DIGITS,
        augment="glyphs",
        homepage="http://yann.lecun.com/exdb/mnist/",
    ),
    "fashion-mnist": KnownDataset(
        name="fashion-mnist",
        format="idx",
        files=(
            RemoteFile("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d", size=26_421_880),
            RemoteFile("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe", size=29_515),
            RemoteFile("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79", size=4_422_102),
            RemoteFile("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310", size=5_148),
        ),
        mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
                 "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/"),
        class_names=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                     "Shirt", "Sneaker", "Bag", "Ankle boot"),
        augment="clothing",
        picture="fashion",
        homepage="https://github.com/zalandoresearch/fashion-mnist",
        aliases=("fashion", "fashionmnist", "fmnist"),
    ),
    "kmnist": KnownDataset(
        name="kmnist",
        format="idx",
        files=(
            RemoteFile("train-images-idx3-ubyte.gz", "bdb82020997e1d708af4cf47b453dcf7", size=18_165_135),
            RemoteFile("train-labels-idx1-ubyte.gz", "e144d726b3acfaa3e44228e80efcd344", size=29_497),
            RemoteFile("t10k-images-idx3-ubyte.gz", "5c965bf0a639b31b8f53240b1b52f4d7", size=3_041_136),
            RemoteFile("t10k-labels-idx1-ubyte.gz", "7320c461ea6c1c855c0b718fb2a4b134", size=5_120),
        ),
        mirrors=("http://codh.rois.ac.jp/kmnist/dataset/kmnist/",),
        class_names=("o", "ki", "su", "tsu", "na", "ha", "ma", "ya", "re", "wo"),
        augment="glyphs",
        homepage="https://github.com/rois-codh/kmnist",
        aliases=("kuzushiji-mnist",),
    ),
    "qmnist": KnownDataset(
        name="qmnist",
        format="idx",  # labels: int32 rows (N, 8), column 0 is the digit
        files=(
            RemoteFile("qmnist-train-images-idx3-ubyte.gz", "ed72d4157d28c017586c42bc6afe6370", size=9_704_059),
            RemoteFile("qmnist-train-labels-idx2-int.gz", "0058f8dd561b90ffdd0f734c6a30e5e4", size=463_024),
            RemoteFile("qmnist-test-images-idx3-ubyte.gz", "1394631089c404de565df7b7aeaf9412", size=9_742_279),
            RemoteFile("qmnist-test-labels-idx2-int.gz", "5b5b05890a5e13444e108efe57b788aa", size=526_800),
        ),
        mirrors=("https://raw.githubusercontent.com/facebookresearch/qmnist/master/",
                 "https://github.com/facebookresearch/qmnist/raw/master/"),
        class_names=DIGITS,
        augment="glyphs",
        homepage="https://github.com/facebookresearch/qmnist",
    ),
    "cifar10": KnownDataset(
        name="cifar10",
        format="cifar",
        files=(RemoteFile("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a", size=170_498_071),),
        mirrors=("https://www.cs.toronto.edu/~kriz/",),
        class_names=("airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                     "horse", "ship", "truck"),
        augment="photos",
        picture="resize",
        homepage="https://www.cs.toronto.edu/~kriz/cifar.html",
        aliases=("cifar-10", "cifar"),
    ),
}


KNOWN.update({f"emnist-{s}": _emnist(s) for s in EMNIST_SPLITS})


def lookup(name: str) -> KnownDataset | None:
    """The known dataset called ``name`` (or one of its aliases; case, '_' or '-' alike),
    else None. Plain "emnist" is an error listing its splits: none is a sensible default."""
    key = name.lower().replace("_", "-")
    for ds in KNOWN.values():
        if key == ds.name or key in ds.aliases:
            return ds
    if key == "emnist":
        raise MnistflowError("EMNIST has six splits; name one: "
                             + ", ".join(f"emnist-{s}" for s in EMNIST_SPLITS))
    return None


def require(name: str) -> KnownDataset:
    """The known dataset called ``name``, else the error that lists the known ones."""
    ds = lookup(name)
    if ds is None:
        raise MnistflowError(f"unknown dataset '{name}' (known: {', '.join(sorted(KNOWN))}; "
                             "or pass --data PATH)")
    return ds


def _help() -> str:
    """The known datasets in one line, EMNIST's splits as one entry."""
    single = [n for n, ds in KNOWN.items() if ds.format != "emnist"]
    return ", ".join(single + [f"emnist-<split> ({', '.join(EMNIST_SPLITS)})"])


HELP = _help()  # "mnist, fashion-mnist, kmnist, qmnist, cifar10, emnist-<split> (letters, ...)"


def resolve_input(dataset: str | None, data: Path | None) -> tuple[str | None, Path | None]:
    """(dataset, data) as ``--dataset`` / ``--data`` mean them: a bare known name given as
    ``--data`` (and no such path) is that dataset; a folder holding one known dataset's own
    files, or one of those files, is that dataset in that folder (:func:`owner_of`: EMNIST's
    split files read as ``prep emnist-<split>`` reads them, whatever the path); no input at
    all is ``$MNISTFLOW_DATA``, else MNIST."""
    if dataset is None and data is None:
        env = os.environ.get("MNISTFLOW_DATA")
        if env:
            return None, Path(env)
        return "mnist", None
    if dataset is None and data is not None and not data.exists():
        if len(data.parts) == 1 and lookup(str(data)) is not None:
            return str(data), None
    elif dataset is None and data is not None:
        owner = owner_of(data)
        if owner is not None:
            return owner.name, data if data.is_dir() else data.parent
    return dataset, data


def _own_files(ds: KnownDataset) -> tuple[str, ...]:
    """The file names only ``ds`` uses (each starts with its name: EMNIST's split files,
    QMNIST's), else (): MNIST, Fashion-MNIST and KMNIST share theirs."""
    names = ds.loose_files if ds.format == "emnist" else tuple(f.name for f in ds.files)
    return names if all(n.startswith(ds.name + "-") for n in names) else ()


def owner_of(path: Path) -> KnownDataset | None:
    """The known dataset whose own files (:func:`_own_files`) ``path`` is one of (gzipped or
    not), or, for a folder, holds all of (one dataset only; a folder with several, or
    EMNIST's zip of every split, names none)."""
    if path.is_dir():
        found = [ds for ds in KNOWN.values() if _own_files(ds) and (
            _loose_emnist(ds, path) is not None if ds.format == "emnist"
            else all((path / n).is_file() for n in _own_files(ds)))]
        return found[0] if len(found) == 1 else None
    return next((ds for ds in KNOWN.values()
                 if path.name in _own_files(ds) or path.name + ".gz" in _own_files(ds)), None)


# --- where the files are ---------------------------------------------------------------------

def _loose_emnist(ds: KnownDataset, folder: Path) -> list[Path] | None:
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


def files_in(ds: KnownDataset, folder: Path) -> list[Path] | None:
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


def _candidates(ds: KnownDataset, base: Path) -> list[Path]:
    return list(dict.fromkeys((base / ds.name, base / ds.home, base)))


def locate(ds: KnownDataset, data: Path | None = None, download: bool = True) -> Path:
    """The folder holding the files of ``ds``: in ``data``, else in ``$MNISTFLOW_DATA``
    (itself or its ``<name>/`` or shared ``<folder>/`` sub-folder), else the cache, else a
    verified download into the cache (unless ``download`` is False: an error)."""
    if data is not None:
        for cand in _candidates(ds, data):
            if files_in(ds, cand):
                return cand
        if ds.format == "emnist":
            fail(data, f"missing {ds.name} files: put {ds.by_hand()} here")
        missing = [f.name for f in ds.files if not (data / f.name).is_file()]
        fail(data, f"missing {ds.name} file(s): {', '.join(missing)}")
    env = os.environ.get("MNISTFLOW_DATA")
    if env:
        for cand in _candidates(ds, Path(env)):
            if files_in(ds, cand):
                return cand
    cache = home() / "raw" / ds.home
    if files_in(ds, cache):
        return cache
    if not download:
        fail(cache, f"{ds.name} is not downloaded")
    from mnistflow.data.known.download import fetch  # only when needed: it pulls in urllib

    return fetch(ds, cache)


# --- are they the published files --------------------------------------------------------------

def _md5(f: BinaryIO) -> str:
    """md5 of a binary stream, read in chunks (never the whole file in memory)."""
    h = hashlib.md5()
    for chunk in iter(lambda: f.read(1 << 22), b""):
        h.update(chunk)
    return h.hexdigest()


def md5_of(path: Path) -> str:
    """The md5 of the regular file at ``path``."""
    with open_regular(path) as f:
        return _md5(f)


def matches(path: Path, f: RemoteFile, md5: str | None = None) -> bool:
    """Whether the file at ``path`` is the published ``f``: its md5 (``md5``, when known
    already), or for a re-compressed .gz the md5 of its uncompressed content. A file larger
    than ``f.max_bytes`` is not it (nothing read); a .gz is inflated only when its trailer
    declares the known uncompressed size, and never past that size (a gzip bomb costs nothing)."""
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > f.max_bytes:
            return False
        if (md5 or _md5(fh)) == f.md5:
            return True
        if not (f.raw_md5 and f.raw_size is not None and f.name.endswith(".gz")) or size < 18:
            return False
        fh.seek(-4, os.SEEK_END)  # gzip's ISIZE: the content's length mod 2**32
        if int.from_bytes(fh.read(4), "little") != f.raw_size % (1 << 32):
            return False
        fh.seek(0)
        try:
            with gzip.GzipFile(fileobj=fh, mode="rb") as g:
                return _md5(_Capped(g, f.raw_size)) == f.raw_md5 and g.read(1) == b""
        except (OSError, EOFError, zlib.error):  # not gzip, or damaged: not the file
            return False


class _Capped:
    """The first ``most`` bytes of a stream, read as ``_md5`` reads (no more are inflated)."""

    def __init__(self, f: BinaryIO, most: int):
        self.f, self.left = f, most

    def read(self, n: int) -> bytes:
        chunk = self.f.read(min(n, self.left))
        self.left -= len(chunk)
        return chunk


def verify(ds: KnownDataset, folder: Path) -> None:
    """Check the files of ``ds`` in ``folder`` against the published sums (:func:`matches`).
    EMNIST's separate files have no published sums: their reader checks their structure."""
    for f in ds.files:
        p = folder / f.name
        if ds.format == "emnist" and not p.is_file():
            continue  # the separate files, placed by hand
        with open_regular(p) as fh:
            size = os.fstat(fh.fileno()).st_size
        if size > f.max_bytes:  # not read: a huge file named like the published one
            fail(p, f"{size:,} bytes, over the {f.max_bytes:,} a copy of the published {ds.name} "
                    f"file {f.name} may hold; is this really {ds.name}?")
        got = md5_of(p)
        if not matches(p, f, got):
            fail(p, f"checksum does not match the published {ds.name} file {f.name} "
                    f"(md5 {got}, expected {f.md5}); is this really {ds.name}?")
