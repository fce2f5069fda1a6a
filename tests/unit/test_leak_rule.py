"""``MemoryWatch``'s leak rule on series of memory in use (MB) sampled every 4 steps: a steady
leak is reported even when another thread's passing allocations show at a few samples; a
warm-up that levels off, and noise around a flat line, are not."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mnistflow.training.observe import memory
from mnistflow.training.observe.memory import MemoryWatch

STEPS = list(range(4, 49, 4))  # 12 logged steps (the first sample is left out: warm-up)
RNG = np.random.default_rng(0)


def reported(series: list[float], monkeypatch) -> str:
    values = iter(series)
    monkeypatch.setattr(memory, "in_use_mb", lambda device: next(values))
    monkeypatch.setattr(memory, "rss_mb", lambda: 0.0)
    monkeypatch.setattr(memory, "warn", lambda message: None)
    watch = MemoryWatch(torch.device("cpu"))
    for step in STEPS[:len(series)]:
        watch.on_step_end(step, {"loss": 1.0})
    return watch.leak_message


LEAK = [100 + 3.2 * s for s in STEPS]  # 3.2 MB a step: a batch's activations kept each step
SPIKED = [v + (25 if i in (2, 4, 6) else 0) for i, v in enumerate(LEAK)]  # a passing 25 MB at three samples


@pytest.mark.parametrize("series", [LEAK, SPIKED, [100 + 0.08 * s for s in STEPS]], ids=["leak", "spiked", "slow"])
def test_a_steady_leak_is_reported_with_its_rate(series, monkeypatch):
    message = reported(series, monkeypatch)
    assert "memory grows every step" in message and "KB/step" in message


@pytest.mark.parametrize("series", [
    [100, 125, 150, 150, 151, 150, 150, 151, 150, 150, 151, 150],  # warm-up, then level
    list(150 + RNG.uniform(-5, 5, 12)),                            # noise around a flat line
    [150] * 11 + [180],                                            # one passing allocation at the end
], ids=["warm-up", "noise", "last-spike"])
def test_no_leak_is_reported_where_memory_levels_off(series, monkeypatch):
    assert reported(series, monkeypatch) == ""
