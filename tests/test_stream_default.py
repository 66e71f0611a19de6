"""The sparse default model (SmolLM2 MoEfied into the store) streams token-identically to itself in RAM."""

from __future__ import annotations

import pytest

from nightshift.engine.bench.decode import greedy_of_record
from nightshift.engine.moe.settings import StreamSettings

pytestmark = [pytest.mark.slow, pytest.mark.model]


def test_streamed_default_model_matches_the_model_in_ram(sparse_store):
    store, _ = sparse_store
    expected = greedy_of_record(store, None, steps=24)
    assert greedy_of_record(store, StreamSettings(prefetch=True), steps=24) == expected
    assert greedy_of_record(store, StreamSettings(cache_bytes=2_000_000), steps=24) == expected
