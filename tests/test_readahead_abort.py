"""A read-ahead its layer did not use stops part way with `prefetch_abort`, and the decode's waits are split by
what the drive a layer waited on was reading (engine/bench/wait_split.py)."""

from __future__ import annotations

import pytest

from nightshift.engine.bench.wait_split import wait_split
from nightshift.engine.instruments.trace import CACHE, DEMAND, PREFETCH, DriveRead, ExpertRead, PassTrace
from nightshift.engine.moe import expert_files
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.reads import ReadAborted
from nightshift.engine.moe.settings import StreamSettings
from tests.helpers.gated_reads import GatedReads
from tests.helpers.stores import streamed_tokens
from tests.helpers.waits import wait_for

PAGE = 4096


@pytest.mark.parametrize("abort", [True, False])
def test_an_unused_read_ahead_stops_part_way_only_with_prefetch_abort(mixtral_store, monkeypatch, abort):
    _, _, stream = load_streaming(mixtral_store, StreamSettings(cache_bytes=0, prefetch_abort=abort))
    reader = stream.reader
    layer = stream.manifest.layers[1].layer
    file_bytes = reader.layers[layer].file_bytes
    path = reader.placer.replicas(layer, 3)[0][1]
    gate = GatedReads(monkeypatch, str(path), PAGE)
    try:
        reader.prefetch(layer, [3])
        future = reader._inflight[(layer, 3)].future
        if abort:  # read in chunks: the second one waits at the gate
            assert gate.started.wait(30), "the read-ahead never reached its second chunk"
        pending = reader.demand(layer, [0, 1])  # the layer asks without expert 3
        gate.go.set()
        reader.wait(layer, [0, 1], pending)
        wait_for(future.done, 30, "the read-ahead to end")
        assert reader.counts.wasted_prefetch == 1 and (layer, 3) not in reader._inflight
        logged = [r for r in stream.trace.drive_reads() if (r.layer, r.expert, r.source) == (layer, 3, PREFETCH)]
        if abort:
            assert isinstance(future.exception(), ReadAborted)
            assert reader.counts.aborted_prefetch == 1
            # the chunk under way when the layer asked ends; none after it starts
            assert reader.counts.aborted_prefetch_bytes == file_bytes - 2 * PAGE
            assert [r.nbytes for r in logged] == [2 * PAGE]
        else:
            assert future.exception() is None and reader.counts.aborted_prefetch == 0
            assert [r.nbytes for r in logged] == [file_bytes]
    finally:
        gate.go.set()
        stream.close()


@pytest.mark.parametrize(
    "settings",
    [
        StreamSettings(cache_bytes=0, prefetch_abort=True),
        # and booked page by page, read-aheads kept off the next layer's demand drives (tests/test_read_ahead_load.py)
        StreamSettings(cache_bytes=0, prefetch_abort=True, load_left=True, spare_demand_drives=True),
    ],
)
def test_tokens_are_the_same_with_read_aheads_aborted(mixtral_store, monkeypatch, settings):
    monkeypatch.setattr(expert_files, "ABORT_CHUNK", PAGE)  # every read-ahead can stop after any page
    base, _ = streamed_tokens(mixtral_store, StreamSettings(cache_bytes=0, prefetch_abort=False), steps=8)
    tokens, stream = streamed_tokens(mixtral_store, settings, steps=8)
    assert tokens == base
    assert stream.reads.prefetch_reads > 0


def test_the_wait_is_split_by_what_the_barrier_drive_read():
    """Layer 1 waits 1.0-2.0 s for its demand read of expert 4 on d0, which shares d0 with a read-ahead of expert 9
    that the layer did not use until 1.5 s; d1 reads a used read-ahead. One drive reads 2 MB/s."""
    mb = 1_000_000
    waited = PassTrace(layer=1, began=0.9, asked=1.0, wait_s=1.0)
    waited.reads = [
        ExpertRead(4, DEMAND, "d0", 1.0, 2.0, mb),
        ExpertRead(5, PREFETCH, "d1", 0.5, 1.2, mb),
        ExpertRead(6, CACHE),
    ]
    reads = [
        DriveRead(1, 4, DEMAND, "d0", 1.0, 2.0, mb),
        DriveRead(1, 9, PREFETCH, "d0", 0.6, 1.5, mb // 2),  # not used: 0.5 s inside the wait at its rate
        DriveRead(1, 5, PREFETCH, "d1", 0.5, 1.2, mb),
    ]
    drive = 2.0 * mb  # bytes/s of one drive
    split = wait_split([waited], reads, drive, compute_per_pass=0.4, tokens=1)
    assert split.wait == 1.0
    assert split.demand == pytest.approx(0.5)  # the demand read's 1 MB on d0
    assert split.unused == pytest.approx((mb / 2) * (0.5 / 0.9) / drive)
    assert split.used == 0 and split.other == 0  # d1 is not the drive the layer waited on
    total = split.demand + split.unused
    assert total <= 1.0 and split.idle == pytest.approx(1.0 - total)
    # placed: the busiest drive's bytes (1 MB each on d0 and d1) at one drive's bandwidth, above the compute share
    assert split.placed_layer_floor == pytest.approx(0.5)
    # a drive cannot read faster than its bandwidth: at half of it, the reads fill the wait and nothing is idle
    slow = wait_split([waited], reads, drive / 2, compute_per_pass=0.4, tokens=1)
    assert slow.demand + slow.unused == pytest.approx(1.0) and slow.idle == 0
    assert slow.unused / slow.demand == pytest.approx(split.unused / split.demand)
