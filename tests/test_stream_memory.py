"""Streaming keeps memory near trunk + read buffers + cache budget, on experts 4x that budget.

MLX's own peak (mx.get_peak_memory) during decode is compared with what the design allows:
the resident trunk, the cache budget, and the experts in use at one time (the layer being
computed and the next layer's prefetch: each expert both as read and stacked), plus a
few MB of activations and KV cache. The read buffers are outside MLX (mmap) and fixed.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from nightshift.engine.bench.decode import time_decode
from nightshift.engine.io.drives import Drive
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.store.importer import ImportOptions, import_checkpoint
from nightshift.engine.store.manifest import read_manifest
from nightshift.engine.store.synth import synthesize

MB = 1_000_000
ACTIVATIONS = 8 * MB


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
