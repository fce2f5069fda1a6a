"""Known datasets: files, published checksums, mirrors and class names."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RemoteFile:
    name: str
    md5: str  # md5 of the file as published (the .gz / .tar.gz)
    raw_md5: str | None = None  # md5 of the uncompressed content, when known


@dataclass(frozen=True)
class KnownDataset:
    name: str
    format: str  # "idx" or "cifar"
    files: tuple[RemoteFile, ...]
    mirrors: tuple[str, ...]
    class_names: tuple[str, ...]
    homepage: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)


DIGITS = tuple(str(i) for i in range(10))

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
        mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
        class_names=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                     "Shirt", "Sneaker", "Bag", "Ankle boot"),
        homepage="https://github.com/zalandoresearch/fashion-mnist",
        aliases=("fashion", "fashion_mnist", "fmnist"),
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
        homepage="https://github.com/rois-codh/kmnist",
    ),
    "cifar10": KnownDataset(
        name="cifar10",
        format="cifar",
        files=(RemoteFile("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a"),),
        mirrors=("https://www.cs.toronto.edu/~kriz/",),
        class_names=("airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                     "horse", "ship", "truck"),
        homepage="https://www.cs.toronto.edu/~kriz/cifar.html",
        aliases=("cifar-10", "cifar"),
    ),
}


def lookup(name: str) -> KnownDataset | None:
    """The known dataset called ``name`` (or one of its aliases), else None."""
    key = name.lower()
    for ds in KNOWN.values():
        if key == ds.name or key in ds.aliases:
            return ds
    return None
