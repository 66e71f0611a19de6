"""The expert cache counts what it holds in RAM: an expert's tensors, a row of a slab (copied out of the 4 KiB-aligned
read buffer), not the padded file it was read from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

from bench.helpers.moe_families import tiny_config, write_checkpoint
from bench.helpers.reference import greedy_tokens
from nightshift.engine.io.drives import Drive
from nightshift.engine.moe.held import held_bytes
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.store.importer import ImportOptions, import_checkpoint
from nightshift.engine.store.manifest import read_manifest

ROOT = Path(__file__).resolve().parents[1]
# The experts of moe128-mixtral ([22]'s trained-routing bench model): 12 neurons on a 576-wide stream, bf16, so each
# 13.8 KB tensor is padded to 16 KiB in its file (49 152 bytes for 41 472 of tensors); the 4-bit import needs 64
# neurons (its group size), each of its 9 small tensors padded to 4 KiB too.
SHAPE = {"hidden_size": 576, "num_hidden_layers": 2, "num_local_experts": 16}
NEURONS = {"bf16": 12, "4bit": 64}


@pytest.fixture(scope="module")
def padded_stores(tmp_path_factory) -> dict[str, Path]:
    """A bf16 store of moe128-mixtral-shaped experts, and its experts quantized to 4 bits."""
    root = tmp_path_factory.mktemp("padded")
    stores = {}
    for name, quantize in (("bf16", False), ("4bit", True)):
        config = {**tiny_config("mixtral"), **SHAPE, "intermediate_size": NEURONS[name]}
        src = write_checkpoint("mixtral", root / f"src-{name}", "mlx", config=config, dtype=mx.bfloat16)
        stores[name] = root / name
        options = ImportOptions(trunk_bits=16, quantize_experts=quantize)
        import_checkpoint(src, stores[name], [Drive("d0", root / f"d0-{name}")], options)
    return stores


@pytest.mark.parametrize("name", ["bf16", "4bit"])
def test_the_cache_counts_the_memory_its_experts_take(padded_stores, name):
    """Filled with 768 experts, the process's MLX memory grows by its slabs (the experts' tensors' bytes and a few
    spare rows) and its RSS by what the cache counted, within 15 %; the files' padding is not held."""
    out = subprocess.run([sys.executable, "-m", "bench.cache_held", str(padded_stores[name]), "--experts", "768"],
                         cwd=ROOT, capture_output=True, text=True, check=True)  # fmt: skip
    f = json.loads(out.stdout)
    assert f["experts"] == 768 and f["counted"] == f["tensor_bytes"]
    assert f["active"] == f["slab_bytes"] <= 1.15 * f["tensor_bytes"]  # the rows, out of the read buffer
    assert abs(f["rss"] - f["counted"]) <= 0.15 * f["counted"], f
    assert f["file_bytes"] >= 1.15 * f["tensor_bytes"]  # had the cache counted files, it would hold this much less


def test_a_streamed_cache_counts_each_expert_as_its_row(padded_stores):
    """After a streamed decode every cached expert is counted as its tensors' bytes and holds a row of a slab, and
    the cache holds more experts than its budget has room for files."""
    store = padded_stores["bf16"]
    manifest = read_manifest(store)
    spec = manifest.layers[0]
    budget = manifest.expert_bytes // 3
    model, _, stream = load_streaming(store, StreamSettings(cache_bytes=budget, warm_start=False, prefetch=False))
    try:
        greedy_tokens(model, 12)
        cache, slabs = stream.residency.cache, stream.residency.slabs
        rows = {key for slab in slabs.by_layout for key in slab.where}
    finally:
        stream.close()
    assert rows == set(cache.keys()) and len(cache) > budget // spec.file_bytes
    assert held_bytes(spec) == sum(slot.nbytes for slot in spec.tensors)
    assert cache.used == len(cache) * held_bytes(spec) == slabs.held_bytes() <= budget
