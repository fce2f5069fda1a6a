"""The memory measure the hostile-input fuzz tests rely on (``tests/helpers/memory.py``) must
see a blow-up like the ones issue 19 found (hundreds of MB from a few bytes): a test that
cannot fail would prove nothing."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import memory


def test_the_memory_measure_sees_a_blowup():
    """``helpers.memory`` must catch what the defects did (hundreds of MB from a few bytes)."""
    def blow_up():
        a = np.ones(100 * 2**20 // 8)  # 100 MiB, touched
        return float(a[-1])

    out, grew = memory.peak_growth(blow_up)
    assert out == 1.0 and grew >= 95 * 2**20, (memory.METHOD, grew)
    with pytest.raises(AssertionError, match="over the 64.0 MiB bound"):
        memory.assert_bounded(blow_up, 10, "blow_up")
    assert memory.assert_bounded(lambda: 7, 10) == 7
    with pytest.raises(KeyError):  # the call's own exception comes back out
        memory.assert_bounded(lambda: {}["x"], 10)
    assert memory.bound(1 << 20) == 64 * 2**20 + 16 * 2**20
