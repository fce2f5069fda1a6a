"""Records from synthetic digits: written once, opened, and learnable (the unit tier's data)."""
from __future__ import annotations

import numpy as np

from mnistflow.data.records import open_records


def test_synthetic_records_open_with_the_split_sizes_and_classes(synthetic_records):
    rec = open_records(synthetic_records)
    assert rec.num_classes == 10
    assert (rec.size("train"), rec.size("val"), rec.size("test")) == (600, 100, 200)
    x, y = rec.split("train")
    # balanced, and the images are not blank: each class has its own pattern
    assert np.bincount(y, minlength=10).min() > 40
    assert x.reshape(600, -1).std(axis=1).min() > 10


def test_records_give_their_image_shape_both_ways(tmp_path):
    """``shape`` is how the arrays hold an image (H, W, C); ``in_shape`` how a model takes it
    (C, H, W), as ``ModelInfo.in_shape`` says it."""
    import dataclasses

    from helpers.synthetic import raw_dataset
    from mnistflow.artifacts.model_info import info_from_records
    from mnistflow.data.formats.raw import RawSplit
    from mnistflow.data.write_records import write_records

    raw = raw_dataset(60, 20)
    x = np.random.default_rng(0).integers(0, 256, (60, 4, 6, 3), dtype=np.uint8)  # 4 high, 6 wide, RGB
    colour = dataclasses.replace(raw, train=RawSplit(x, raw.train.y), test=None)
    rec = open_records(write_records(colour, tmp_path / "r", key="k", options={}, source_checksums={},
                                     val_size=10))
    assert rec.shape == (4, 6, 3) and rec.in_shape == (3, 4, 6)
    assert info_from_records("mlp", rec).in_shape == [3, 4, 6]
