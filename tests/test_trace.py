"""The barrier trace records, per pass, where each expert came from and what the layer waited on."""

from __future__ import annotations

import json

import pytest

from nightshift.engine.instruments.trace import CACHE, DEMAND, PREFETCH, ExpertRead, Trace
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.store.manifest import read_manifest
from tests.helpers.stores import streamed, tiny_store


@pytest.fixture(scope="module")
def qwen_store(tmp_path_factory):
    return tiny_store(tmp_path_factory, "qwen3_moe")


def test_every_pass_names_drive_times_size_and_the_barrier(qwen_store, tmp_path):
    _, stream = streamed(qwen_store, StreamSettings(trace=True, cache_bytes=10**6, prefetch=True), steps=6)
    passes = stream.trace.passes()
    moe_layers = {layer.layer for layer in stream.manifest.layers}
    per_layer = [sum(p.layer == layer for p in passes) for layer in moe_layers]
    assert len(set(per_layer)) == 1 and per_layer[0] >= 6  # one pass per MoE layer per forward call
    sources = {r.source for p in passes for r in p.reads}
    assert {DEMAND, PREFETCH, CACHE} <= sources
    size = stream.manifest.layers[0].file_bytes
    for p in passes:
        assert p.readback_s > 0
        read = [r for r in p.reads if r.source != CACHE]
        for r in read:
            assert r.drive in stream.manifest.drives and r.nbytes == size and r.end >= r.start
        if read:
            assert p.last.end == max(r.end for r in read)
    summary = stream.trace.summary()
    assert summary["passes"] == len(passes)
    decode = [p for p in passes if p.rows == 1]
    assert 0 < summary["one_row_passes"] == len(decode) < len(passes)  # the prompt's passes are not decode's
    assert summary["one_row_readback_s"] == pytest.approx(sum(p.readback_s for p in decode))
    assert sum(summary["barrier_drive_counts"].values()) == sum(1 for p in passes if p.last is not None)
    out = tmp_path / "trace.jsonl"
    stream.trace.dump_jsonl(out)
    first = json.loads(out.read_text().splitlines()[0])
    assert first["layer"] in moe_layers and "last" in first and "readback_s" in first


def test_cache_hits_cost_no_read_and_the_budget_is_kept(qwen_store):
    manifest = read_manifest(qwen_store)
    budget = manifest.expert_bytes // 2  # room for half of all experts
    _, stream = streamed(qwen_store, StreamSettings(cache_bytes=budget, prefetch=False), steps=6)
    assert stream.residency.cache.used <= budget
    hits = sum(1 for p in stream.trace.passes() for r in p.reads if r.source == CACHE)
    assert hits == stream.residency.cache.hits > 0


def test_barrier_counts_follow_the_ring_as_old_passes_drop_out():
    trace = Trace(keep=2)
    for drive in ("a", "b", "b"):
        record = trace.begin(layer=1)
        record.reads.append(ExpertRead(0, DEMAND, drive, 0.0, 1.0, 4096))
        trace.add(record)
    trace.add(trace.begin(layer=2))  # a pass served from the cache has no barrier; it pushes the first "b" out
    assert trace.barrier_counts() == {"b": 1}
    assert trace.summary()["barrier_drive_counts"] == {"b": 1}
