"""Known datasets: files, published checksums, mirrors, class names and augmentation policy.

EMNIST is published as one zip (``gzip.zip``) holding all six splits; each ``emnist-<split>``
names one of them, and all share the download (``folder``). Its class names come from the
split's mapping file when it is at hand; the table below holds the same names for when it
is not (and for listing).
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field

from mnistflow.core.errors import MnistflowError


@dataclass(frozen=True)
class RemoteFile:
    name: str
    md5: str  # md5 of the file as published (the .gz / .tar.gz)
    raw_md5: str | None = None  # md5 of the uncompressed content, when known


@dataclass(frozen=True)
class KnownDataset:
    name: str
    format: str  # "idx" (files: train images, train labels, test images, test labels),
    #              "emnist" (files: the one zip) or "cifar"
    files: tuple[RemoteFile, ...]
    mirrors: tuple[str, ...]
    class_names: tuple[str, ...]
    augment: str  # the augmentation policy ``--augment auto`` uses (data/augment.py)
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
EMNIST_ZIP = RemoteFile("gzip.zip", "58c8d27c78d21e728a6bc7b3cc06412e")
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
        class_names=names, augment="glyphs", label_values=values, folder="emnist", split=split,
        homepage="https://www.nist.gov/itl/products-and-services/emnist-dataset",
        aliases=(f"emnist{split}",))

KNOWN: dict[str, KnownDataset] = {
    "mnist": KnownDataset(
        name="mnist",
        format="idx",
        files=(
            RemoteFile("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873",
                       "6bbc9ace898e44ae57da46a324031adb"),
            RemoteFile("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432",
                       "a25bea736e30d166cdddb491f175f624"),
            RemoteFile("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3",
                       "2646ac647ad5339dbf082846283269ea"),
            RemoteFile("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c",
                       "27ae3e4e09519cfbb04c329615203637"),
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
            RemoteFile("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
            RemoteFile("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
            RemoteFile("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
            RemoteFile("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"),
        ),
        mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
                 "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/"),
        class_names=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                     "Shirt", "Sneaker", "Bag", "Ankle boot"),
        augment="clothing",
        homepage="https://github.com/zalandoresearch/fashion-mnist",
        aliases=("fashion", "fashionmnist", "fmnist"),
    ),
    "kmnist": KnownDataset(
        name="kmnist",
        format="idx",
        files=(
            RemoteFile("train-images-idx3-ubyte.gz", "bdb82020997e1d708af4cf47b453dcf7"),
            RemoteFile("train-labels-idx1-ubyte.gz", "e144d726b3acfaa3e44228e80efcd344"),
            RemoteFile("t10k-images-idx3-ubyte.gz", "5c965bf0a639b31b8f53240b1b52f4d7"),
            RemoteFile("t10k-labels-idx1-ubyte.gz", "7320c461ea6c1c855c0b718fb2a4b134"),
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
            RemoteFile("qmnist-train-images-idx3-ubyte.gz", "ed72d4157d28c017586c42bc6afe6370"),
            RemoteFile("qmnist-train-labels-idx2-int.gz", "0058f8dd561b90ffdd0f734c6a30e5e4"),
            RemoteFile("qmnist-test-images-idx3-ubyte.gz", "1394631089c404de565df7b7aeaf9412"),
            RemoteFile("qmnist-test-labels-idx2-int.gz", "5b5b05890a5e13444e108efe57b788aa"),
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
        files=(RemoteFile("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a"),),
        mirrors=("https://www.cs.toronto.edu/~kriz/",),
        class_names=("airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                     "horse", "ship", "truck"),
        augment="photos",
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
