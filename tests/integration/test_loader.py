"""The loaders: order as a pure function of (seed, epoch, rank), normalization, resume, stats."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mnistflow.data.loader import ResidentLoader, StreamLoader, epoch_order, make_loader
from mnistflow.data.records import open_records


def test_epoch_order_is_pure_and_changes_per_epoch():
    a = epoch_order(1000, seed=3, epoch=2)
    assert torch.equal(a, epoch_order(1000, seed=3, epoch=2))
    assert not torch.equal(a, epoch_order(1000, seed=3, epoch=3))
    assert not torch.equal(a, epoch_order(1000, seed=4, epoch=2))
    assert sorted(a.tolist()) == list(range(1000))


def test_ranks_interleave_into_the_single_process_batches():
    full = epoch_order(1000, 0, 1)
    r0 = epoch_order(1000, 0, 1, rank=0, world_size=2)
    r1 = epoch_order(1000, 0, 1, rank=1, world_size=2)
    assert set(r0.tolist()).isdisjoint(r1.tolist())
    B = 64
    for k in range(3):  # global batch k == union of the ranks' k-th half batches
        union = set(r0[k * B // 2:(k + 1) * B // 2].tolist()) | set(r1[k * B // 2:(k + 1) * B // 2].tolist())
        assert union == set(full[k * B:(k + 1) * B].tolist())


def test_resident_loader_on_real_mnist(mnist_records):
    rec = open_records(mnist_records)
    L = make_loader(rec, "train", batch_size=1000, seed=1)
    assert isinstance(L, ResidentLoader) and len(L) == 55
    seen, s, s2, n = [], 0.0, 0.0, 0
    _, y = rec.split("train")
    for xb, yb in L:
        assert xb.dtype == torch.float32 and xb.shape[1:] == (1, 28, 28)
        seen.append(yb)
        s += float(xb.sum())
        s2 += float((xb.double() ** 2).sum())
        n += xb.numel()
    assert n == 55000 * 784
    assert abs(s / n) < 1e-3 and abs(s2 / n - 1) < 1e-3  # normalized with the train mean/std
    # every image exactly once: the label histogram matches the split's
    assert torch.bincount(torch.cat(seen), minlength=10).tolist() == np.bincount(y, minlength=10).tolist()
    assert L.stats.batches == 55 and L.stats.wait_s > 0


def test_short_last_batch_policy(mnist_records):
    rec = open_records(mnist_records)
    keep = make_loader(rec, "val", batch_size=1024, train=False)
    drop = make_loader(rec, "val", batch_size=1024, train=True, drop_last=True)
    assert [len(b[1]) for b in keep][-1] == 5000 - 4 * 1024
    sizes = [len(b[1]) for b in drop]
    assert len(sizes) == 4 and set(sizes) == {1024}


def test_resume_mid_epoch_gives_the_remaining_batches(mnist_records):
    rec = open_records(mnist_records)
    L = make_loader(rec, "train", batch_size=5000, seed=5)
    L.set_epoch(3)
    full = [yb for _, yb in L]
    L.set_epoch(3, start_batch=7)
    rest = [yb for _, yb in L]
    assert len(rest) == len(full) - 7
    assert all(torch.equal(a, b) for a, b in zip(full[7:], rest))


@pytest.mark.parametrize("channels", [1, 3])
def test_resume_mid_epoch_keeps_the_augmentation_stream(channels):
    # Grey images get shift/rotate/zoom, colour ones crop/flip: a resumed epoch must draw the
    # same random numbers for the remaining batches as the uninterrupted one.
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (96, 12, 12, channels), dtype=np.uint8)  # records are NHWC
    L = ResidentLoader(x, np.arange(96) % 10, batch_size=16, mean=[100.0] * channels,
                       std=[50.0] * channels, seed=4,
                       augment="photos" if channels == 3 else "glyphs")
    L.set_epoch(2)
    full = [xb for xb, _ in L]
    L.set_epoch(2, start_batch=4)
    rest = [xb for xb, _ in L]
    assert len(rest) == 2 and all(torch.equal(a, b) for a, b in zip(full[4:], rest))


def test_stream_loader_matches_resident_and_reports_the_queue(mnist_records):
    rec = open_records(mnist_records)
    a = make_loader(rec, "val", batch_size=500, seed=2, resident="yes")
    b = make_loader(rec, "val", batch_size=500, seed=2, resident="no")
    assert isinstance(a, ResidentLoader) and isinstance(b, StreamLoader) and b.queued
    ra, rb = list(a), list(b)
    assert len(ra) == len(rb) == len(a) == 10  # never two empty loaders agreeing
    for (xa, ya), (xb, yb) in zip(ra, rb):  # the same images, labels and order: the same batch
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
    slow = make_loader(rec, "val", batch_size=500, resident="no", delay_s=0.02)
    assert sum(1 for _ in slow) == 10
    assert slow.stats.wait_s >= 0.15  # the consumer waited on the slow reader


def test_stream_loader_augments_like_the_resident_one(mnist_records):
    """The bug this catches: the stream loader once ignored --augment without a word."""
    rec = open_records(mnist_records)
    plain = make_loader(rec, "train", batch_size=512, seed=7, resident="yes")
    a = make_loader(rec, "train", batch_size=512, seed=7, resident="yes", augment="glyphs")
    b = make_loader(rec, "train", batch_size=512, seed=7, resident="no", augment="glyphs")
    for L in (plain, a, b):
        L.set_epoch(1, start_batch=100)  # a resumed epoch: the last 8 batches
    rp, ra, rb = list(plain), list(a), list(b)
    assert len(rp) == len(ra) == len(rb) == 8
    for (xp, yp), (xa, ya), (xb, yb) in zip(rp, ra, rb):
        assert torch.equal(ya, yb) and torch.equal(yp, ya)
        assert torch.equal(xa, xb)  # the same augmentation, whatever the source
        assert (xa - xp).abs().mean() > 0.05  # and it is augmented


def test_augment_keeps_shapes_and_changes_pixels(mnist_records):
    rec = open_records(mnist_records)
    plain = make_loader(rec, "val", batch_size=256, seed=0)
    aug = make_loader(rec, "val", batch_size=256, seed=0, augment="glyphs")
    (xp, yp), (xa, ya) = next(iter(plain)), next(iter(aug))
    assert torch.equal(yp, ya) and xp.shape == xa.shape
    assert (xp - xa).abs().mean() > 0.05
