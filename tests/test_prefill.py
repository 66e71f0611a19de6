"""Expert-major prefill: any chunk size gives the same greedy tokens, and read amplification is counted.

The prompt is long enough that chunks of 7 and 64 rows split it unevenly; every streamed
generation must match the store held in RAM (prefilled in one chunk). Read amplification
(bytes read while prefilling / bytes of the distinct experts the prompt needed) is 1.0 plus the last token's
re-read when all but the last token are one chunk (the last token is its own pass, as in mlx-lm), and grows
as chunks shrink, because a chunk reads each expert it selects once, but the next chunk reads it again.
"""

from __future__ import annotations

import pytest

from nightshift.engine.errors import NightshiftError
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import open_model
from nightshift.engine.store.manifest import read_manifest
from tests.helpers.stores import PROMPT, QUICK, tokens_and_stats


@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("arch", QUICK)
def test_streamed_prefill_in_chunks_gives_the_tokens_of_the_model_in_ram(arch, chunk, stores, in_ram):
    tokens, stats = tokens_and_stats(stores[arch], chunk, StreamSettings())
    assert tokens == in_ram[arch]
    assert stats.prefill_unique_bytes > 0
    assert stats.prefill_read_amplification >= 1.0
    assert stats.last_landed in {"d0", "d1"}  # the drive that most often held the barrier


def test_one_chunk_reads_each_needed_expert_once_and_small_chunks_read_more(stores):
    store = stores["qwen3_moe"]
    no_cache = StreamSettings(cache_bytes=0)  # what the reads cost when nothing is kept in RAM
    _, whole = tokens_and_stats(store, len(PROMPT), no_cache)
    _, rows = tokens_and_stats(store, 1, no_cache)
    _, cached = tokens_and_stats(store, 1, StreamSettings())  # auto: every expert of this small store fits
    manifest = read_manifest(store)
    last_token = manifest.config["num_experts_per_tok"] * sum(layer.file_bytes for layer in manifest.layers)
    assert whole.prefill_bytes_read == whole.prefill_unique_bytes + last_token  # its top-k per layer, read again
    assert rows.prefill_unique_bytes == whole.prefill_unique_bytes  # same prompt, same experts needed
    assert rows.prefill_read_amplification > 2.0  # row by row: each token re-reads what the last one read
    assert cached.prefill_read_amplification < rows.prefill_read_amplification / 2  # kept, not read again


def test_a_chunk_of_zero_rows_is_refused(stores):
    model = open_model(stores["qwen3_moe"], stream=StreamSettings())
    try:
        with pytest.raises(NightshiftError, match="chunk size 0"):
            list(model.generate_tokens(PROMPT, max_tokens=2, prefill_chunk=0))
    finally:
        model.close()
