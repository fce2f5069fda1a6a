"""Hostile-input fuzzing shared by the fuzz tests: the hypothesis settings and the mutation
strategy (bit flips, truncation, appended junk, overwrites, deletions of a valid file)."""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Deterministic in CI; MNISTFLOW_FUZZ_EXAMPLES=5000 runs a longer, random hunt by hand.
_LONG = os.environ.get("MNISTFLOW_FUZZ_EXAMPLES")
FUZZ = settings(max_examples=int(_LONG or 100), deadline=None, database=None, derandomize=not _LONG,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@st.composite
def mutated(draw, seed: bytes, head: int | None = None) -> bytes:
    """``seed`` after 1-4 random edits; with ``head``, half the time only within its first
    ``head`` bytes (where the headers and metadata are)."""
    data = bytearray(seed)
    span = head if head and draw(st.booleans()) else None
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "flip", "truncate", "append", "overwrite", "delete"]))
        n = min(len(data), span or len(data))
        if op == "truncate":
            data = data[:draw(st.integers(0, len(data)))]
        elif op == "append":
            data += draw(st.binary(min_size=1, max_size=64))
        elif n == 0:
            continue
        elif op == "flip":
            i = draw(st.integers(0, n - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "overwrite":
            i = draw(st.integers(0, n - 1))
            chunk = draw(st.binary(min_size=1, max_size=8))
            data[i:i + len(chunk)] = chunk
        else:
            i = draw(st.integers(0, n - 1))
            del data[i:i + draw(st.integers(1, 16))]
    return bytes(data)
