"""Data in memory as records (``data.memory``, ``open.training_data``, ``open_data``): numpy
arrays, tensors, a Dataset or a DataLoader become one record set in the cache, named by its
content; wrong shapes or types are one line naming the problem (synthetic digits, no MNIST)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset, TensorDataset

from helpers.synthetic import digits
from mnistflow.core.errors import MnistflowError
from mnistflow.data import memory, open_data
from mnistflow.data.open import training_data
from mnistflow.data.records import open_records


@pytest.fixture(scope="module")
def xy():
    return digits(300, seed=1)  # (300, 28, 28, 1) uint8, labels 0..9


def train_records(*args, **kw):
    path, dataset = training_data(*args, **kw)
    assert dataset is None
    return open_records(path)


def as_tensors(x, y):
    """N x 1 x 28 x 28 float tensors in 0..1 (what torchvision's ToTensor gives)."""
    return torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255, torch.from_numpy(y)


# --- what is accepted -----------------------------------------------------------------------

def test_numpy_uint8_n_x_28_x_28_carves_validation_as_prep_does(xy, tmp_path):
    x, y = xy
    rec = train_records((x[..., 0], y))
    assert rec.path.parent.name == "records" and rec.path.name.startswith("in-memory-")
    assert rec.meta["splits"] == {"train": 270, "val": 30}  # a tenth held out; no test split
    assert rec.shape == (28, 28, 1) and rec.class_names == [str(k) for k in range(10)]
    src = tmp_path / "same.npz"  # the same arrays through prep: the same train and val
    np.savez(src, x_train=x[..., 0], y_train=y)
    prepped = open_data(src)
    for split in ("train", "val"):
        assert all((a == b).all() for a, b in zip(rec.split(split), prepped.split(split)))


def test_every_form_of_the_same_data_is_the_same_record_set(xy):
    x, y = xy
    uint8 = train_records((x[..., 0], y)).path
    xt, yt = as_tensors(x, y)
    assert train_records((xt, yt)).path == uint8  # float N x 1 x 28 x 28 in 0..1
    assert train_records((xt * 255, yt)).path == uint8  # floats on the 0..255 scale
    assert train_records((x, list(y))).path == uint8  # N x H x W x C, labels as a list
    assert train_records((torch.from_numpy(x[..., 0]), yt[:, None])).path == uint8  # N x 1 labels
    ds = TensorDataset(xt, yt)
    assert train_records(ds).path == uint8
    assert train_records(DataLoader(ds, batch_size=64)).path == uint8
    assert train_records(Subset(ds, range(300))).path == uint8


def test_the_same_data_again_is_not_written_again(xy):
    x, y = xy
    rec = train_records((x, y))
    stamp = (rec.path / "meta.json").stat().st_mtime_ns
    assert train_records((x.copy(), y.copy())).path == rec.path
    assert (rec.path / "meta.json").stat().st_mtime_ns == stamp
    other = y.copy()
    other[0] = (other[0] + 1) % 10
    assert train_records((x, other)).path != rec.path  # one label changed: other records


class Pictures(Dataset):
    """A torchvision-style Dataset: PIL images and int labels, with class names."""

    classes = [f"{k} - digit" for k in range(10)]

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return Image.fromarray(self.x[i, :, :, 0]), int(self.y[i])


def test_a_dataset_of_pil_images_keeps_its_class_names(xy):
    x, y = xy
    rec = train_records(Pictures(x, y))
    assert rec.class_names == Pictures.classes
    assert train_records(Subset(Pictures(x, y), range(300))).path == rec.path  # through a Subset
    ds = TensorDataset(*as_tensors(x, y))
    ds.classes = Pictures.classes
    assert train_records(DataLoader(ds, batch_size=64)).path == rec.path  # through a DataLoader
    same = train_records((x, y))  # the same images, named by the digits
    assert same.class_names == [str(k) for k in range(10)]
    assert (rec.split("train")[0] == same.split("train")[0]).all()


def test_rgb_images_both_layouts(xy):
    x, y = xy
    rgb = np.repeat(x, 3, axis=3)
    a = train_records((rgb, y))  # N x H x W x 3 numpy
    b = train_records((torch.from_numpy(rgb).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(y)))
    assert a.path == b.path and a.shape == (28, 28, 3)


class Endless(Dataset):
    """Very many images, made on demand: counts how many were asked for."""

    def __init__(self):
        self.asked = 0

    def __len__(self):
        return 10**9

    def __getitem__(self, i):
        self.asked += 1
        return torch.zeros(1, 28, 28), 0


def test_memory_is_bounded_before_a_large_dataset_is_read():
    ds = Endless()
    with pytest.raises(MnistflowError, match=r"^data: the images would take 784,000,000,000 bytes"):
        training_data(ds)
    assert ds.asked == memory.CHUNK  # only the first chunk


class Stream(IterableDataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        return ((torch.from_numpy(a).permute(2, 0, 1), torch.tensor(b)) for a, b in zip(self.x, self.y))


def test_an_iterable_dataset(xy):
    x, y = xy
    assert train_records(Stream(x, y)).path == train_records((x, y)).path


# --- the splits -----------------------------------------------------------------------------

def test_val_and_test_data_are_the_splits(xy):
    x, y = xy
    vx, vy = digits(40, seed=2)
    tx, ty = digits(50, seed=3)
    rec = train_records((x, y), val_data=(vx, vy), test_data=as_tensors(tx, ty))
    assert rec.meta["splits"] == {"train": 300, "val": 40, "test": 50}
    assert (rec.split("val")[0] == vx).all() and (rec.split("test")[1] == ty).all()
    assert (rec.split("train")[0] == x).all()  # every image trained on: nothing carved


def test_a_path_beside_data_in_memory(xy, synthetic_records):
    tx, ty = digits(50, seed=3)
    rec = train_records(synthetic_records, test_data=(tx, ty))  # its train and val, this test split
    assert rec.meta["splits"] == {"train": 600, "val": 100, "test": 50}
    mine = open_records(synthetic_records)
    assert (rec.split("val")[0] == mine.split("val")[0]).all()
    x, y = xy
    rec = train_records((x, y), test_data=synthetic_records)  # a path as test_data: its test split
    assert (rec.split("test")[0] == mine.split("test")[0]).all()


def test_a_path_alone_is_the_data_setting_as_before(synthetic_records):
    assert training_data(synthetic_records) == (str(synthetic_records), None)
    assert training_data(open_records(synthetic_records)) == (str(synthetic_records), None)
    assert training_data("mnist", dataset=None) == ("mnist", None)


def test_evaluate_data_is_the_test_split(xy):
    x, y = xy
    rec = open_data((x, y))
    assert rec.meta["splits"] == {"train": 300, "val": 0, "test": 300}
    assert (rec.split("test")[0] == x).all()


def test_a_float_scale_is_told_once_for_a_dataset():
    dark = torch.full((memory.CHUNK, 1, 4, 4), 0.5)
    bright = torch.full((8, 1, 4, 4), 200.0)
    ds = TensorDataset(torch.cat([dark, bright]), torch.zeros(memory.CHUNK + 8, dtype=torch.long))
    with pytest.raises(MnistflowError, match=rf"^data: image {memory.CHUNK} holds a value of 200, but "
                                             "the images before it are on the 0..1 scale"):
        training_data(ds)


# --- the refusals: one line naming the problem ----------------------------------------------

X = np.zeros((6, 28, 28), np.uint8)
Y = np.zeros(6, np.int64)


@pytest.mark.parametrize("data, message", [
    ((X, Y[:5]), "data: x has 3 dimensions (N x H x W) but y has 5 labels for 6 images"),
    ((X.reshape(6, 784), Y), "data: x has shape (6, 784); expected N x H x W, N x H x W x C or "
                             "N x C x H x W with C 1 or 3 (flat images? reshape them: x.reshape(-1, 28, 28))"),
    ((X[..., None].repeat(2, 3), Y), "data: x has shape (6, 28, 28, 2); expected"),
    (X, "data must be a path, an (x, y) pair of numpy arrays or torch tensors, a torch Dataset, or a "
        "DataLoader; got ndarray (x alone? pass (x, y): the images and their labels)"),
    (42, "data must be a path, an (x, y) pair"),
    ((X, Y, Y), "data: a tuple of 3 items; expected (x, y)"),
    (([[0]], Y), "data: x is a list; expected a numpy array or a torch tensor"),
    ((X[:0], Y[:0]), "data: x holds no images"),
    ((X - 1.0, Y), "data: x (float64) holds values -1..-1: negative values are not pixels (normalized"),
    ((X + 300.0, Y), "data: x (float64) holds values 300..300, above 255"),
    ((X.astype(np.int16) - 1, Y), "data: x (int16) holds values -1..-1: negative"),
    ((X + np.nan, Y), "data: x (float64) holds NaN or infinite values"),
    ((X.astype(bool), Y), "data: x has dtype bool; expected uint8 pixels"),
    ((X, Y - 1), "data: y[0] is -1: a label is a class number from 0"),
    ((X, Y + 0.5), "data: y (float64) holds labels that are not whole numbers"),
    ((X, np.zeros((6, 10))), "data: y has shape (6, 10): one-hot labels? pass class numbers (y.argmax(1))"),
    ((X, np.array(["a"] * 6)), "data: y has dtype <U1; expected integer labels"),
    ((X, "labels"), "data: y is a str; expected integer labels"),
    (TensorDataset(torch.zeros(6, 28, 28)), "data: item 0 is a tuple of 1 values; a Dataset must yield "
                                            "(image, label) pairs"),
    ([{"image": 0}] * 2, "data: x is a dict"),
])
def test_bad_data_is_one_line(data, message):
    with pytest.raises(MnistflowError) as e:
        training_data(data)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


class Mixed(Dataset):
    def __len__(self):
        return 3

    def __getitem__(self, i):
        return torch.zeros(1, 28 if i < 2 else 32, 28), i


def test_bad_datasets_and_splits_are_one_line(xy):
    x, y = xy
    with pytest.raises(MnistflowError, match=r"^data: image 2 has shape \(1, 32, 28\) but image 0 has "
                                             r"\(1, 28, 28\): every image must be the same size"):
        training_data(Mixed())
    with pytest.raises(MnistflowError, match=r"^test_data: image 0 has label 12, which no training "
                                             r"image has \(the training data's labels: 0..9\)"):
        training_data((x, y), test_data=(x[:1], [12]))
    with pytest.raises(MnistflowError, match=r"^val_data: images are 14 x 14 x 1 but the training "
                                             r"data's are 28 x 28 x 1"):
        training_data((x, y), val_data=(x[:5, ::2, ::2], y[:5]))
    with pytest.raises(MnistflowError, match=r"^val_data and test_data need the training data"):
        training_data(None, test_data=(x, y))
    with pytest.raises(MnistflowError, match=r"^dataset='mnist' names the files of a known dataset"):
        training_data((x, y), dataset="mnist")
    loader = DataLoader(TensorDataset(torch.zeros(4, 28, 28)), batch_size=2)
    with pytest.raises(MnistflowError, match=r"^data: batch 0 is a list; a DataLoader must yield"):
        training_data(loader)
