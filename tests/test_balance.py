"""Balanced reads (water-filling): a layer's reads that do not divide over the drives are cut so every drive
reads the same bytes, and the experts read in parts are the experts read whole, bit for bit."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from bench.helpers.reference import greedy_tokens
from nightshift.engine.bench.layout import replicate_everywhere
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.tickets import MIN_PART_SHARE
from nightshift.engine.store.loader import load_store
from tests.helpers.stores import delay_reads, import_tiny, tiny_checkpoint

DEVICES = {"d0": 1, "d1": 2, "d2": 3}  # the three drives share this machine's disk: call them three devices


@pytest.fixture(scope="module")
def kimi_on_three_drives(tmp_path_factory) -> Path:
    """A tiny kimi_k3 store (8 experts per layer, 2 active) with every expert on each of three drives."""
    root = tmp_path_factory.mktemp("balance")
    store = import_tiny(root, tiny_checkpoint(root, "kimi_k3"), "kimi", drives=3)
    replicate_everywhere(store)
    return store


def read_layer(
    store: Path, balance: bool, devices: dict[str, int] = DEVICES, ahead: bool = False
) -> tuple[dict[str, int], dict[int, dict[str, np.ndarray]], int, int]:
    """One layer's 8 experts demanded at once (`ahead`: read ahead at once, then demanded): bytes per drive, each
    expert's tensors, balanced reads, file bytes."""
    model, _, stream = load_streaming(store, StreamSettings(balance_reads=balance, cache_bytes=0, prefetch=False))
    stream.reader.placer.devices.update(devices)
    try:
        reader = stream.reader
        layer = min(reader.layers)
        experts = list(range(reader.layers[layer].num_experts))
        placed = threading.Event()  # no read lands before all are placed: the dispatcher sees only bytes in flight
        for drive in DEVICES:
            delay_reads(reader, drive, placed.wait)
        if ahead:  # all placed before any lands, then all landed before the demand joins them
            assert reader.prefetch(layer, experts) == len(experts)
            placed.set()
            for expert in experts:
                reader._inflight[(layer, expert)].future.result()
        pending = reader.demand(layer, experts)
        placed.set()
        loaded = reader.wait(layer, experts, pending)
        tensors = {e: {k: np.array(v) for k, v in got.tensors.items()} for e, (got, _) in zip(experts, loaded)}
        assert reader.counts.joined_prefetch == (len(experts) if ahead else 0)
        per_drive = {name: drive.bytes for name, drive in stream.figures().drives.items()}
        return per_drive, tensors, reader.counts.balanced_reads, reader.layers[layer].file_bytes
    finally:
        stream.close()
        del model


@pytest.mark.parametrize("ahead", [False, True], ids=["demanded", "read-ahead"])
def test_eight_reads_over_three_drives_are_read_as_equal_shares(kimi_on_three_drives, ahead):
    # A read-ahead set is placed as a demand is: whole reads on one drive each took 4x as long to land as the
    # same bytes spread (docs/results.md, [13] read-aheads placed as demands).
    whole, whole_tensors, none, file_bytes = read_layer(kimi_on_three_drives, balance=False, ahead=ahead)
    balanced, tensors, cut, _ = read_layer(kimi_on_three_drives, balance=True, ahead=ahead)
    assert none == 0 and sorted(whole.values()) == [2 * file_bytes, 3 * file_bytes, 3 * file_bytes]  # 3/3/2
    # Each drive that would have read 3 gives a third of one read to the drive with 2: 2 2/3 reads each.
    assert cut == 2
    assert sum(balanced.values()) == 8 * file_bytes
    assert max(balanced.values()) - min(balanced.values()) < file_bytes // MIN_PART_SHARE
    for expert, got in tensors.items():
        assert got.keys() == whole_tensors[expert].keys()
        assert all(np.array_equal(got[name], whole_tensors[expert][name]) for name in got)


def test_balanced_reads_keep_greedy_tokens_identical(kimi_on_three_drives):
    model, _, stream = load_streaming(kimi_on_three_drives, StreamSettings(balance_reads=True, cache_bytes=0))
    stream.reader.placer.devices.update(DEVICES)
    try:
        tokens = greedy_tokens(model, 16)
    finally:
        stream.close()
    assert tokens == greedy_tokens(load_store(kimi_on_three_drives)[0], 16)
    assert stream.reader.counts.balanced_reads > 0  # 2 reads a pass over 3 drives: cut every pass


def test_reads_on_one_device_are_never_cut(kimi_on_three_drives):
    # The drives' real device: all three on this machine's one disk, so parts would not read in parallel.
    assert read_layer(kimi_on_three_drives, balance=True, devices={})[2] == 0
