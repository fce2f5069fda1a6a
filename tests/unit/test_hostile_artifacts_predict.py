"""``predict`` on hostile pictures (issue 19, HOSTILE-INPUTS.md D9, the predict part): a
decompression bomb is refused from its header, before decoding, in one ``MnistflowError``
(no raw ``DecompressionBombWarning`` line), above Pillow's own hard limit too."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers.images import bomb_png

from mnistflow.artifacts.model_file import ModelInfo, save_model
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
    (res,) = predict(model_file, [path], max_pixels=10_000, mnist_style=True)
    assert res["image"] == str(path) and abs(sum(res["probabilities"]) - 1) < 1e-3


def test_unreadable_and_missing_pictures_are_one_error(model_file, tmp_path):
    (tmp_path / "x.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    with pytest.raises(MnistflowError, match="x.png: not a readable"):
        predict(model_file, [tmp_path / "x.png"])
    with pytest.raises(MnistflowError, match="no such file"):
        predict(model_file, [tmp_path / "missing.png"])
