"""``predict`` a batch at a time (issue 43): IDX files streamed in chunks, pictures decoded a
batch at a time, batches across files, the answers made for a batch at once and written as
they come (table, JSON, JSON lines, CSV), all equal to what one image at a time gives."""
from __future__ import annotations

import csv
import gzip
import io
import json

import numpy as np
import pytest
import torch
from helpers.idx_files import idx_bytes
from helpers.synthetic import digits
from PIL import Image

from mnistflow.artifacts.model_file import save_model
from mnistflow.artifacts.model_info import ModelInfo
from mnistflow.core.errors import MnistflowError
from mnistflow.data import picture
from mnistflow.data.formats.idx import IdxImages, read_idx_images
from mnistflow.data.image_stream import ImageStream
from mnistflow.inference import (Predictions, format_predictions, predict, predict_batches, prediction,
                                 rounded, write_predictions)
from mnistflow.models import create_model

INFO = ModelInfo("softmax", [1, 28, 28], [f"c{i}" for i in range(10)], [33.0], [78.0], dataset="synthetic",
                 label_values=list(range(1, 11)))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("m") / "model.safetensors"
    return save_model(path, create_model("softmax"), INFO)


def test_rounded_is_round_to_6_decimals_for_every_float32():
    r = np.random.default_rng(0)
    p = np.concatenate([r.random(200_000), r.random(20_000) * 1e-5, np.arange(0, 1, 5e-7),  # ties, tiny
                        [0.0, 1.0, 0.5, 5e-7, 1.5e-6, 2.5e-6, 0.9999995]]).astype(np.float32)
    assert rounded(p).tolist() == [round(float(v), 6) for v in p]


def test_a_batch_of_dicts_is_predictions_dicts():
    probs = np.random.default_rng(1).dirichlet(np.ones(10) * 0.1, 50).astype(np.float32)
    names = [f"x[{i}]" for i in range(50)]
    batch = Predictions(names, ["none"] * 50, probs, INFO)
    assert batch.dicts() == [prediction(INFO, p, image=n, preprocess="none") for n, p in zip(names, probs)]
    assert json.dumps(batch.dicts()) == json.dumps([prediction(INFO, p, image=n, preprocess="none")
                                                    for n, p in zip(names, probs)])


def _idx(tmp_path, x, name="a-idx3-ubyte", gz=False, code=0x08):
    data = idx_bytes(x, code)
    path = tmp_path / (name + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(data, 1) if gz else data)
    return path


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("size", [1, 7, 100, 1000])
def test_idx_batches_are_the_file(tmp_path, gz, size):
    x = digits(300)[0][..., 0]
    path = _idx(tmp_path, x, gz=gz)
    stream = IdxImages(path, ranks=(3,))
    assert len(stream) == 300 and stream.shape == (300, 28, 28)
    got = list(stream.batches(size))
    assert [len(b) for b in got] == [min(size, 300 - i) for i in range(0, 300, size)]
    assert np.array_equal(np.concatenate(got), read_idx_images(path, ranks=(3,)))


def test_idx_batches_turn_emnist_upright_and_read_wide_types_as_pixels(tmp_path):
    x = digits(50)[0][..., 0]
    emnist = _idx(tmp_path, x, "emnist-letters-test-images-idx3-ubyte", gz=True)
    assert np.array_equal(np.concatenate(list(IdxImages(emnist).batches(8))), read_idx_images(emnist))
    assert np.array_equal(np.concatenate(list(IdxImages(emnist).batches(8))), x.transpose(0, 2, 1))
    wide = _idx(tmp_path, x, "wide-idx3-ubyte", code=0x0C)
    assert np.concatenate(list(IdxImages(wide).batches(16))).dtype == np.uint8
    bad = _idx(tmp_path, x.astype(np.int32) + 1, "bad-idx3-ubyte", code=0x0C)
    with pytest.raises(MnistflowError, match="outside 0..255"):
        list(IdxImages(bad).batches(16))


def test_a_truncated_or_longer_gzip_fails_where_it_is_found(tmp_path):
    x = digits(100)[0][..., 0]
    data = idx_bytes(x)
    cut = tmp_path / "cut-idx3-ubyte.gz"
    cut.write_bytes(gzip.compress(data[:-500]))
    batches = IdxImages(cut).batches(40)
    assert len(next(batches)) == 40  # the header and the first images are good
    with pytest.raises(MnistflowError, match=r"truncated: header says \(100, 28, 28\)"):
        list(batches)
    longer = tmp_path / "long-idx3-ubyte.gz"
    longer.write_bytes(gzip.compress(data + b"\0" * 5))
    with pytest.raises(MnistflowError, match="5 unexpected trailing bytes"):
        list(IdxImages(longer).batches(40))
    with pytest.raises(MnistflowError, match="expected an IDX image file"):
        IdxImages(_idx(tmp_path, np.zeros(5, np.uint8), "labels-idx1-ubyte"), ranks=(3,))


def test_batches_run_across_files_and_pictures_in_order(tmp_path):
    """A batch takes images from several sources; names, images and ways are those of reading
    each source alone."""
    x = digits(23)[0][..., 0]
    a, b = _idx(tmp_path, x[:10], "a-idx3-ubyte"), _idx(tmp_path, x[10:20], "b-idx3-ubyte", gz=True)
    pngs = []
    for i in (20, 21, 22):
        pngs.append(tmp_path / f"p{i}.png")
        Image.fromarray(255 - x[i]).save(pngs[-1])  # ink on paper: prepared (inverted, fitted)
    target = picture.Target.of((1, 28, 28), [33.0], "mnist")
    paths = [a, pngs[0], b, pngs[1], pngs[2]]
    stream = ImageStream.of_paths(paths, target)
    assert len(stream) == 23 and stream.name_width() == max(len("b-idx3-ubyte.gz[9]"), len(str(pngs[0])))
    got = list(stream.batches(4))
    assert [len(g) for g in got] == [4, 4, 4, 4, 4, 3]
    names = [n for g in got for n in g.names]
    assert names == ([f"a-idx3-ubyte[{i}]" for i in range(10)] + [str(pngs[0])]
                     + [f"b-idx3-ubyte.gz[{i}]" for i in range(10)] + [str(pngs[1]), str(pngs[2])])
    images = np.concatenate([g.images for g in got])
    want = [picture.prepare(picture.read_picture(p), target) for p in pngs]
    assert np.array_equal(images[:10, ..., 0], x[:10]) and np.array_equal(images[11:21, ..., 0], x[10:20])
    assert np.array_equal(images[10], want[0][0]) and np.array_equal(images[21], want[1][0])
    ways = [w for g in got for w in g.preprocess]
    assert ways[:10] == ["none"] * 10 and ways[10] == want[0][1] == "mnist"


def test_a_missing_picture_or_a_bad_idx_header_fails_before_anything_is_read(tmp_path):
    target = picture.Target.of((1, 28, 28), [33.0], "mnist")
    with pytest.raises(MnistflowError, match="no such file"):
        ImageStream.of_paths([_idx(tmp_path, np.zeros((2, 28, 28), np.uint8)), tmp_path / "gone.png"], target)
    (tmp_path / "x-idx3-ubyte").write_bytes(b"\0\0\x08\x03\0\0\0\x02")
    with pytest.raises(MnistflowError, match="truncated IDX header"):
        ImageStream.of_paths([tmp_path / "x-idx3-ubyte"], target)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("imgs")
    x = digits(530, seed=3)[0][..., 0]
    idx = tmp / "t-idx3-ubyte.gz"
    idx.write_bytes(gzip.compress(idx_bytes(x[:525]), 1))
    pngs = []
    for i in range(525, 530):
        pngs.append(tmp / f"d{i}.png")
        Image.fromarray(x[i]).save(pngs[-1])
    return [idx, *pngs], x


def test_predict_in_batches_is_predict_one_at_a_time(model, files):
    paths, x = files
    got = predict(model, paths, batch_size=64)
    assert len(got) == 530 and got == predict(model, paths, batch_size=1000)
    one = predict(model, x[:525, ..., None])
    assert [g["probabilities"] for g in got[:525]] == [o["probabilities"] for o in one]
    assert [g["image"] for g in got[:3]] == ["t-idx3-ubyte.gz[0]", "t-idx3-ubyte.gz[1]", "t-idx3-ubyte.gz[2]"]
    stream = predict_batches(model, paths, batch_size=100)
    probs = np.concatenate([b.probs for b in stream])
    assert probs.shape == (530, 10) and probs.dtype == np.float32
    assert [INFO.label(k) for k in probs.argmax(1)] == [g["label"] for g in got]


@pytest.mark.parametrize("bad, message", [(0, "batch size must be positive"), (2.5, "batch size must be positive"),
                                          (True, "batch size must be positive")])
def test_a_bad_batch_size_is_one_error(model, files, bad, message):
    with pytest.raises(MnistflowError, match=message):
        predict(model, files[0], batch_size=bad)


def test_every_format_writes_what_predict_returns(model, files):
    paths, _ = files
    want = predict(model, paths)

    def written(fmt: str) -> str:
        out = io.StringIO()
        assert write_predictions(predict_batches(model, paths, batch_size=100), fmt, out) == 530
        return out.getvalue()

    assert written("json") == json.dumps(want) + "\n"
    assert [json.loads(line) for line in written("jsonl").splitlines()] == want
    assert written("table") == format_predictions(want) + "\n"
    rows = list(csv.reader(io.StringIO(written("csv"))))
    assert rows[0] == ["image", "preprocess", "label", "name", "index", *(f"p_{v}" for v in range(1, 11))]
    assert len(rows) == 531 and rows[1][:5] == [want[0]["image"], "none", str(want[0]["label"]),
                                                 want[0]["name"], str(want[0]["index"])]
    assert [float(v) for v in rows[-1][5:]] == want[-1]["probabilities"]
    with pytest.raises(MnistflowError, match="--format 'xml': expected one of table, json, jsonl, csv"):
        write_predictions(predict_batches(model, paths), "xml", io.StringIO())


def test_the_batch_keeps_the_largest_tensor_within_the_cache(monkeypatch):
    """``cache_batch``: the L3 cache over the largest tensor of one image's forward pass (the
    input, or a layer's output), within MIN_BATCH..MAX_BATCH; BATCH where the cache is unknown."""
    from mnistflow.artifacts import predictor
    from mnistflow.runtime import cpu

    cnn = create_model("seed-cnn")  # its first convolution's output: 32 x 28 x 28 float32
    info = ModelInfo("seed-cnn", [1, 28, 28], INFO.class_names, [33.0], [78.0])
    amp = predictor.Amp.create("fp32", torch.device("cpu"))
    monkeypatch.setattr(cpu, "l3_bytes", lambda: 32 << 20)
    assert predictor.cache_batch(cnn, info, amp) == (32 << 20) // (32 * 28 * 28 * 4)
    assert predictor.cache_batch(create_model("softmax"), INFO, amp) == predictor.MAX_BATCH
    monkeypatch.setattr(cpu, "l3_bytes", lambda: 1 << 20)
    assert predictor.cache_batch(cnn, info, amp) == predictor.MIN_BATCH
    monkeypatch.setattr(cpu, "l3_bytes", lambda: None)
    assert predictor.TorchBackend(cnn, info).batch_size == predictor.BATCH
    assert predictor.TorchBackend(cnn, info, batch_size=7).batch_size == 7
