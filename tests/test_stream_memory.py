"""Streaming keeps memory near trunk + read buffers + cache budget, on experts 4x that budget.

MLX's own peak (mx.get_peak_memory) during decode is compared with what the design allows:
the resident trunk, the cache budget, and the experts in use at one time (the layer being
computed and the next layer's prefetch: each expert both as read and stacked), plus a
few MB of activations and KV cache. The read buffers are outside MLX (mmap) and fixed.

A prompt pass on 16-bit float experts holds each expert once, as read: they run one by one as they land, with
no stack of the pass's experts and no float32 copy of that stack (which set the peak of the prompt pass on the
192-neuron bf16 export: docs/results.md), and its log-probabilities are the in-RAM model's, bit for bit.

A decode step on 16-bit float experts copies none of them into a stack: cached or read, each runs alone on its own
float32 copy, as the product needs it (a stack of the layer's hits and its float32 copy, sized by the hits, were
what MLX's buffer cache could not reuse: a page-fault storm every token on the 192-neuron export).

Between calls a streamed switch holds no expert: its placeholder (replaced by the real experts in every call) is
one element, so an opened store holds its trunk's parameters and nothing more.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from bench.helpers.moe_families import tiny_config, write_checkpoint
from nightshift.engine.bench.decode import time_decode
from nightshift.engine.cpu_prefill import COPY_STEP, use_gemm_prefill
from nightshift.engine.instruments.probes import Instruments
from nightshift.engine.io.drives import Drive
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.prefill import prefill
from nightshift.engine.store.importer import ImportOptions, import_checkpoint
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.manifest import read_manifest
from nightshift.engine.store.synth import synthesize

MB = 1_000_000
ACTIVATIONS = 8 * MB


def bf16_mixtral_store(tmp_path):
    """A store of a tiny bf16 Mixtral: 2 layers of 8 experts of 1.6 MB (256 x 1024 projections)."""
    config = {**tiny_config("mixtral"), "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 2}
    src = write_checkpoint("mixtral", tmp_path / "src", "mlx", config=config, dtype=mx.bfloat16)
    store = tmp_path / "store"
    import_checkpoint(src, store, [Drive("d0", tmp_path / "d0")], ImportOptions(trunk_bits=16))
    return store, config


@pytest.mark.slow
def test_decode_peak_memory_stays_within_trunk_cache_and_the_experts_in_use(tmp_path):
    src = synthesize("kimi_k3", "small", tmp_path / "src", seed=3)
    store = tmp_path / "store"
    import_checkpoint(src, store, [Drive("d0", tmp_path / "d0")], ImportOptions(trunk_bits=8))
    manifest = read_manifest(store)
    budget = manifest.expert_bytes // 4
    k = manifest.config["num_experts_per_token"]
    file_bytes = max(layer.file_bytes for layer in manifest.layers)
    model, _, stream = load_streaming(store, StreamSettings(cache_bytes=budget))
    try:
        mx.synchronize()
        trunk = mx.get_active_memory()
        time_decode(model, 16, at_first_token=mx.reset_peak_memory)
        peak = mx.get_peak_memory()
        pool = stream.reader.files.buffers.bytes
    finally:
        stream.close()
    in_use = 2 * 2 * k * file_bytes  # two layers' experts, each as read and as stacked
    allowed = trunk + budget + in_use + ACTIVATIONS
    print(
        f"experts {manifest.expert_bytes / MB:.0f} MB, cache budget {budget / MB:.0f} MB, trunk {trunk / MB:.0f} MB, "
        f"read buffers {pool / MB:.1f} MB (outside MLX); decode peak {peak / MB:.0f} MB of {allowed / MB:.0f} MB allowed"
    )
    assert manifest.expert_bytes >= 3 * budget
    assert peak <= allowed
    assert peak < trunk + manifest.expert_bytes  # nowhere near every expert in RAM


@pytest.mark.parametrize("rows", [64, 16])
def test_prompt_pass_on_16bit_experts_holds_each_expert_once(rows, tmp_path):
    """`rows` prompt rows through 2 layers of 8 bf16 experts of 1.6 MB (2 a row, every expert used), no cache:
    MLX's peak above the trunk stays within two layers' experts as read (the pass's and the next layer's read
    ahead) plus activations. Stacked and copied to float32 (the code before, measured at 64 rows: 68-73 MB above
    the trunk) it was over twice the 33 MB allowed. 64 rows (128 pairs) run in sorted groups, 16 (32 pairs) one
    expert at a time, as the whole call would sort them or not (cpu_prefill.SORTED_PAIRS)."""
    store, config = bf16_mixtral_store(tmp_path)
    layer = read_manifest(store).layers[0]
    prompt = list(range(1, rows + 1))
    model, _, stream = load_streaming(store, StreamSettings(cache_bytes=0))
    try:
        mx.synchronize()
        before = mx.get_active_memory()
        mx.reset_peak_memory()
        streamed = prefill(model, prompt, make_prompt_cache(model))
        peak = mx.get_peak_memory() - before
    finally:
        stream.close()
    allowed = 2 * config["num_local_experts"] * layer.file_bytes + ACTIVATIONS
    print(f"prompt pass: MLX's peak {peak / MB:.1f} MB above the trunk, {allowed / MB:.1f} MB allowed")
    assert peak <= allowed
    in_ram = load_store(store)[0]
    use_gemm_prefill(in_ram)
    assert mx.array_equal(streamed, prefill(in_ram, prompt, make_prompt_cache(in_ram)))


def test_an_opened_store_holds_its_trunk_and_no_placeholder_experts(tmp_path):
    """After opening the bf16 store (no cache), MLX holds the trunk's parameters within 64 KiB: the six switch
    projections' placeholders, float32 zeros of one expert each before (1 MiB apiece here, 38 MiB on the 192-neuron
    export), take one element each."""
    store, _ = bf16_mixtral_store(tmp_path)
    mx.synchronize()
    before = mx.get_active_memory()
    model, _, stream = load_streaming(store, StreamSettings(cache_bytes=0))
    try:
        mx.synchronize()
        held = mx.get_active_memory() - before
        trunk = sum(value.nbytes for _, value in tree_flatten(model.parameters()))
    finally:
        stream.close()
    print(f"MLX holds {held / MB:.3f} MB after open, the trunk's parameters {trunk / MB:.3f} MB")
    assert held <= trunk + 64 * 1024


def test_a_decode_steps_cached_16bit_experts_run_together_with_the_in_ram_tokens(tmp_path):
    """Half the bf16 store's experts cached: a decode step's cached experts run as one call on the slab, the read
    ones as they land; each used expert's weights are copied to float32 once a call (3 projections of 256 x 1024),
    a call's copies padded to a multiple of COPY_STEP experts (sizes MLX's buffer cache reuses); the greedy tokens
    are the in-RAM model's."""
    store, config = bf16_mixtral_store(tmp_path)
    manifest = read_manifest(store)
    instruments = Instruments(routing=[])
    model, _, stream = load_streaming(
        store, StreamSettings(cache_bytes=manifest.expert_bytes // 2), instruments=instruments
    )
    try:
        streamed = time_decode(model, 12, list(range(1, 9)), instruments=instruments)
        hits = stream.figures().cache_hits
    finally:
        stream.close()
    used = sum(len(experts) for _, experts, _, _ in instruments.routing)  # (layer, expert) pairs the calls ran
    expert = 3 * config["hidden_size"] * config["intermediate_size"] * 4  # one expert's float32 copy
    assert hits > 0 and streamed.counts["stacked_experts"] > 0
    padding = (COPY_STEP - 1) * len(instruments.routing) * expert  # at most, a call's cached experts padded
    assert used * expert <= streamed.counts["float32_copy_bytes"] <= used * expert + padding
    in_ram = load_store(store)[0]
    use_gemm_prefill(in_ram)
    assert time_decode(in_ram, 12, list(range(1, 9))).tokens == streamed.tokens
