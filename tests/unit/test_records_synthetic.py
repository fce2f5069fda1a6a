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
