"""``predict`` on hostile pictures (issue 19, HOSTILE-INPUTS.md D9, the predict part): a
decompression bomb is refused from its header, before decoding, in one ``MnistflowError``
(no raw ``DecompressionBombWarning`` line), above Pillow's own hard limit too."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers.images import bomb_png

from mnistflow.artifacts.model_file import save_model
from mnistflow.artifacts.model_info import ModelInfo
from mnistflow.core.errors import MnistflowError
from mnistflow.inference import predict
from mnistflow.models import create_model

INFO = ModelInfo("softmax", [1, 28, 28], [str(i) for i in range(10)], [33.0], [78.0], dataset="synthetic")


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "model.safetensors"
    save_model(path, create_model("softmax", (1, 28, 28), 10), INFO)
    return path


@pytest.mark.parametrize("side", [12000, 50000])  # under and over Pillow's own hard limit
def test_a_bomb_is_refused_before_decoding(model_file, tmp_path, side, monkeypatch):
    from PIL import ImageFile

    path = tmp_path / f"bomb{side}.png"
    path.write_bytes(bomb_png(side, rows=64))
    decoded = []  # Pillow decodes pixel data in ImageFile.load: it must never run for a bomb
    load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: decoded.append(self.size) or load(self))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a raw DecompressionBombWarning would fail the test
        with pytest.raises(MnistflowError) as e:
            predict(model_file, [path])
    assert decoded == []
    msg = str(e.value)
    assert msg.startswith(str(path)) and "pixels" in msg, msg


def test_the_pixel_cap_is_the_callers(model_file, tmp_path):
    from PIL import Image

    path = tmp_path / "d.png"
    img = np.zeros((100, 100), np.uint8)
    img[30:70, 45:55] = 255
    Image.fromarray(img).save(path)
    with pytest.raises(MnistflowError, match="more than the limit of 5,000"):
        predict(model_file, [path], max_pixels=5000)
    (res,) = predict(model_file, [path], max_pixels=10_000)
    assert res["image"] == str(path) and abs(sum(res["probabilities"]) - 1) < 1e-3


def test_unreadable_and_missing_pictures_are_one_error(model_file, tmp_path):
    (tmp_path / "x.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    with pytest.raises(MnistflowError, match="x.png: not a readable"):
        predict(model_file, [tmp_path / "x.png"])
    with pytest.raises(MnistflowError, match="no such file"):
        predict(model_file, [tmp_path / "missing.png"])


# --- sweep 2: IDX files that hold no pixels or no pixel values (D4, D8) --------------------------

def _idx(path, shape, data: bytes = b"", code: int = 0x08):
    import struct

    path.write_bytes(bytes([0, 0, code, len(shape)]) + b"".join(struct.pack(">I", s) for s in shape) + data)
    return path


@pytest.mark.parametrize("how", [{}, {"as_is": True}])
def test_an_idx_file_of_zero_pixel_images_is_one_error(model_file, tmp_path, how):
    """Was 5 made-up predictions, an IndexError (with ``invert=None``) or a ValueError (with
    ``mnist_style``, both gone: a picture is prepared by default, IDX images never)."""
    p = _idx(tmp_path / "zero.idx", (5, 0, 28))
    with pytest.raises(MnistflowError) as e:
        predict(model_file, [p], **how)
    assert str(e.value) == f"{p}: IDX images of shape (5, 0, 28): a side of size 0, so the images hold no pixels"
    with pytest.raises(MnistflowError, match=r"n0\.idx: holds no images \(shape \(0, 28, 28\)\)"):
        predict(model_file, [_idx(tmp_path / "n0.idx", (0, 28, 28))], **how)


def test_a_float_idx_file_follows_preps_pixel_rule(model_file, tmp_path):
    """Float IDX (type 0x0D) pixels are read as prep reads any pixels (``raw.as_pixels``):
    integral values 0..255 as they are; NaN (was a numpy cast warning, then NaN read as 0)
    and 0..1 floats (were read as a near-black picture) are one error, no warning."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (2, 28, 28))
    ref = predict(model_file, [_idx(tmp_path / "u8.idx", x.shape, x.astype(np.uint8).tobytes())])
    got = predict(model_file, [_idx(tmp_path / "f.idx", x.shape, x.astype(">f4").tobytes(), 0x0D)])
    assert [r["probabilities"] for r in got] == [r["probabilities"] for r in ref]
    bad = {"nan.idx": (np.where(x > 9, x, np.nan), 0x0D, r"\(float32\) holds NaN or infinite values"),
           "unit.idx": (x / 255.0, 0x0E, (r"\(float64\) holds non-integer values, not pixels 0\.\.255 "
                                          r"\(0\.\.1 floats\? multiply by 255\)")),
           "wide.idx": (x * 4, 0x0B, r"\(int16\) holds values 0\.\.1020, outside 0\.\.255")}
    for name, (a, code, message) in bad.items():
        p = _idx(tmp_path / name, a.shape, a.astype({0x0D: ">f4", 0x0E: ">f8", 0x0B: ">i2"}[code]).tobytes(), code)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(MnistflowError, match=f"{name}: image data {message}"):
                predict(model_file, [p])


# --- sweep 2, D9: a picture of an extreme aspect ratio costs what a 1024-pixel one does ---------

def _grey_png(w: int, h: int) -> bytes:
    """A black w x h PNG, tiny whatever its size (one zlib stream of zero rows)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = (b"\0" * (w + 1)) * h
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("how", [{}, {"as_is": True}])
def test_an_extreme_aspect_picture_is_shrunk_first_and_memory_stays_bounded(model_file, tmp_path, how):
    """A 15 KB PNG of 16,000,000 x 1 pixels (under the default pixel cap) was LANCZOS-resized
    to 28x28 in one go: Pillow's filter tables grow with the ratio, 1.16 GB peak RSS."""
    from helpers import memory

    p = tmp_path / "wide.png"
    p.write_bytes(_grey_png(16_000_000, 1))
    ok = tmp_path / "ok.png"
    ok.write_bytes(_grey_png(28, 28))
    predict(model_file, [ok], **how)  # warm up: imports, the model's first forward
    (res,) = memory.assert_bounded(lambda: predict(model_file, [p], **how), p.stat().st_size, "wide.png")
    assert res["image"] == str(p)


def test_predict_and_the_server_take_one_shrink_step(monkeypatch):
    """``data.picture.shrink``: box-reduced by a whole factor to 1024 a side; the server's
    upload decoder and ``prepare`` / ``as_is`` (predict's files, IDX items) all call it."""
    from PIL import Image

    from mnistflow.data import picture
    from mnistflow.server.inputs import decode_image

    small = Image.new("L", (1024, 7))
    assert picture.shrink(small) is small
    assert picture.shrink(Image.new("L", (16_000_000, 1))).size == (1024, 1)
    assert picture.shrink(Image.new("RGB", (3000, 10))).size == (1000, 4)
    calls = []
    real = picture.shrink
    monkeypatch.setattr(picture, "shrink", lambda im, *a: calls.append(im.size) or real(im, *a))
    assert decode_image(_grey_png(3000, 10)).shape == (4, 1000)
    target = picture.Target.of((1, 28, 28), [33.0], "mnist")
    out, how = picture.prepare(np.zeros((5, 3000), np.uint8), target)
    assert out.shape == (28, 28, 1) and how == "mnist"
    assert picture.as_is(np.zeros((3000, 7), np.uint8), (1, 28, 28)).shape == (28, 28, 1)
    assert calls == [(3000, 10), (3000, 5), (7, 3000)]
