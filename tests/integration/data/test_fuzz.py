"""Property: every parser, fed random bytes or a mutated valid file (bit flips, truncation,
appended junk, overwrites, deletions), either parses or raises MnistflowError -- nothing else,
and its peak memory growth stays under ``helpers.memory.bound`` of the input's size (issue 19:
D1, D3, D4, D14 were parsers turning a few bytes into gigabytes)."""
from __future__ import annotations

import gzip
import io
import os
import pickle
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import tfrecord_writer as W
from helpers.memory import assert_bounded
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from helpers.fuzz import FUZZ, mutated
from mnistflow.core.errors import MnistflowError
from mnistflow.data.formats import tfrecord as T
from mnistflow.data.formats.cifar import read_cifar10, safe_unpickle
from mnistflow.data.formats.csv import read_csv
from mnistflow.data.formats.folder import read_image_folder
from mnistflow.data.formats.idx import parse_idx, read_idx, read_idx_pair
from mnistflow.data.formats.npz import read_npz
from mnistflow.data.formats.raw import RawDataset



# --- valid seeds, built once from 3 real digits -----------------------------------------------

@pytest.fixture(scope="module")
def seeds(mnist_dir):
    x, y = read_idx_pair(mnist_dir / "t10k-images-idx3-ubyte.gz", mnist_dir / "t10k-labels-idx1-ubyte.gz")
    x, y = np.array(x[:3]), np.array(y[:3])
    idx_images = b"\x00\x00\x08\x03" + np.array([3, 28, 28], ">u4").tobytes() + x.tobytes()
    idx_labels = b"\x00\x00\x08\x01" + np.array([3], ">u4").tobytes() + y.astype(np.uint8).tobytes()
    csv = "label," + ",".join(f"p{i}" for i in range(784)) + "\n" + "".join(
        f"{lab}," + ",".join(map(str, img.ravel().tolist())) + "\n" for img, lab in zip(x, y))
    npz = {}
    for name, save in (("stored", np.savez), ("deflated", np.savez_compressed)):
        b = io.BytesIO()
        save(b, x_train=x[..., 0], y_train=y, x_test=x[:1, ..., 0], y_test=y[:1])
        npz[name] = b.getvalue()
    png = io.BytesIO()
    Image.fromarray(x[0, ..., 0]).save(png, format="PNG")
    examples = [W.encode_example({"image": img.tobytes(), "label": int(lab), "height": 28,
                                  "width": 28, "depth": 1}) for img, lab in zip(x, y)]
    png_example = W.encode_example({"image": png.getvalue(), "label": 3})
    batch = {b"data": np.random.default_rng(0).integers(0, 256, (2, 3072), dtype=np.uint8),
             b"labels": [1, 7], b"batch_label": b"b"}
    return {"idx_images": idx_images, "idx_labels": idx_labels, "csv": csv.encode(),
            "npz": npz, "png": png.getvalue(), "examples": examples + [png_example],
            "tfrecord": W.frame(examples + [png_example]),
            "pickle": pickle.dumps(batch, protocol=2)}




def inputs(seed: bytes):
    return st.one_of(st.binary(max_size=2048), mutated(seed))


def input_size(*args) -> int:
    """Bytes of input in ``args``: byte strings, and files (folders: the files in them)."""
    n = 0
    for a in args:
        if isinstance(a, (bytes, bytearray)):
            n += len(a)
        elif isinstance(a, os.PathLike):
            p = Path(a)
            files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()] if p.is_dir() else []
            n += sum(f.stat().st_size for f in files)
    return n


def parses_or_fails(fn, *args, **kw):
    """The property itself: a valid result, or MnistflowError, in bounded memory and without
    a raw Python warning; anything else propagates."""
    with warnings.catch_warnings(record=True) as seen:  # a raw warning breaks the one-line rule
        warnings.simplefilter("always")
        try:
            out = assert_bounded(lambda: fn(*args, **kw), input_size(*args), fn.__name__)
        except MnistflowError as e:
            assert str(e)
            return None
        finally:
            assert not seen, [f"{w.category.__name__}: {w.message}" for w in seen]
    if isinstance(out, RawDataset):
        for split in (out.train, out.test):
            if split is not None:
                assert split.x.dtype == np.uint8 and split.x.ndim == 4
                assert split.y.dtype == np.int64 and split.y.shape == (len(split.x),)
                assert split.x.shape[-1] in (1, 3)
                assert ((split.y >= 0) & (split.y < out.num_classes)).all()
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


# --- IDX -----------------------------------------------------------------------------------

def test_idx(seeds, work):
    @FUZZ
    @given(st.data())
    def run(data):
        which = data.draw(st.sampled_from(["idx_images", "idx_labels"]))
        blob = data.draw(inputs(seeds[which]))
        parses_or_fails(parse_idx, blob, "mem")
        (work / "a-idx3-ubyte").write_bytes(blob)
        parses_or_fails(read_idx, work / "a-idx3-ubyte")
        gz = data.draw(st.sampled_from(["gzip-of-mutated", "mutated-gzip"]))
        (work / "a-idx3-ubyte.gz").write_bytes(
            gzip.compress(blob) if gz == "gzip-of-mutated"
            else data.draw(mutated(gzip.compress(seeds[which]))))
        parses_or_fails(read_idx, work / "a-idx3-ubyte.gz")

    run()


# --- CSV -----------------------------------------------------------------------------------

def test_csv(seeds, work):
    @FUZZ
    @given(inputs(seeds["csv"]), st.booleans())
    def run(blob, gz):
        p = work / ("a.csv.gz" if gz else "a.csv")
        p.write_bytes(gzip.compress(blob) if gz else blob)
        parses_or_fails(read_csv, p)

    run()


# --- npz -----------------------------------------------------------------------------------

def test_npz(seeds, work):
    @FUZZ
    @given(st.data())
    def run(data):
        seed = seeds["npz"][data.draw(st.sampled_from(["stored", "deflated"]))]
        (work / "a.npz").write_bytes(data.draw(inputs(seed)))
        parses_or_fails(read_npz, work / "a.npz")

    run()


# --- TFRecord ------------------------------------------------------------------------------

def test_tfrecord_file(seeds, work):
    @FUZZ
    @given(inputs(seeds["tfrecord"]), st.booleans())
    def run(blob, gz):
        p = work / ("a.tfrecord.gz" if gz else "a.tfrecord")
        p.write_bytes(gzip.compress(blob) if gz else blob)
        parses_or_fails(T.read_tfrecord_dataset, p)

    run()


def test_tfrecord_examples(seeds, work):
    """Mutated Examples re-framed with valid CRCs, so that the protobuf decoder sees them."""
    @FUZZ
    @given(st.data())
    def run(data):
        ex = data.draw(st.sampled_from(seeds["examples"]))
        blob = data.draw(inputs(ex))
        parses_or_fails(T.parse_example, blob)
        (work / "b.tfrecord").write_bytes(W.frame([ex, blob]))
        parses_or_fails(T.read_tfrecord_dataset, work / "b.tfrecord")

    run()


# --- CIFAR ---------------------------------------------------------------------------------

def _tar(members: dict[str, bytes]) -> bytes:
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return b.getvalue()


def test_cifar(seeds, work):
    names = [str(i) for i in range(10)]
    good_tar = _tar({"data_batch_1": seeds["pickle"], "test_batch": seeds["pickle"]})

    @FUZZ
    @given(st.data())
    def run(data):
        where = data.draw(st.sampled_from(["archive", "pickle"]))
        if where == "archive":
            blob = data.draw(inputs(good_tar))
        else:
            pk = data.draw(inputs(seeds["pickle"]))
            parses_or_fails(safe_unpickle, pk, "mem")
            blob = _tar({"data_batch_1": pk, "test_batch": seeds["pickle"]})
        (work / "c.tar.gz").write_bytes(blob)
        parses_or_fails(read_cifar10, work / "c.tar.gz", names)

    run()


# --- a PNG in a class folder -------------------------------------------------------------

def test_png_in_class_folder(seeds, work):
    root = work / "imgs"
    (root / "7").mkdir(parents=True)
    (root / "3").mkdir(parents=True)
    (root / "3" / "good.png").write_bytes(seeds["png"])

    @FUZZ
    @given(inputs(seeds["png"]))
    def run(blob):
        (root / "7" / "x.png").write_bytes(blob)
        parses_or_fails(read_image_folder, root)

    run()
