"""`synth --experts`: a checkpoint grown by experts per layer keeps the bytes a token reads, so a size ladder
(bench/store_scale.py) compares stores that differ in size alone."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from bench.helpers.reference import PROMPT
from nightshift.engine.errors import NightshiftError
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.store.manifest import read_manifest
from nightshift.engine.store.synth import synthesize
from tests.helpers.stores import import_tiny

STEPS = 8


def decode_reads(store: Path) -> list[int]:
    """Bytes read from the drives for each greedy token after the first, streamed with no cache and no prefetch."""
    model, _, stream = load_streaming(store, StreamSettings(cache_bytes=0, prefetch=False, split_reads=False))
    try:
        read = []
        for _ in generate_step(mx.array(PROMPT), model, max_tokens=STEPS, sampler=lambda x: mx.argmax(x, -1)):
            read.append(stream.figures().bytes_read)
        return [after - before for before, after in pairwise(read)]
    finally:
        stream.close()


@pytest.fixture(scope="module")
def ladder(tmp_path_factory) -> dict[int, Path]:
    """Tiny kimi_k3 stores with 8 (the preset's) and 32 experts per MoE layer, 2 of them active."""
    root = tmp_path_factory.mktemp("synth_scale")
    sources = {n: synthesize("kimi_k3", "tiny", root / f"src{n}", seed=1, experts=n) for n in (8, 32)}
    return {n: import_tiny(root, src, f"store{n}") for n, src in sources.items()}


def test_more_experts_grow_the_store_not_a_tokens_reads(ladder):
    small, large = (read_manifest(ladder[n]) for n in (8, 32))
    assert [layer.num_experts for layer in large.layers] == [32] * len(small.layers)
    assert [layer.file_bytes for layer in large.layers] == [layer.file_bytes for layer in small.layers]
    assert large.expert_bytes == 4 * small.expert_bytes
    per_token = {n: decode_reads(ladder[n]) for n in ladder}
    # One row a step, no cache: each MoE layer reads its k = 2 chosen experts, whatever the number to choose from.
    expected = 2 * sum(layer.file_bytes for layer in small.layers)
    assert per_token[8] == per_token[32] == [expected] * (STEPS - 1)


def test_fewer_experts_than_a_token_uses_is_refused(tmp_path):
    with pytest.raises(NightshiftError, match="--experts must be at least the 2 experts"):
        synthesize("kimi_k3", "tiny", tmp_path / "src", experts=1)
    assert not (tmp_path / "src").exists()
