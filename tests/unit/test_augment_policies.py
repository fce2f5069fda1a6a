"""Augmentation policies (issue 20): what each does to an asymmetric glyph, seeded and the
same from both loaders; ``--augment`` values, old ``true``/``false`` and ``auto``'s choice."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mnistflow.core.errors import MnistflowError
from mnistflow.data import augment as A
from mnistflow.data.loader import make_loader
from mnistflow.data.records import open_records
from mnistflow.training import config as configmod
from mnistflow.training.config import TrainConfig, resolve


def glyph(n: int, channels: int = 1, size: int = 28) -> torch.Tensor:
    """``n`` copies of an 'F': a left stem and two arms to the right, mass in the upper left,
    so a left-right or an up-down mirror moves its centre of mass far across the middle."""
    x = torch.zeros(n, channels, size, size)
    x[:, :, 4:24, 5:9] = 255  # stem
    x[:, :, 4:8, 9:20] = 255  # top arm
    x[:, :, 12:15, 9:16] = 255  # middle arm
    return x


def centre(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) centre of mass of each image, in pixels."""
    m = x.sum(1)  # (N, H, W)
    h, w = m.shape[-2:]
    total = m.sum((1, 2))
    rows = (m.sum(2) * torch.arange(h)).sum(1) / total
    cols = (m.sum(1) * torch.arange(w)).sum(1) / total
    return rows, cols


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- what each policy does --------------------------------------------------------------------

def test_the_glyph_is_asymmetric_both_ways():
    r, c = centre(glyph(1))
    _, cf = centre(glyph(1).flip(3))
    rv, _ = centre(glyph(1).flip(2))
    assert c < 11 and cf > 16 and r < 12.5 and rv > 14.5  # the checks below can tell a mirror


def test_glyphs_never_flip_but_move_and_turn():
    x = glyph(500)
    out = A.augment(x, gen(1), "glyphs")
    rows, cols = centre(out)
    assert (cols < 13).all() and (rows < 14).all()  # never mirrored, either way
    assert cols.std() > 0.5 and rows.std() > 0.5  # shifted
    # rotated: some outputs are not any whole-pixel shift of the glyph (bilinear, turned)
    assert ((out != 0) & (out != 255)).any(dim=(1, 2, 3)).float().mean() > 0.9


def test_clothing_flips_about_half_horizontally_never_vertically():
    x = glyph(2000)
    out = A.augment(x, gen(2), "clothing")
    rows, cols = centre(out)
    flipped = cols > 14
    assert 0.45 < flipped.float().mean() < 0.55
    assert (rows < 14).all()  # never upside down
    assert (cols[~flipped] < 13).all() and (cols[flipped] > 15).all()
    # the crops shift by whole pixels, at most 2: each output is the (mirrored) glyph moved
    for i in range(20):
        base = x[i].flip(2) if flipped[i] else x[i]
        assert any(torch.equal(out[i], _moved(base, dy, dx)) for dy in range(-2, 3) for dx in range(-2, 3))


def _moved(img: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """``img`` (C, H, W) moved by (dy, dx), zeros coming in."""
    out = torch.zeros_like(img)
    h, w = img.shape[-2:]
    out[:, max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
        img[:, max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
    return out


def test_photos_cutout_erases_one_square_per_image():
    """On a constant image crops and flips change nothing: what is left is the cutout, a
    square of at most 8x8 (32 / 4; smaller where it meets the border), the same on all channels."""
    x = torch.full((300, 3, 32, 32), 200.0)
    out = A.augment(x, gen(3), "photos")
    sizes = []
    for img in out:
        erased = img == 0
        assert torch.equal(erased[0], erased[1]) and torch.equal(erased[0], erased[2])
        assert ((img == 0) | (img == 200)).all()
        rows, cols = erased[0].any(1).nonzero().flatten(), erased[0].any(0).nonzero().flatten()
        assert len(rows) and len(cols)  # every image has one
        assert rows.max() - rows.min() + 1 == len(rows) <= 8 and cols.max() - cols.min() + 1 == len(cols) <= 8
        assert erased[0].sum() == len(rows) * len(cols)  # a filled rectangle: the clipped square
        sizes.append((len(rows), len(cols)))
    assert sizes.count((8, 8)) > 100  # most squares lie inside the image


def test_photos_crop_and_flip_the_image():
    x = glyph(1000, channels=3, size=32)
    out = A.augment(x, gen(4), "photos", fill=None)
    _, cols = centre(out)
    assert 0.4 < (cols > 16).float().mean() < 0.6  # mirrored about half the time


def test_cutout_through_the_loader_is_zero_after_normalization(grey_and_colour):
    """The erased square takes the mean: 0 in the normalized batch the model sees."""
    rec = grey_and_colour[3]
    x = next(iter(make_loader(rec, "train", batch_size=64, seed=1, augment="photos")))[0]
    zero = (x == 0).all(1)  # (N, H, W): every channel exactly 0
    per_image = zero.flatten(1).sum(1)
    assert (per_image >= 16).all()  # at least a 4x4 corner of a square: a cutout in each image


def test_shifts_move_by_whole_pixels_only():
    x = glyph(200)
    out = A.augment(x, gen(5), "shifts")
    _, cols = centre(out)
    assert (cols < 13).all()  # no flip
    assert ((out == 0) | (out == 255)).all()  # no rotation or resampling
    assert cols.std() > 0.5


def test_glyphs_is_the_augmentation_runs_had_before_policies():
    """Bitwise the old shift_rotate draws: MNIST runs (best) and their resumes do not change."""
    x = torch.rand(64, 1, 28, 28) * 255
    assert torch.equal(A.augment(x, gen(6), "glyphs"), A.shift_rotate(x, gen(6)))


@pytest.mark.parametrize("policy", list(A.POLICIES))
def test_a_seed_gives_the_same_batch(policy):
    x = torch.rand(32, 3, 32, 32) * 255
    a, b = A.augment(x, gen(7), policy), A.augment(x, gen(7), policy)
    assert torch.equal(a, b)
    assert not torch.equal(a, A.augment(x, gen(8), policy))
    assert not torch.equal(a, x)


@pytest.mark.parametrize("policy", list(A.POLICIES))
def test_skip_draws_what_a_batch_draws(policy):
    g1, g2 = gen(9), gen(9)
    A.augment(torch.zeros(16, 1, 20, 24), g1, policy)
    A.skip(g2, policy, 1, 16, 20, 24)
    assert torch.equal(g1.get_state(), g2.get_state())


@pytest.mark.parametrize("policy", list(A.POLICIES))
def test_tiny_images_do_not_break_a_policy(policy):
    out = A.augment(torch.rand(4, 1, 3, 2) * 255, gen(0), policy)
    assert out.shape == (4, 1, 3, 2)


# --- loaders: resident == stream, resume, seeds --------------------------------------------------

def _records(tmp_path, *, channels: int = 1, size: int = 28, classes: int = 10, name: str = "synthetic",
             n_train: int = 300):
    from helpers.synthetic import digits

    from mnistflow.data.formats.raw import RawDataset, RawSplit
    from mnistflow.data.write_records import write_records

    xtr, ytr = digits(n_train, classes=classes, size=size, channels=channels)
    xte, yte = digits(60, classes=classes, size=size, channels=channels, seed=5)
    raw = RawDataset(name, [str(k) for k in range(classes)], RawSplit(xtr, ytr), RawSplit(xte, yte))
    return write_records(raw, tmp_path / name, key=name, options={}, source_checksums={}, val_size=50)


@pytest.fixture(scope="module")
def grey_and_colour(tmp_path_factory):
    """{channels: records}: synthetic 1-channel 28x28 and 3-channel 32x32 sets."""
    return {c: open_records(_records(tmp_path_factory.mktemp(f"c{c}"), channels=c, size=32 if c == 3 else 28))
            for c in (1, 3)}


@pytest.mark.parametrize("policy, channels", [("glyphs", 1), ("clothing", 1), ("photos", 3), ("shifts", 3)])
def test_resident_and_stream_loaders_give_the_same_augmented_batches(grey_and_colour, policy, channels):
    rec = grey_and_colour[channels]
    kw = dict(batch_size=64, seed=3, augment=policy, channels_last=True)
    a, b = make_loader(rec, "train", resident="yes", **kw), make_loader(rec, "train", resident="no", **kw)
    plain = make_loader(rec, "train", resident="yes", batch_size=64, seed=3)
    for epoch in (0, 1):
        for L in (a, b, plain):
            L.set_epoch(epoch)
        ra, rb, rp = list(a), list(b), list(plain)
        assert len(ra) == len(rb) == 4
        for (xa, ya), (xb, yb), (xp, _) in zip(ra, rb, rp):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
            assert not torch.equal(xa, xp)  # augmented
    # a resume mid-epoch draws what the whole epoch drew from there on
    b.set_epoch(1, start_batch=2)
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(list(b), ra[2:]))


def test_loader_auto_takes_the_records_dataset_policy(tmp_path):
    rec = open_records(_records(tmp_path, name="fashion-mnist"))
    auto = make_loader(rec, "train", batch_size=64, seed=1, augment="auto")
    assert auto.augment == "clothing"
    with pytest.raises(MnistflowError, match="unknown augmentation policy 'True'"):
        make_loader(rec, "train", batch_size=64, augment=True)  # the switch from before policies
    assert make_loader(rec, "train", batch_size=64, augment="off").augment is None
    with pytest.raises(MnistflowError, match="unknown augmentation policy 'sideways'"):
        make_loader(rec, "train", batch_size=64, augment="sideways")


# --- auto, and the setting --------------------------------------------------------------------

@pytest.mark.parametrize("name, policy", [
    ("mnist", "glyphs"), ("kmnist", "glyphs"), ("qmnist", "glyphs"), ("emnist-letters", "glyphs"),
    ("emnist-balanced", "glyphs"), ("fashion-mnist", "clothing"), ("fmnist", "clothing"), ("cifar10", "photos"),
])
def test_auto_is_the_known_datasets_policy(name, policy):
    assert A.resolve_policy("auto", name) == (policy, None)


def test_auto_on_other_inputs_is_shifts_and_says_so():
    policy, why = A.resolve_policy("auto", "my-scans")
    assert policy == "shifts" and A.SAFE_DEFAULT == "shifts"
    assert "'my-scans' is not a known dataset" in why and "shifts" in why and "\n" not in why
    assert A.resolve_policy("clothing", "mnist") == ("clothing", None)  # a named one is itself
    assert A.resolve_policy("off", "mnist") == ("off", None)


def test_every_policy_named_in_the_choices_is_defined():
    from mnistflow.core import choices

    assert choices.AUGMENT[:2] == ("auto", "off") and set(choices.AUGMENT[2:]) == set(A.POLICIES)


def test_augment_setting_values():
    assert TrainConfig().augment == "off"
    assert resolve(flags={"augment": "photos"}).augment == "photos"
    with pytest.raises(MnistflowError) as e:
        resolve(flags={"augment": "sideways"})
    assert "--augment must be one of auto, off, glyphs, elastic, clothing, photos, shifts, got 'sideways'" in str(e.value)
    with pytest.raises(MnistflowError, match="--augment must be text, got True"):
        resolve(flags={"augment": True})  # (the switch before policies: not read any more)


def test_best_takes_the_datasets_policy():
    """fast and seed-cnn do not overfit: augmentation only slows them (measured: recipes.py)."""
    from mnistflow.training.recipes import RECIPES

    assert RECIPES["best"]["augment"] == "auto"
    assert RECIPES["fast"]["augment"] == RECIPES["seed-cnn"]["augment"] == "off"


def test_policy_names_have_one_line_descriptions():
    for p in A.POLICIES.values():
        assert p.what and "\n" not in p.what
    assert np.all([name in configmod.FIELDS["augment"].metadata["help"] for name in A.POLICIES])


# --- test-time views: the mirror first, where the data's class survives it -------------------

@pytest.mark.parametrize("dataset,mirror", [("fashion-mnist", True), ("cifar10", True), ("mnist", False),
                                            ("emnist-letters", False), ("kmnist", False), (None, False),
                                            ("my-folder", False)])
def test_only_data_whose_policy_flips_is_mirrored_at_test_time(dataset, mirror):
    from mnistflow.data.augment import mirror_safe

    assert mirror_safe(dataset) is mirror


@pytest.mark.parametrize("views", [2, 4, 8])
def test_the_views_are_the_image_its_mirror_and_shifts(views):
    from mnistflow.data.augment import TTA_SHIFTS, shifted
    from mnistflow.models.evaluate import tta_logits

    x = torch.arange(2 * 1 * 5 * 5, dtype=torch.float32).view(2, 1, 5, 5)
    seen = []

    def model(t):
        seen.append(t.clone())
        return torch.stack([t.flatten(1)[:, 0], t.flatten(1)[:, -1]], 1)  # depends on the view

    out = tta_logits(model, x, views, mirror=True)
    want = [x, x.flip(3)] + [shifted(x, dy, dx) for dy, dx in TTA_SHIFTS[:views - 1]]
    assert len(seen) == views + 1 and all(torch.equal(a, b) for a, b in zip(seen, want))
    probs = sum(model(v).softmax(1) for v in want) / (views + 1)
    assert torch.allclose(out.exp(), probs, atol=1e-6)
    seen.clear()
    tta_logits(model, x, views)  # glyphs: shifts only, never the mirror
    assert all(torch.equal(a, b) for a, b in zip(seen, [x] + [shifted(x, dy, dx) for dy, dx in TTA_SHIFTS[:views]]))


def test_reports_say_which_views():
    from mnistflow.artifacts.runlog import describe_views

    assert describe_views(8, True) == "mean of 9 views: the image, its mirror and 7 shifts"
    assert describe_views(8, False) == "mean of 9 shifted views"
    assert describe_views(2, True) == "mean of 3 views: the image, its mirror and 1 shift"


def test_elastic_bends_within_its_bound():
    """elastic = glyphs' affine draws plus a smooth field: with a zero field it is glyphs
    exactly; with the largest field every pixel moves by at most ELASTIC_PIXELS more."""
    x = torch.zeros(8, 1, 28, 28)
    x[:, :, 10:18, 13:15] = 255  # a bar
    r = torch.rand(8, 3, generator=gen(3)) * 2 - 1
    zero = torch.zeros(8, 2, A.ELASTIC_POINTS, A.ELASTIC_POINTS)
    assert torch.allclose(A._elastic(x, r, zero), A._rotate_shift(x, r, 2.0, 10.0), atol=1e-3)
    field = torch.rand(8, 2, A.ELASTIC_POINTS, A.ELASTIC_POINTS, generator=gen(4)) * 2 - 1
    bent, straight = A._elastic(x, r, field), A._rotate_shift(x, r, 2.0, 10.0)
    assert (bent - straight).abs().amax() > 50  # it does bend
    # the ink stays within the bound: dilate the unbent ink by the bound, nothing falls outside
    reach = int(A.ELASTIC_PIXELS) + 2  # bicubic overshoot and bilinear spread
    near = torch.nn.functional.max_pool2d((straight > 0).float(), 2 * reach + 1, 1, reach) > 0
    assert (bent[~near] < 1).all()
