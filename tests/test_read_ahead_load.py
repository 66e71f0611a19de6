"""What is left of a read counts on its drive (`load_left`), and read-aheads keep off the drives the next layer's
demand reads likely want (`spare_demand_drives`)."""

from __future__ import annotations

import pytest

from nightshift.engine.moe.dispatch import Booking, Dispatcher, DriveEstimate
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.readahead import Guess
from nightshift.engine.moe.settings import StreamSettings
from tests.helpers.gated_reads import GatedReads
from tests.helpers.waits import wait_for

MB = 1_000_000
PAGE = 4096


def test_a_booked_read_weighs_what_is_left_of_it():
    d = Dispatcher({"a": DriveEstimate(latency=0.0, bandwidth=10 * MB), "b": DriveEstimate(latency=0.0)})
    assert d.choose(["a"], 4 * MB) == "a"
    booking = Booking("a", 4 * MB)
    d.settle(booking, MB)  # a chunk landed
    assert d.snapshot()["a"].in_flight == 3 * MB
    d.trim(booking, MB // 2)  # aborted: at most half a MB more is read
    assert d.snapshot()["a"].in_flight == MB // 2 and booking.left == MB // 2
    d.settle(booking, MB)  # the chunk under way ends: never below nothing
    assert d.snapshot()["a"].in_flight == 0 and booking.left == 0
    d.finished("a", 4 * MB, ok=False, booking=booking)  # the end releases only what was still counted
    assert d.snapshot()["a"].in_flight == 0


@pytest.mark.parametrize("load_left", [True, False])
def test_an_aborted_read_ahead_weighs_only_its_chunk_under_way(mixtral_store, monkeypatch, load_left):
    settings = StreamSettings(cache_bytes=0, prefetch_abort=True, load_left=load_left)
    _, _, stream = load_streaming(mixtral_store, settings)
    reader = stream.reader
    layer = stream.manifest.layers[1].layer
    file_bytes = reader.layers[layer].file_bytes
    drive, path = reader.placer.replicas(layer, 3)[0]
    gate = GatedReads(monkeypatch, str(path), PAGE)
    try:
        reader.prefetch(layer, [3])
        assert gate.started.wait(30), "the read-ahead never reached its second chunk"
        # the first page has landed: with load_left the drive no longer counts it
        assert stream.dispatcher.snapshot()[drive].in_flight == file_bytes - PAGE * load_left
        reader.demand(layer, [])  # the layer asks without it: aborted, its second page under way
        assert reader.counts.wasted_prefetch == 1
        assert stream.dispatcher.snapshot()[drive].in_flight == (PAGE if load_left else file_bytes)
        assert (layer, 3) not in reader._inflight
        gate.go.set()
        wait_for(lambda: stream.dispatcher.snapshot()[drive].in_flight == 0, 30, "the drive to be free")
        wait_for(lambda: reader.counts.aborted_prefetch == 1, 30, "the read-ahead to stop")
    finally:
        gate.go.set()
        stream.close()


def read_ahead(store, window: float, used_of_10: int, spare: bool) -> tuple[list[int], int]:
    """(experts read ahead, read-aheads spared) when a decode step guesses three experts of the second MoE layer,
    all uncached and on one drive, and the prefetch limit reads the first: one expert takes 0.4 s on a drive, the
    window is `window` s, and uncached guesses of every rank were used `used_of_10` times in 10 looks."""
    settings = StreamSettings(cache_bytes=0, prefetch_limit=1, spare_demand_drives=spare)
    _, _, stream = load_streaming(store, settings)
    try:
        layer = stream.manifest.layers[1].layer
        file_bytes = stream.reader.layers[layer].file_bytes
        for est in stream.dispatcher._drives.values():
            est.bandwidth, est.latency = 2.5 * file_bytes, 0.0
        by_drive: dict[str, list[int]] = {}
        for expert in range(stream.reader.layers[layer].num_experts):
            by_drive.setdefault(stream.reader.placer.replicas(layer, expert)[0][0], []).append(expert)
        guessed = max(by_drive.values(), key=len)[:3]
        assert len(guessed) == 3, "the store has no drive with three experts of a layer"
        stream.ahead.windows[1] = window
        for look in range(10):
            stream.ahead.odds.count([0, 1, 2], {0, 1, 2} if look < used_of_10 else set())
        stream.ahead.prefetch(Guess(layer, guessed), set(), rows=1, step=True)
        ahead = [e for (lay, e) in stream.reader._inflight if lay == layer]
        return [guessed.index(e) for e in ahead], stream.reader.counts.spared_prefetch
    finally:
        stream.close()


def test_a_read_ahead_past_the_window_is_held_back_from_a_drive_the_next_layer_will_want(mixtral_store):
    # The two guesses left unread sit on the read-ahead's drive and are likely used: a read of 0.4 s in a window
    # of 0.3 s would still be reading when they are asked for, so it is held back...
    assert read_ahead(mixtral_store, 0.3, 9, spare=True) == ([], 1)
    assert read_ahead(mixtral_store, 0.3, 9, spare=False) == ([0], 0)
    # ...but not when it ends within the window, nor when the unread guesses are unlikely to be asked for (in a
    # window of 0.38 s, where the odds read a guess used 1 time in 10 that runs 0.02 s past it)
    assert read_ahead(mixtral_store, 0.5, 9, spare=True) == ([0], 0)
    assert read_ahead(mixtral_store, 0.38, 1, spare=True) == ([0], 0)
