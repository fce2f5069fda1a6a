"""``mnistflow.predict``'s arguments (the Python API): one path is one image (never its
characters), a folder is the pictures in it, a list of paths, or a uint8 array (N, H, W, C) at
the model's size (numpy or torch); anything else (a number, a list of numbers, an array of another shape or dtype, a
model that is not a path) is one ``MnistflowError`` saying what is accepted."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import mnistflow
from mnistflow.artifacts.model_file import save_model
from mnistflow.artifacts.model_info import ModelInfo
from mnistflow.core.errors import MnistflowError
from mnistflow.models import create_model

INFO = ModelInfo("softmax", [1, 28, 28], [str(i) for i in range(10)], [33.0], [78.0], dataset="synthetic")


@pytest.fixture
def model_and_images(tmp_path):
    torch.manual_seed(0)
    model = save_model(tmp_path / "model.safetensors", create_model("softmax"), INFO)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (3, 28, 28, 1), dtype=np.uint8)
    for i, a in enumerate(images):
        Image.fromarray(a[:, :, 0]).save(tmp_path / f"d{i}.png")
    return model, tmp_path, images


def test_one_path_is_one_image(model_and_images):
    model, folder, _ = model_and_images
    one = str(folder / "d0.png")
    for images in (one, Path(one), [one]):
        preds = mnistflow.predict(str(model), images)
        assert [p["image"] for p in preds] == [one]
    assert len(mnistflow.predict(model, (folder / f"d{i}.png" for i in range(3)))) == 3


def test_an_array_at_the_models_size_is_a_batch(model_and_images):
    """An array is used as it is: as the same pictures fed with ``as_is`` (noise pictures, whose
    border is as often light as dark, would otherwise be prepared as drawings)."""
    model, folder, images = model_and_images
    from_files = mnistflow.predict(model, [folder / f"d{i}.png" for i in range(3)], as_is=True)
    for arr in (images, torch.from_numpy(images)):
        preds = mnistflow.predict(model, arr)
        assert [p["image"] for p in preds] == ["array[0]", "array[1]", "array[2]"]
        assert [p["probabilities"] for p in preds] == [p["probabilities"] for p in from_files]


ACCEPTED = ("images must be a path (a PNG/JPEG/IDX file or a folder of pictures), a list of paths, or a "
            "uint8 array (N, H, W, C) of images already at the model's size; got ")
SHAPE = "an array of images must be uint8 (N, 28, 28, 1) for this model (pictures at the model's size); got "


@pytest.mark.parametrize("images, message", [
    (5, ACCEPTED + "int"),
    (None, ACCEPTED + "NoneType"),
    (b"d0.png", ACCEPTED + "bytes"),
    ([1, 2], ACCEPTED + "a list with an item of type int"),
    (np.zeros((3, 28, 28), np.uint8), SHAPE + "uint8 (3, 28, 28)"),
    (np.zeros((3, 28, 28, 1), np.float32), SHAPE + "float32 (3, 28, 28, 1)"),
    (np.zeros((0, 28, 28, 1), np.uint8), "no images given"),
    (np.uint8(3), ACCEPTED + "uint8"),
    (np.array(3, np.uint8), SHAPE + "uint8 ()"),
    ([], "no images given"),
])
def test_anything_else_is_one_error_saying_what_is_accepted(model_and_images, images, message):
    model, _, _ = model_and_images
    with pytest.raises(MnistflowError) as e:
        mnistflow.predict(model, images)
    assert str(e.value) == message


def test_a_folder_is_the_pictures_in_it_sorted(model_and_images, tmp_path):
    model, folder, _ = model_and_images
    (folder / "notes.txt").write_text("not a picture")
    (folder / ".hidden.png").write_bytes(b"")
    (folder / "sub").mkdir()
    (folder / "sub" / "d9.png").write_bytes((folder / "d0.png").read_bytes())
    preds = mnistflow.predict(model, folder)
    assert [p["image"] for p in preds] == [str(folder / f"d{i}.png") for i in range(3)]
    both = mnistflow.predict(model, [folder, folder / "d1.png"])
    assert [p["image"] for p in both] == [str(folder / f"d{i}.png") for i in (0, 1, 2, 1)]
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.md").write_text("no pictures here")
    with pytest.raises(MnistflowError) as e:
        mnistflow.predict(model, empty)
    assert str(e.value) == f"{empty}: a folder with no pictures (.png, .jpg, .jpeg, .bmp) in it"


@pytest.mark.parametrize("model", [123, None, 1.5, ["runs/a"]])
def test_a_model_that_is_not_a_path_is_one_error(model_and_images, model):
    _, folder, _ = model_and_images
    with pytest.raises(MnistflowError) as e:
        mnistflow.predict(model, str(folder / "d0.png"))
    assert str(e.value) == ("a model must be given as a path (a run directory or a model file), not "
                            f"{type(model).__name__}")
