"""The streaming layer computes exactly what the model held in RAM computes, and survives bad replicas.

Tiny synthetic checkpoints of each family are imported into a two-drive store; the model
opened for streaming (experts read from the drive files on every call, prefetch on) must
pick the same greedy tokens as the store loaded fully into RAM, which the store's own
tests prove equal to mlx-lm on the original checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from bench.helpers.reference import greedy_tokens
from nightshift.engine.bench.layout import replicate_everywhere
from nightshift.engine.errors import NightshiftError
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.reads import ExpertReadError
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.slots import Slots, in_slot_order
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.manifest import read_manifest
from tests.helpers.stores import QUICK, import_tiny, streamed, streamed_tokens, tiny_checkpoint

MORE = ["gpt_oss", "mixtral"]


@pytest.fixture(scope="module")
def in_ram_tokens(stores) -> dict[str, list[int]]:
    return {arch: greedy_tokens(load_store(store)[0]) for arch, store in stores.items()}


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "stacked"])
@pytest.mark.parametrize("arch", QUICK)
def test_streamed_greedy_tokens_equal_the_model_in_ram(arch, overlap, stores, in_ram_tokens):
    # No cache: every decode step reads (a store this small would otherwise become resident, as in RAM).
    tokens, stream = streamed(stores[arch], StreamSettings(prefetch=True, overlap=overlap, cache_bytes=0))
    assert tokens == in_ram_tokens[arch]
    figures = stream.figures()
    assert sum(d.bytes for d in figures.drives.values()) > 0  # the experts did come from the drives
    assert figures.reads.demand_reads > 0
    decode_steps = [p for p in stream.trace.passes() if p.rows == 1]
    # With overlap each decode step's experts ran one by one inside the pass; stacked, all ran after it.
    assert all((p.expert_s > 0) == overlap for p in decode_steps)


@pytest.mark.slow
@pytest.mark.parametrize("arch", MORE)
def test_streamed_tokens_equal_for_gpt_oss_biases_and_mixtral(arch, tmp_path):
    store = import_tiny(tmp_path, tiny_checkpoint(tmp_path, arch), f"{arch}-store")
    assert streamed_tokens(store, StreamSettings())[0] == greedy_tokens(load_store(store)[0])


def test_every_mechanism_on_keeps_tokens_identical(sources, in_ram_tokens, tmp_path):
    store = import_tiny(tmp_path, sources["kimi_k3"], "kimi")
    replicate_everywhere(store)
    settings = StreamSettings(
        shared_pool=True,
        split_reads=True,
        prefetch=True,
        cache_bytes=200_000,
        cache_policy="frequency",
        verify_checksums="always",
        trace=True,
    )
    # Both drives sit on this machine's one disk: call them two devices so halves are split between them.
    tokens, figures = streamed_tokens(store, settings, devices={"d0": 1, "d1": 2})
    assert tokens == in_ram_tokens["kimi_k3"]
    assert figures.reads.split_reads > 0
    assert figures.cache_hits > 0
    assert figures.prefetch_recall > 0


def test_a_bad_replica_falls_back_to_another(sources, in_ram_tokens, tmp_path):
    store = import_tiny(tmp_path, sources["qwen3_moe"], "qwen")
    replicate_everywhere(store)
    manifest = read_manifest(store)
    for layer in manifest.layers:  # drive d0 loses every expert file of every layer (truncated)
        for expert in range(layer.num_experts):
            path = dict(manifest.replica_paths(layer.layer, expert))["d0"]
            path.write_bytes(b"")
    tokens, figures = streamed_tokens(store, StreamSettings(dispatch="first_replica"))
    assert tokens == in_ram_tokens["qwen3_moe"]
    assert figures.reads.fallbacks > 0
    assert figures.drives["d1"].bytes > 0 and figures.drives["d0"].bytes == 0


def test_corrupt_replica_is_caught_by_checksums_and_skipped(sources, in_ram_tokens, tmp_path):
    store = import_tiny(tmp_path, sources["qwen3_moe"], "qwen")
    replicate_everywhere(store)
    manifest = read_manifest(store)
    layer = manifest.layers[0]
    for expert in range(layer.num_experts):
        path = dict(manifest.replica_paths(layer.layer, expert))["d0"]
        data = bytearray(path.read_bytes())
        data[100] ^= 0xFF
        path.write_bytes(bytes(data))
    for mode in ("always", "first"):  # "first": each file hashed once per process, a corrupt one never used
        tokens, figures = streamed_tokens(store, StreamSettings(dispatch="first_replica", verify_checksums=mode))
        assert tokens == in_ram_tokens["qwen3_moe"]
        assert figures.reads.fallbacks > 0
    # "off" reads the corrupt d0 copies as they are: only the checks above stand between them and the model
    assert streamed_tokens(store, StreamSettings(dispatch="first_replica"))[1].reads.fallbacks == 0


def test_an_unknown_checksum_mode_is_refused():
    with pytest.raises(NightshiftError, match="checksum mode 'sometimes'"):
        StreamSettings(verify_checksums="sometimes")


def break_last_layer(store: Path) -> tuple[int, list[tuple[str, Path]]]:
    """Delete every replica of every expert of the store's last MoE layer: (that layer, what was deleted)."""
    manifest = read_manifest(store)
    layer = manifest.layers[-1]
    broken = []
    for expert in range(layer.num_experts):
        for drive, path in manifest.replica_paths(layer.layer, expert):
            path.unlink()
            broken.append((drive, path))
    return layer.layer, broken


def assert_names_the_lost_files(error: ExpertReadError, layer: int, broken: list[tuple[str, Path]]) -> None:
    message = str(error)
    assert f"layer {layer}" in message
    assert any(f"drive {drive}" in message and str(path) in message for drive, path in broken)


def test_no_replica_left_stops_with_an_error_naming_drive_and_file(sources, tmp_path):
    store = import_tiny(tmp_path, sources["deepseek_v3"], "deepseek")
    layer, broken = break_last_layer(store)
    with pytest.raises(ExpertReadError) as caught:
        streamed_tokens(store, StreamSettings(), steps=4)
    assert_names_the_lost_files(caught.value, layer, broken)


def test_a_lost_expert_stops_an_overlapped_decode_step_too(sources, tmp_path):
    """A one-token prompt makes the very first pass a one-row one: experts run as they land (overlap)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    store = import_tiny(tmp_path, sources["deepseek_v3"], "deepseek")
    layer, broken = break_last_layer(store)
    model, _, stream = load_streaming(store, StreamSettings(overlap=True))
    try:
        with pytest.raises(ExpertReadError) as caught:
            list(generate_step(mx.array([5]), model, max_tokens=2))
        assert all(p.rows == 1 for p in stream.trace.passes())
    finally:
        stream.close()
    assert_names_the_lost_files(caught.value, layer, broken)


def test_overlap_counts_only_experts_run_while_reads_were_landing(stores):
    """Once every expert is in the RAM cache nothing is read: experts still run one by one, none overlapped."""
    store = stores["qwen3_moe"]
    model, _, stream = load_streaming(store, StreamSettings(overlap=True, prefetch=False, cache_bytes=10**9))
    try:
        greedy_tokens(model, 24)
    finally:
        stream.close()
    all_cached = [p for p in stream.trace.passes() if p.rows == 1 and all(r.source == "cache" for r in p.reads)]
    assert all_cached, "the cache should hold every expert of some decode steps"
    assert all(p.overlapped == 0 and p.expert_s > 0 for p in all_cached)
    assert stream.figures().calls.overlapped == sum(p.overlapped for p in stream.trace.passes())


def test_open_model_streams_a_store_with_live_drive_figures_and_cancels(stores):
    import threading

    from nightshift.engine.moe.settings import StreamSettings as PublicSettings
    from nightshift.engine.runtime import open_model

    model = open_model(stores["qwen3_moe"], stream=PublicSettings())
    cancel = threading.Event()
    chunks = []
    try:
        for chunk in model.generate([{"role": "user", "content": "Close the month."}], max_tokens=20, cancel=cancel):
            chunks.append(chunk)
            if len(chunks) == 3:
                cancel.set()
    finally:
        model.close()
    assert len(chunks) == 3 and chunks[-1].stats.finish_reason == "cancelled"
    assert sum(chunks[-1].stats.drive_bytes.values()) > 0


def test_outputs_in_any_landing_order_go_back_to_each_rows_slot_order():
    """Row 0 selects expert 5 twice (as longcat_flash's zero experts do); the experts land out of order, two of
    them as one stacked block. Each output is tagged 100 * expert + 10 * row + its turn among the expert's slots."""
    host = np.array([[[5, 2, 5]], [[7, 2, 5]]], dtype=np.uint32)  # (rows, positions, k)
    unique = [2, 5, 7]
    slots = Slots.of(host)
    assert [slots.picked(place).tolist() for place in range(3)] == [[0, 1], [0, 0, 1], [1]]  # rows, in slot order
    assert slots.once == [True, False, False]

    def tags(place: int) -> mx.array:
        rows = slots.picked(place)
        return mx.array([[100 * unique[place] + 10 * int(row) + turn] * 2 for turn, row in enumerate(rows)])

    blocks = [([2], tags(2)), ([0, 1], mx.concatenate([tags(0), tags(1)]))]
    out = in_slot_order(blocks, slots, host.shape)
    assert out.shape == (2, 1, 3, 2)
    assert out[..., 0].tolist() == [[[500, 200, 501]], [[710, 211, 512]]]


@pytest.mark.parametrize("shape", [(1, 1, 8), (1, 1, 16), (3, 1, 4), (2, 2, 3), (4, 1, 6)])
def test_slots_put_any_routing_back_in_slot_order(shape: tuple[int, ...]):
    """Random routings, repeats within a row included (experts drawn from few), blocks in a random order and grouping:
    every slot gets its own expert's output for its row and its turn; `once` says every row chose it, once."""
    rng = np.random.default_rng(sum(shape))
    for trial in range(20):
        host = rng.integers(0, 3 if trial % 2 else 40, size=shape).astype(np.uint32)
        if trial % 4 == 0:  # distinct experts, the decode step's usual case
            host = rng.permutation(40)[: host.size].reshape(shape).astype(np.uint32)
        unique = sorted(set(host.reshape(-1).tolist()))
        slots = Slots.of(host)
        rows = host.size // shape[-1]
        per_row = host.reshape(rows, -1)
        assert slots.once == [all(list(row).count(e) == 1 for row in per_row) for e in unique]
        places = rng.permutation(len(unique)).tolist()
        cuts = sorted(rng.choice(range(1, len(unique)), size=min(2, len(unique) - 1), replace=False).tolist())
        blocks = []
        for group in np.split(np.array(places), cuts):
            tagged = [[100 * unique[p] + 10 * int(r) + turn] for p in group for turn, r in enumerate(slots.picked(p))]
            blocks.append((group.tolist(), mx.array(tagged)))
        out = np.array(in_slot_order(blocks, slots, shape))[..., 0].reshape(-1)
        flat = host.reshape(-1)
        expected = [100 * int(e) + 10 * (i // shape[-1]) + int(np.sum(flat[:i] == e)) for i, e in enumerate(flat)]
        assert out.tolist() == expected
