"""The one loader on synthetic records: both sources give the same batches through the one
batch transform (augmentation, variants, memory format), and the order is (seed, epoch, rank)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from mnistflow.data.loader import ResidentLoader, StreamLoader, make_loader
from mnistflow.data.normalize import normalize
from mnistflow.data.records import open_records


@pytest.fixture(scope="module")
def rec(synthetic_records):
    return open_records(synthetic_records)


def _both(rec, split="train", **kw):
    return (make_loader(rec, split, resident="yes", **kw), make_loader(rec, split, resident="no", **kw))


def _equal_batches(a, b) -> int:
    ra, rb = list(a), list(b)
    assert len(ra) == len(rb) == len(a) > 0
    for (xa, ya), (xb, yb) in zip(ra, rb):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
    return len(ra)


@pytest.mark.parametrize("augment", ["off", "glyphs"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_resident_and_stream_give_the_same_batches(rec, augment, channels_last):
    a, b = _both(rec, batch_size=64, seed=3, augment=augment, channels_last=channels_last)
    assert isinstance(a, ResidentLoader) and isinstance(b, StreamLoader)
    assert not a.queued and b.queued
    a.set_epoch(2)
    b.set_epoch(2)
    assert _equal_batches(a, b) == 10  # 600 images, batches of 64
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x, _ = next(iter(b))
    assert x.dtype == torch.float32 and x.shape == (64, 1, 28, 28) and x.is_contiguous(memory_format=fmt)


def test_stream_augments_and_resumes_its_augmentation_stream(rec):
    """--augment reaches the stream loader, and a resumed epoch draws what the whole one drew."""
    plain = make_loader(rec, "train", batch_size=100, seed=5, resident="no")
    aug = make_loader(rec, "train", batch_size=100, seed=5, resident="no", augment="glyphs")
    xs_plain = [x for x, _ in plain]
    xs_aug = [x for x, _ in aug]
    assert len(xs_aug) == 6 and all((a - p).abs().mean() > 0.05 for a, p in zip(xs_aug, xs_plain))
    aug.set_epoch(0, start_batch=4)
    rest = [x for x, _ in aug]
    assert len(rest) == 2 and all(torch.equal(a, b) for a, b in zip(xs_aug[4:], rest))


def test_batches_are_the_epoch_order_normalized(rec):
    """What a batch holds: the images of epoch_order's indices, in that order, normalized."""
    from mnistflow.data.loader import epoch_order

    x, y = rec.split("train")
    order = epoch_order(len(y), seed=9, epoch=4).numpy()
    for L in _both(rec, batch_size=128, seed=9):
        L.set_epoch(4)
        xb, yb = next(iter(L))
        idx = order[:128]
        assert yb.tolist() == y[idx].tolist()
        assert torch.equal(xb, normalize(x[idx], rec.mean, rec.std))


def test_both_sources_take_the_variants_in_turn(tmp_path):
    """Augmented copies from prep (--variants): epoch e reads copy e % (K + 1), streamed or not."""
    from helpers.synthetic import raw_dataset
    from mnistflow.data.write_records import write_records

    out = write_records(raw_dataset(240, 40), tmp_path / "v", key="v", options={}, source_checksums={},
                        val_size=40, variants=2)
    rec = open_records(out)
    assert rec.variants == 2
    from mnistflow.data.loader import epoch_order

    for epoch in range(4):
        a, b = _both(rec, batch_size=40, seed=1, train=True)
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        assert _equal_batches(a, b) == 5
        idx = epoch_order(200, seed=1, epoch=epoch).numpy()[:40]
        copy = rec.split("train", epoch % 3)[0]
        a.set_epoch(epoch)
        assert torch.equal(next(iter(a))[0], normalize(copy[idx], rec.mean, rec.std))
        assert not np.array_equal(copy[idx], rec.split("train", (epoch + 1) % 3)[0][idx])


def test_ranks_share_an_evaluation_split_exactly(rec):
    y = rec.split("val")[1]
    seen = []
    for rank in range(3):  # 100 images over 3 ranks: 34 + 33 + 33, none twice
        L = make_loader(rec, "val", batch_size=16, train=False, rank=rank, world_size=3, pad=False,
                        resident="no")
        seen.append(torch.cat([yb for _, yb in L]))
    assert [len(s) for s in seen] == [34, 33, 33]
    assert sorted(torch.cat(seen).tolist()) == sorted(y.tolist())


def test_a_consumer_that_stops_early_ends_the_reader_at_once(rec):
    before = threading.active_count()
    x, y = rec.split("train")
    L = StreamLoader(x, y, batch_size=100, mean=rec.mean, std=rec.std, prefetch=5)
    it = iter(L)
    next(it)
    time.sleep(0.3)  # the reader has read all 6 batches and waits on a full queue to say "done"
    t0 = time.perf_counter()
    it.close()
    assert time.perf_counter() - t0 < 1.0  # it once waited 5 s on the reader's last put
    assert threading.active_count() == before and L.stats.batches == 1 and L.start_batch == 0


def test_bad_batch_size_or_precision_is_a_clear_error_at_the_api_edge(tmp_path):
    """evaluate() is the public edge a batch size or precision reaches unchecked by argparse
    (the loader inside trusts its caller)."""
    from mnistflow.core.errors import MnistflowError
    from mnistflow.inference import evaluate

    for bad in (0, 2.5, "64", True, -1):
        with pytest.raises(MnistflowError, match=r"batch size must be positive \(an integer\), got "):
            evaluate(tmp_path / "no-run", batch_size=bad)
    for bad in ("fp8", "FP32", "", None):
        with pytest.raises(MnistflowError, match=r"--precision .*: expected one of auto, fp32, bf16, fp16"):
            evaluate(tmp_path / "no-run", precision=bad)
    with pytest.raises(MnistflowError, match="no-run"):  # good values: on to the model, which is missing
        evaluate(tmp_path / "no-run", batch_size=np.int64(7), precision="fp32")
