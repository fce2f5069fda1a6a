"""``data.picture.prepare``: the one way a picture becomes one of a dataset's images, for
``predict`` and the served page alike. The dataset decides the way (its ``picture`` in the
known-dataset table); the polarity comes from the picture's border; a picture that already is
one of the dataset's images is used as it is; ``as_is`` only resizes."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.images import drawn_digit
from helpers.synthetic import digits
from mnistflow.data import known, picture
from mnistflow.data.picture import STYLES, Target, as_is, prepare

MNIST = Target.of((1, 28, 28), [33.3], "mnist")


def box_of(a: np.ndarray) -> tuple[int, int, int, int]:
    """(top, left, height, width) of the ink (pixels over a tenth of the brightest)."""
    ink = a > 0.1 * a.max()
    rows, cols = np.flatnonzero(ink.any(1)), np.flatnonzero(ink.any(0))
    return rows[0], cols[0], rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1


def mass_centre(a: np.ndarray) -> tuple[float, float]:
    a = a.astype(np.float64)
    iy, ix = np.indices(a.shape)
    return (a * iy).sum() / a.sum(), (a * ix).sum() / a.sum()


def test_every_known_dataset_names_a_style_and_the_model_decides_the_rest():
    assert {ds.picture for ds in known.KNOWN.values()} <= set(STYLES)
    styles = {name: Target.of((1, 28, 28), [33.0], name).style
              for name in ("mnist", "qmnist", "kmnist", "fashion-mnist", "emnist-letters", "EMNIST_digits")}
    assert styles == {"mnist": "mnist", "qmnist": "mnist", "kmnist": "mnist", "fashion-mnist": "fashion",
                      "emnist-letters": "emnist", "EMNIST_digits": "emnist"}
    assert Target.of((3, 32, 32), [125.3, 123.0, 113.9], "cifar10") == Target((3, 32, 32), "resize", True)
    # a dataset mnistflow does not know (a user's folder; "emnist" alone names no split)
    for name in ("my-digits", "emnist", None):
        assert Target.of((1, 28, 28), [33.0], name).style == "mnist"
        assert Target.of((3, 28, 28), [33.0] * 3, name).style == "resize"
    assert not Target.of((1, 28, 28), [200.0], "my-scans").dark_background


def test_a_drawing_is_made_as_mnists_digits_were():
    """Black on white, large, off-centre -> white on black, long side 20, mass at the centre."""
    for digit in (1, 4, 7):
        x, how = prepare(drawn_digit(digit), MNIST)
        assert how == "mnist" and x.shape == (28, 28, 1) and x.dtype == np.uint8
        a = x[..., 0]
        assert a[0].max() == 0 and a[:, 0].max() == 0 and a[:, -1].max() == 0  # a dark border
        _, _, h, w = box_of(a)
        assert max(h, w) in (20, 21), (h, w)
        cy, cx = mass_centre(a)
        assert abs(cy - 14) < 0.75 and abs(cx - 14) < 0.75, (cy, cx)
        # the same drawing in white on black is prepared the same way
        y, _ = prepare(255 - drawn_digit(digit), MNIST)
        assert np.abs(y.astype(int) - x.astype(int)).max() <= 1


def test_an_image_of_the_dataset_is_used_as_it_is():
    x, _ = digits(5, seed=3)  # white on black at the model's size: as the dataset's images are
    for a in x:
        out, how = prepare(a, MNIST)
        assert how == "none" and (out == a).all()
        out, how = prepare(a[..., 0], MNIST)
        assert how == "none" and (out == a).all()
        # the same image in ink-on-paper colours is not one of them: inverted and fitted
        out, how = prepare(255 - a, MNIST)
        assert how == "mnist" and out[0].max() < 64 and out.mean() < 128


def test_each_datasets_geometry():
    # Fashion-MNIST: the long side fills the frame, the box is centred (by its box, not its mass)
    shirt = np.full((300, 200), 255, np.uint8)
    shirt[50:250, 40:120] = 30  # a dark product on white, off-centre
    shirt[50:90, 40:180] = 30
    x, how = prepare(shirt, Target.of((1, 28, 28), [72.9], "fashion-mnist"))
    top, left, h, w = box_of(x[..., 0])
    assert how == "fashion" and h == 28 and top == 0 and abs(left - (28 - w) / 2) <= 0.5
    # EMNIST: the box centred with a 2-pixel border
    x, how = prepare(drawn_digit(7), Target.of((1, 28, 28), [44.0], "emnist-digits"))
    top, left, h, w = box_of(x[..., 0])
    assert how == "emnist" and max(h, w) in (24, 25) and abs(top - (28 - h) / 2) <= 1 and abs(left - (28 - w) / 2) <= 1
    # a photo for a colour model: the whole picture resized, its colours kept
    photo = np.zeros((64, 48, 3), np.uint8)
    photo[..., 0] = 250  # red, a light border: never inverted
    x, how = prepare(photo, Target.of((3, 32, 32), [125.0, 123.0, 114.0], "cifar10"))
    assert how == "resize" and x.shape == (32, 32, 3) and (x[..., 0] >= 249).all() and x[..., 1:].max() == 0


@pytest.mark.parametrize("style", STYLES)
def test_a_style_may_be_forced_and_a_blank_picture_is_blank(style):
    x, how = prepare(drawn_digit(2), MNIST, style)
    assert how == style and x.shape == (28, 28, 1) and x.mean() < 80  # inverted to white on black
    blank, _ = prepare(np.full((50, 40), 255, np.uint8), MNIST, style)
    assert blank.max() == 0


def test_as_is_only_resizes():
    d = drawn_digit(3)
    x = as_is(d, (1, 28, 28))
    assert x.shape == (28, 28, 1) and x[0].min() > 200  # still black on white: not inverted
    a = np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8)
    assert (as_is(a, (1, 28, 28))[..., 0] == a).all()
    assert as_is(a, (3, 28, 28)).shape == (28, 28, 3)
    rgba = np.zeros((40, 40, 4), np.uint8)  # dark ink on a transparent canvas
    rgba[10:30, 18:22, 3] = 255
    y = as_is(rgba, (1, 28, 28))[..., 0]
    assert y[0].min() == 255 and y[14, 14] < 64  # a white background behind the dark ink


def test_the_server_and_predict_share_the_rule():
    """``server.inputs.to_input`` with ``auto`` is ``picture.prepare``."""
    pytest.importorskip("starlette")
    from mnistflow.artifacts.model_info import ModelInfo
    from mnistflow.server.inputs import MODES, to_input

    assert MODES == ("auto", "none", *STYLES)
    info = ModelInfo("softmax", [1, 28, 28], [str(i) for i in range(10)], [33.0], [78.0], dataset="mnist")
    for img in (drawn_digit(5), 255 - drawn_digit(5), digits(1)[0][0, ..., 0]):
        x, how = to_input(img, info)
        y, how2 = picture.prepare(img, MNIST)
        assert how == how2 and (x == y).all()
