"""layers.png's picture of one layer: its most active channels in a grid, or its units in rows."""
from __future__ import annotations

import numpy as np

from mnistflow.reporting.plots import _mosaic


def test_feature_maps_tile_the_most_active_channels_in_order():
    v = np.zeros((20, 3, 3), np.float32)
    for c in range(20):
        v[c] = c  # channel c's activity is c: the 16 most active are 4..19
    m = _mosaic(v, tiles=16)
    assert m.shape == (4 * 4 - 1, 4 * 4 - 1)  # 4 x 4 tiles of 3 x 3, a NaN line between
    assert np.isnan(m[3]).all() and np.isnan(m[:, 3]).all()
    tiles = [m[r * 4, c * 4] for r in range(4) for c in range(4)]
    assert tiles == list(range(4, 20))  # the chosen channels, in the layer's own order


def test_units_in_rows_of_sixteen():
    m = _mosaic(np.arange(40, dtype=np.float32))
    assert m.shape == (3, 16) and m[2, 7] == 39 and np.isnan(m[2, 8:]).all()
    assert _mosaic(np.arange(10, dtype=np.float32)).shape == (1, 10)
    assert _mosaic(np.ones((192, 1, 1), np.float32)).shape == (12, 16)  # 1 x 1 maps are units
