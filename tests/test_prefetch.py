"""Next-layer prefetch: demands join reads in flight, recall is measured, and it can be switched off per layer.

Every stream here has no RAM cache: a store this small would otherwise become resident and read nothing.
"""

from __future__ import annotations

import time

from bench.helpers.reference import greedy_tokens
from nightshift.engine.bench.decode import streamed_decode
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.prefetch import router_logits, top_experts
from nightshift.engine.moe.readahead import Guess, RankOdds
from nightshift.engine.moe.settings import StreamSettings
from tests.helpers.stores import delay_reads, streamed_tokens, tiny_store
from tests.helpers.waits import wait_for


def figures(store, settings):
    return streamed_tokens(store, settings, steps=8)


def test_prefetch_is_joined_not_read_twice_and_recall_is_measured(mixtral_store):
    tokens, on = figures(mixtral_store, StreamSettings(cache_bytes=0, prefetch=True))
    same, off = figures(mixtral_store, StreamSettings(cache_bytes=0, prefetch=False, prefill_prefetch=False))
    assert tokens == same
    reads = on.reads
    assert reads.joined_prefetch > 0 and reads.prefetch_reads > 0
    # every expert a demand used came from exactly one read: its own or a prefetch it joined
    used = reads.demand_reads + reads.joined_prefetch
    assert used == off.reads.demand_reads
    issued = reads.demand_reads + reads.prefetch_reads - reads.cancelled_prefetch
    assert sum(d.reads for d in on.drives.values()) == issued
    assert 0 < on.prefetch_recall <= 1
    assert set(on.recall_per_layer) == {1, 2}  # the first MoE layer has no layer before it to predict it
    assert off.reads.prefetch_reads == 0 and off.recall_per_layer == {}


def test_prefill_prefetch_reads_ahead_only_during_passes_of_many_rows(mixtral_store):
    _, prefill_only = figures(mixtral_store, StreamSettings(cache_bytes=0, prefetch=False, prefill_prefetch=True))
    reads = prefill_only.reads
    assert reads.prefetch_reads > 0 and reads.joined_prefetch > 0
    # the prompt's one pass per predicting layer (2 of 3 MoE layers) predicts at most all 8 experts each
    assert reads.prefetch_reads <= 2 * 8


def test_prefetch_can_be_turned_off_for_one_layer(mixtral_store):
    _, some = figures(mixtral_store, StreamSettings(cache_bytes=0, prefetch=True, prefetch_off=frozenset({2})))
    assert set(some.recall_per_layer) == {1}


def test_the_prefetch_limit_reads_ahead_only_the_most_confident_experts(mixtral_store):
    _, all_k = figures(mixtral_store, StreamSettings(cache_bytes=0, prefetch=True))
    _, one = figures(mixtral_store, StreamSettings(cache_bytes=0, prefetch=True, prefetch_limit=1))
    assert 0 < one.reads.prefetch_reads < all_k.reads.prefetch_reads
    predicting_calls = one.calls.calls * 2 // 3  # 3 MoE layers: the first two predict the next one
    assert one.reads.prefetch_reads <= predicting_calls  # at most one read ahead per predicting call


def test_the_guess_orders_the_union_of_rows_by_confidence():
    import mlx.core as mx

    weight = mx.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [3.0, 0.0]])  # 4 experts over 2 dims
    router = lambda x: x @ weight.T  # noqa: E731
    rows = mx.array([[1.0, 0.0], [0.0, 2.0]])  # row 0 likes experts 3 then 1; row 1 likes expert 2 (logit 2)
    # top-2 per row: row 0 -> {3, 1}, row 1 -> {2, and one of the 0-logit experts 0 or 1}
    ranked = top_experts(router_logits(router, rows), 2)
    assert ranked[:2] == [3, 2] and set(ranked) <= {0, 1, 2, 3} and 1 in ranked


def test_window_fill_reads_ahead_what_the_drives_deliver_during_the_compute_window(mixtral_store):
    _, _, stream = load_streaming(mixtral_store, StreamSettings(cache_bytes=0, prefetch=True))
    try:
        layer = stream.manifest.layers[1].layer
        file_bytes = stream.reader.layers[layer].file_bytes
        assert stream.ahead.window_fill(layer, 1) is None  # nothing measured yet: no cap
        for est in stream.dispatcher._drives.values():
            est.bandwidth = 2.5 * file_bytes  # per second, on each of the 2 drives
        stream.ahead.windows[1] = 0.8  # seconds of compute before the next layer asks, in one-row steps
        assert stream.ahead.window_fill(layer, 1) == 4  # 0.8 s x 5 files/s
        stream.ahead.windows[1] = 0.01
        assert stream.ahead.window_fill(layer, 1) == 1  # always at least the most confident guess
        stream.ahead.windows[4] = 1.6  # a step of 4 sequences computes longer: its own window
        assert stream.ahead.window_fill(layer, 4) == 8 and stream.ahead.window_fill(layer, 2) is None
    finally:
        stream.close()


def read_ahead(
    store, cap: str, window: float, odds: dict[int, int], cached: tuple[int, ...] = (), cpu: float = 0.0
) -> tuple[int, int]:
    """(reads started, guesses declined) when a decode step reads ahead guesses 1, 2, 3 of the second MoE layer
    under `cap`: one expert read takes 0.2 s at the drives' bandwidth, the window is `window` s, `odds` are the
    uses in 10 looks of each rank among the uncached guesses, `cached` guesses are in the RAM cache, a read has
    cost `cpu` s of CPU so far."""
    settings = StreamSettings(cache_bytes=1 << 30 if cached else 0, prefetch=True, prefetch_cap=cap)
    _, _, stream = load_streaming(store, settings)
    try:
        layer = stream.manifest.layers[1].layer
        file_bytes = stream.reader.layers[layer].file_bytes
        for est in stream.dispatcher._drives.values():
            est.bandwidth = 2.5 * file_bytes  # per second, on each of the 2 drives: 0.2 s a read
        for expert in cached:
            stream.residency.cache.put((layer, expert), None, file_bytes)
        stream.ahead.windows[1] = window
        stream.reader.counts.read_cpu_s, stream.reader.counts.timed_reads = 10 * cpu, 10
        for rank, used in odds.items():
            for look in range(10):
                stream.ahead.odds.count([*[-1] * rank, 0], {0} if look < used else set())
        stream.ahead.prefetch(Guess(layer, [1, 2, 3]), set(), rows=1, step=True)
        return stream.reader.counts.prefetch_reads, stream.reader.counts.declined_prefetch
    finally:
        stream.close()


def test_the_odds_cap_reads_past_the_window_only_guesses_likely_to_be_used(mixtral_store):
    # A window of 0.3 s holds one read and half of the next: the second pays only if it is used more often
    # than not (the half it saves against the half it costs the next layer: W_1 = 0.1 > (1 - p) x 0.2).
    assert read_ahead(mixtral_store, "odds", 0.3, {0: 9, 1: 1}) == (1, 0)
    assert read_ahead(mixtral_store, "odds", 0.3, {0: 9, 1: 9}) == (2, 0)  # past the window's one (`reads`)
    assert read_ahead(mixtral_store, "reads", 0.3, {0: 9, 1: 9}) == (1, 0)
    # A window of a quarter read: `reads` reads the most confident guess anyway, the odds only if it is likely.
    assert read_ahead(mixtral_store, "odds", 0.05, {0: 1}) == (0, 1)
    assert read_ahead(mixtral_store, "odds", 0.05, {0: 10}) == (1, 0)
    assert read_ahead(mixtral_store, "reads", 0.05, {0: 1}) == (1, 0)
    # A window of 2.5 reads: two always pay whatever their odds, the third (a half read) does not at 1 in 10.
    assert read_ahead(mixtral_store, "odds", 0.5, {0: 0, 1: 0, 2: 1}) == (2, 0)


def test_the_odds_cap_counts_a_read_on_its_own_drive(mixtral_store):
    # A read takes 0.2 s at the 2 drives' summed bandwidth but holds its one drive 0.4 s. In a window of 0.15 s it
    # would run 0.25 s into the next layer's reads: a guess used half the time does not pay (0.075 against 0.125
    # s), one used 11 times in 12 does. In a window of 0.3 s the two drives start one each at once: the second,
    # used 1 time in 3, pays (0.1 against 0.067 s), where one read after another it would have started 0.2 s in.
    assert read_ahead(mixtral_store, "odds", 0.15, {}) == (0, 1)
    assert read_ahead(mixtral_store, "odds", 0.15, {0: 10}) == (1, 0)
    assert read_ahead(mixtral_store, "odds", 0.3, {0: 9, 1: 3}) == (2, 0)


def test_the_odds_cap_weighs_a_wrong_reads_cpu(mixtral_store):
    # Reads that cost more CPU than their drive time (1 s against 0.2 s): a guess used 1 time in 12 no longer pays
    # even inside the window (0.2 x 1/12 < 11/12 x 1), one used 11 times in 12 still does (0.2 x 11/12 > 1/12 x 1).
    # Declined: of the 2 reads the window holds.
    assert read_ahead(mixtral_store, "odds", 0.5, {0: 0}, cpu=1.0) == (0, 2)
    assert read_ahead(mixtral_store, "odds", 0.5, {0: 10}, cpu=1.0) == (1, 1)  # the next (odds 1/2) does not
    assert read_ahead(mixtral_store, "odds", 0.5, {0: 0}, cpu=0.001) == (2, 0)  # cheap reads: the window's two


def test_the_guesses_cap_counts_cached_guesses_in_the_window_and_the_reads_cap_does_not(mixtral_store):
    # The most confident guess is cached and the window holds one read: `guesses` spends it on the cached one.
    assert read_ahead(mixtral_store, "guesses", 0.3, {}, cached=(1,)) == (0, 0)
    assert read_ahead(mixtral_store, "reads", 0.3, {}, cached=(1,)) == (1, 0)


def test_rank_odds_count_uses_by_rank_and_start_at_one_half():
    odds = RankOdds()
    assert odds.odds(0) == 0.5
    odds.count([4, 7, 9], {7, 2})
    odds.count([5], {5})
    assert (odds.seen, odds.used) == ([2, 1, 1], [1, 1, 0])
    assert odds.odds(0) == 2 / 4 and odds.odds(1) == 2 / 3 and odds.odds(2) == 1 / 3 and odds.odds(3) == 0.5


class HeldBack:
    """A mixtral store on two drives, every expert on both, whose drive d1 reads nothing until `release()`."""

    def __init__(self, tmp_path_factory, expected_reads_per_s: float):
        import threading

        from nightshift.engine.bench.layout import replicate_everywhere

        store = tiny_store(tmp_path_factory, "mixtral")
        replicate_everywhere(store)  # a guess may go to whichever drive is free
        _, _, self.stream = load_streaming(store, StreamSettings(cache_bytes=0, prefetch_tail=True))
        self.reader = self.stream.reader
        self.gate = threading.Event()
        delay_reads(self.reader, "d1", lambda: self.gate.wait(30))
        self.layer, self.following = (m.layer for m in self.stream.manifest.layers[:2])
        self.file_bytes = self.reader.layers[self.layer].file_bytes
        for est in self.stream.dispatcher._drives.values():  # what it expects before any read completes
            est.bandwidth = expected_reads_per_s * self.file_bytes

    def demand(self, experts: list[int], on: set[str]):
        """Demand reads of `experts` in the first layer; the dispatcher is expected to place them `on` those drives."""
        pending = self.reader.demand(self.layer, experts)
        assert {self.reader._inflight[(self.layer, e)].tickets[0].drive for e in experts} == on
        return pending

    def close(self) -> None:
        self.gate.set()
        self.stream.close()


def test_a_drive_done_with_its_share_reads_the_next_layers_guesses_while_another_still_reads(tmp_path_factory):
    """d0 reads its share, then the held guesses, while d1 still holds its share back; d1 takes none."""
    # Expected at one file per second, d1's two reads end in ~2 s: a guess on d0 (~1 s) fits in that tail.
    probe = HeldBack(tmp_path_factory, expected_reads_per_s=1.0)
    try:
        reader, layer, following = probe.reader, probe.layer, probe.following
        pending = probe.demand([0, 1, 2, 3], on={"d0", "d1"})
        reader.hold_tail(following, [5, 6, 7])
        wait_for(lambda: reader.counts.tail_prefetch >= 3, 30, "three guesses started on d0", 0.01)
        assert reader.counts.tail_prefetch == 3  # d0 kept reading guesses while d1 still held its share
        assert all(reader._inflight[(following, e)].tickets[0].drive == "d0" for e in (5, 6, 7))
        probe.gate.set()
        reader.wait(layer, [0, 1, 2, 3], pending)
        assert sorted(reader.end_tail()) == [(following, 5), (following, 6), (following, 7)]
        joined = reader.counts.joined_prefetch
        reader.wait(following, [5, 0], reader.demand(following, [5, 0]))
        assert reader.counts.joined_prefetch == joined + 1  # 5 was read in the tail; 0 is a demand read
        # With no drive reading a share of a layer there is no tail: guesses stay held, then are dropped.
        reader.hold_tail(layer, [4, 5])
        assert reader.counts.tail_prefetch == 3 and reader.end_tail() == []
        assert (layer, 4) not in reader._inflight and (layer, 5) not in reader._inflight
    finally:
        probe.close()


def test_no_guess_starts_when_it_would_end_long_after_the_layers_last_read(tmp_path_factory):
    """d1 is expected fast and takes the whole layer; a guess on idle d0, expected at 1 s, would end long after.

    However long d1 then really takes (held back), d0 stays idle: the tail is judged when the layer's reads are placed.
    """
    probe = HeldBack(tmp_path_factory, expected_reads_per_s=1e6)
    try:
        probe.stream.dispatcher._drives["d0"].bandwidth = probe.file_bytes  # one file per second
        pending = probe.demand([0, 1, 2, 3], on={"d1"})
        probe.reader.hold_tail(probe.following, [5, 6, 7])
        time.sleep(0.5)  # d1 held back a while (the behaviour under test): the tail is not judged again meanwhile
        assert probe.reader.counts.tail_prefetch == 0
        probe.gate.set()
        probe.reader.wait(probe.layer, [0, 1, 2, 3], pending)
        assert probe.reader.end_tail() == []
    finally:
        probe.close()


def test_tail_read_ahead_keeps_greedy_tokens(mixtral_store):
    """With d1 slower, d0 is done with its share of a decode layer first and reads guesses in the tail: the
    tokens are those of the same stream without the tail (the default has it on, so both are named)."""

    def tokens(prefetch_tail: bool) -> tuple[list[int], int]:
        model, _, stream = load_streaming(
            mixtral_store, StreamSettings(cache_bytes=0, prefetch=True, prefetch_tail=prefetch_tail)
        )
        delay_reads(stream.reader, "d1", lambda: time.sleep(0.01))  # a slow drive: the sleep is its slowness
        try:
            return greedy_tokens(model, 8), stream.figures().reads.tail_prefetch
        finally:
            stream.close()

    (without, none), (with_tail, tail_reads) = tokens(False), tokens(True)
    assert none == 0 and tail_reads > 0
    assert with_tail == without


def test_foresight_guesses_every_expert_a_recorded_run_of_the_same_decode_asked_for(mixtral_store):
    settings = StreamSettings(cache_bytes=0, prefetch=True, prefetch_fill=False)
    recorded = streamed_decode(mixtral_store, settings, 6, routing=True)
    known = [(layer, experts) for layer, experts, *_ in recorded.routing]
    foreseen = streamed_decode(mixtral_store, settings, 6, foresight=known)
    assert foreseen.timing.tokens == recorded.timing.tokens
    f = foreseen.figures
    assert f.recall_needed > 0 and f.recall_hits == f.recall_needed  # every predicted layer's experts guessed
    assert recorded.figures.recall_hits < recorded.figures.recall_needed  # the router alone misses some
    assert f.reads.joined_prefetch > recorded.figures.reads.joined_prefetch
    # the decode's own read-aheads, apart from the warm-up's and the prompt's: a part of the stream's
    decode = foreseen.decode_reads
    assert 0 < decode["prefetch_reads"] < f.reads.prefetch_reads
    assert 0 < decode["joined_prefetch"] <= f.reads.joined_prefetch
