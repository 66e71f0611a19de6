"""The expert cache's slab (engine/moe/slab.py): rows hold what was put, an evicted expert's row is not written
before the next `settle`, a chunk made beyond a fallen budget goes and free rows' pages go back, and a streamed 4-bit
model whose cache evicts keeps the tokens of the model in RAM."""

from __future__ import annotations

import sys

import mlx.core as mx
import numpy as np
import pytest

from bench.helpers.moe_families import tiny_config, write_checkpoint
from bench.helpers.reference import greedy_tokens
from nightshift.engine.io.arenas import PAGE
from nightshift.engine.io.drives import Drive
from nightshift.engine.moe.held import held_bytes
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.reads import as_stored, decode
from nightshift.engine.moe.settings import LRFU, StreamSettings
from nightshift.engine.moe.slab import FEWEST_ROWS, Slab, Slabs, spare
from nightshift.engine.store.importer import ImportOptions, import_checkpoint
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.manifest import MoeLayer, read_manifest


@pytest.fixture(scope="module")
def quantized_store(tmp_path_factory):
    """A tiny mixtral checkpoint in bf16, its experts imported as 4-bit with bf16 scales (what people download)."""
    root = tmp_path_factory.mktemp("slab")
    config = {**tiny_config("mixtral"), "num_local_experts": 16, "num_hidden_layers": 3, "intermediate_size": 128}
    config["hidden_size"] = 256  # a row of its widest tensor holds whole pages (16 KiB)
    src = write_checkpoint("mixtral", root / "src", "mlx", config=config, dtype=mx.bfloat16)
    store = root / "store"
    import_checkpoint(src, store, [Drive("d0", root / "d0")], ImportOptions(trunk_bits=16, quantize_experts=True))
    return store


def experts_of(store) -> tuple[list[MoeLayer], dict[tuple[int, int], dict[str, mx.array]]]:
    """The store's layers, and every expert's tensors as the reader decodes them (unsigned integers)."""
    manifest = read_manifest(store)
    experts = {}
    for spec in manifest.layers:
        for expert in range(spec.num_experts):
            with open(manifest.replica_paths(spec.layer, expert)[0][1], "rb") as f:
                experts[spec.layer, expert] = decode(f.read(), spec)
    return manifest.layers, experts


def assert_holds(slab: Slab, experts: dict, key: tuple[int, int]) -> None:
    """The slab's row of `key` is, tensor by tensor and bit for bit, what the reader decoded, in stored dtypes."""
    chunk, row = slab.where[key]
    held = {name: t[row : row + 1] for name, t in slab.chunks[chunk].items()}  # its row, as a stack of one
    for name, want in as_stored(experts[key], slab.spec).items():
        assert held[name].dtype == want.dtype and held[name].shape == (1, *want.shape)
        assert mx.array_equal(held[name][0].view(mx.uint8), want.view(mx.uint8)).item(), (key, name)


def test_every_layer_shares_one_slab_made_at_the_budget(quantized_store):
    specs, experts = experts_of(quantized_store)
    assert {str(t.dtype) for t in as_stored(experts[0, 0], specs[0]).values()} >= {
        "mlx.core.uint32",
        "mlx.core.bfloat16",
    }
    budget_rows = 20
    slabs = Slabs(specs, lambda: budget_rows * held_bytes(specs[0]))
    slab = slabs.layers[specs[0].layer]
    assert all(slabs.layers[spec.layer] is slab for spec in specs)
    for key in list(experts)[:budget_rows]:  # layers mixed, as the cache keeps them
        slabs.put(key, experts[key])
    assert len(slab.chunks) == 1 and slab.rows == budget_rows + spare(budget_rows)
    for key in list(experts)[:budget_rows]:
        assert_holds(slab, experts, key)
    assert slabs.held_bytes() == budget_rows * held_bytes(specs[0]) < slabs.nbytes()


def test_an_evicted_experts_row_is_written_only_after_the_next_settle(quantized_store):
    specs, experts = experts_of(quantized_store)
    keys = list(experts)
    slabs = Slabs(specs, lambda: 4 * held_bytes(specs[0]))
    slab = slabs.layers[specs[0].layer]
    made = 4 + spare(4)
    for key in keys[:made]:  # every row
        slabs.put(key, experts[key])
    queued, row = slab.chunks[0], slab.where[keys[1]]  # what a call queued before the eviction reads
    slabs.drop(keys[1])
    slabs.put(keys[made], experts[keys[made]])  # no free row: a new chunk rather than the retired row
    assert len(slab.chunks) == 2 and slab.where[keys[made]][0] == 1
    for name, want in as_stored(experts[keys[1]], slab.spec).items():  # the queued call still reads expert 1 there
        assert mx.array_equal(queued[name][row[1]].view(mx.uint8), want.view(mx.uint8)).item(), name
    slabs.settle()  # a router read back: nothing queued reads the row now
    for key in keys[made + 1 : made + 1 + FEWEST_ROWS]:  # the new chunk's rows, then the freed one
        slabs.put(key, experts[key])
    assert row in slab.where.values()
    for key in (keys[0], *keys[2 : made + 1 + FEWEST_ROWS]):
        assert_holds(slab, experts, key)


def test_when_the_budget_falls_the_last_chunk_moves_into_the_others_and_goes(quantized_store):
    specs, experts = experts_of(quantized_store)
    keys = list(experts)
    budget = [8 * held_bytes(specs[0])]
    slabs = Slabs(specs, lambda: budget[0])
    slab = slabs.layers[specs[0].layer]
    first = 8 + spare(8)
    for key in keys[:first]:  # the first chunk: made at the budget (and spare rows)
        slabs.put(key, experts[key])
    budget[0] = (first + 10) * held_bytes(specs[0])  # the budget grew (inside a memory limit)
    for key in keys[first : first + 10]:
        slabs.put(key, experts[key])
    assert len(slab.chunks) == 2
    for key in keys[: first + 10 : 2]:  # the budget fell: half evicted, from both chunks
        slabs.drop(key)
    slabs.settle()
    assert len(slab.chunks) == 1 and slab.rows == first
    for key in keys[1 : first + 10 : 2]:
        assert_holds(slab, experts, key)


def test_a_streamed_4bit_model_whose_cache_evicts_keeps_the_tokens_of_the_model_in_ram(quantized_store):
    """A third of the experts cached (`lrfu`): evictions, rows retired and reused; the cached experts of each decode
    step run as one call on the slab; every token as the model held in RAM."""
    manifest = read_manifest(quantized_store)
    spec = manifest.layers[0]
    budget = held_bytes(spec) * sum(layer.num_experts for layer in manifest.layers) // 3
    settings = StreamSettings(cache_bytes=budget, cache_policy=LRFU, warm_start=False, prefetch=False)
    model, _, stream = load_streaming(quantized_store, settings)
    try:
        tokens = greedy_tokens(model, 24)
        figures = stream.figures()
        slabs, cache = stream.residency.slabs, stream.residency.cache
        cached = {key for slab in slabs.by_layout for key in slab.where}
        assert cached == set(cache.keys()) and slabs.held_bytes() == cache.used <= budget
    finally:
        stream.close()
    assert figures.cache_evictions > 0 and figures.cache_hits > 0
    assert tokens == greedy_tokens(load_store(quantized_store)[0], 24)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise's zero-filled pages are Linux's")
def test_when_the_budget_falls_the_free_rows_pages_go_back(quantized_store):
    specs, experts = experts_of(quantized_store)
    keys = list(experts)[:24]
    slabs = Slabs(specs, lambda: 24 * held_bytes(specs[0]))
    slab = slabs.layers[specs[0].layer]
    for key in keys:
        slabs.put(key, experts[key])
    widest = max(range(len(slab.spec.tensors)), key=lambda i: slab.spec.tensors[i].nbytes)
    assert slab.spec.tensors[widest].nbytes >= 2 * PAGE  # a row holds whole pages
    dropped = [slab.where[key] for key in keys[::2]]
    for key in keys[::2]:
        slabs.drop(key)
    slabs.settle()
    slabs.discard_free()
    for chunk, row in dropped:  # the pages inside the row were handed back: they read as zeros
        row_bytes = slab._raw[chunk][widest][row].reshape(-1).view(np.uint8)
        start = -(-row_bytes.ctypes.data // PAGE) * PAGE - row_bytes.ctypes.data  # the row's first whole page
        assert not row_bytes[start : start + PAGE].any()
    for key in keys[1::2]:
        assert_holds(slab, experts, key)
