"""The RAM expert cache keeps its byte budget; LRU and frequency-aware eviction differ as designed."""

from __future__ import annotations

import random

import pytest

from nightshift.engine.moe.cache import LRFU_DECAY, ExpertCache
from nightshift.engine.moe.settings import FREQUENCY, FREQUENCY_OPEN, LRFU, LRU_ADMIT, S3FIFO


def test_lru_evicts_the_least_recently_used_within_budget():
    cache = ExpertCache(300, "lru")
    for e in range(3):
        assert cache.put((0, e), f"x{e}", 100)
    assert cache.get((0, 0)) == "x0"  # 0 is now the most recent
    cache.put((0, 3), "x3", 100)
    assert (0, 1) not in cache and (0, 0) in cache and cache.used == 300


def test_frequency_policy_keeps_often_used_experts_and_refuses_one_off_newcomers():
    cache = ExpertCache(200, FREQUENCY)
    cache.put((0, 0), "hot", 100)
    cache.put((0, 1), "warm", 100)
    for _ in range(5):
        cache.get((0, 0))
    cache.get((0, 1))
    cache.get((0, 1))
    assert cache.get((0, 2)) is None  # a newcomer, looked up once (a miss), as the stream does before a read
    assert not cache.put((0, 2), "once", 100)  # used less than the least used resident: refused
    assert (0, 2) not in cache and (0, 0) in cache and (0, 1) in cache and cache.used == 200
    cache.get((0, 2))  # now used as often as the warm one: admitted in its place, never the hot one's
    assert cache.put((0, 2), "twice", 100)
    assert (0, 1) not in cache and (0, 0) in cache and cache.get((0, 2)) == "twice" and cache.used == 200


def test_hits_and_misses_are_counted_and_oversized_items_are_not_kept():
    cache = ExpertCache(100, "lru")
    assert cache.get((1, 1)) is None
    assert not cache.put((1, 1), "big", 101)
    cache.put((1, 2), "ok", 50)
    cache.get((1, 2))
    assert (cache.hits, cache.misses) == (1, 1)


def test_lru_admit_keeps_lru_order_but_refuses_a_cold_newcomer():
    cache = ExpertCache(200, LRU_ADMIT)
    cache.put((0, 0), "a", 100)
    cache.put((0, 1), "b", 100)
    cache.get((0, 0))
    cache.get((0, 1))
    cache.get((0, 1))  # 0 is the least recent, looked up once
    assert cache.get((0, 2)) is None and cache.put((0, 2), "c", 100)  # as often as its victim: admitted
    assert (0, 0) not in cache and cache.get((0, 2)) == "c"
    assert cache.get((0, 3)) is None and not cache.put((0, 3), "d", 100)  # colder than the LRU resident


def test_s3fifo_evicts_one_off_experts_first_and_promotes_those_used_again():
    cache = ExpertCache(1000, S3FIFO)
    for e in range(10):  # newcomers enter the small queue
        cache.put((0, e), e, 100)
    cache.get((0, 0))  # the oldest is used again
    cache.put((0, 10), 10, 100)  # full: 0 moves on to the main queue, 1 (a one-off) goes and becomes a ghost
    assert (0, 0) in cache and (0, 1) not in cache and cache.used == 1000
    cache.put((0, 1), 1, 100)  # back from the ghost list: into main; the small queue gives up its oldest
    cache.put((0, 11), 11, 100)
    assert (0, 1) in cache and (0, 2) not in cache and (0, 3) not in cache and cache.used == 1000


def test_resize_evicts_down_to_the_new_budget_in_policy_order():
    cache = ExpertCache(400, "lru")
    for e in range(4):
        cache.put((0, e), e, 100)
    cache.get((0, 0))
    assert cache.resize(200) == [(0, 1), (0, 2)]
    assert cache.used == 200 and cache.budget == 200 and cache.evictions == 2
    assert cache.resize(400) == [] and cache.put((0, 5), 5, 100)


class EveryResidentScored(ExpertCache):
    """The victim as the policy defines it: every resident scored at each eviction, ties to the least recent."""

    _victim = ExpertCache._least_scored


@pytest.mark.parametrize("layers", [4, 30])
def test_frequency_and_lrfu_evict_as_when_every_resident_is_scored_at_each_eviction(layers):
    """The per-layer heaps of ranks pick the victims scoring every resident would: over random layer calls (the
    layers' clocks apart), puts with and without a warm start, drops, resizes, a prior and frequency's decays."""
    rng = random.Random(5)
    for policy in (FREQUENCY, FREQUENCY_OPEN, LRFU):
        kept, scored = ExpertCache(60, policy), EveryResidentScored(60, policy)
        for step in range(3000):
            layer = rng.randrange(layers)
            experts = sorted(rng.sample(range(12), rng.randint(1, 5)))
            shares = [rng.choice([0.25, 0.5, 1.0]) for _ in experts]
            caches = (kept, scored)
            assert kept.look_up(layer, experts, shares) == scored.look_up(layer, experts, shares)
            for e in experts:
                warm = rng.random() < 0.1
                assert kept.put((layer, e), e, 4 + e % 3, warm) == scored.put((layer, e), e, 4 + e % 3, warm)
            if step % 97 == 0:
                for c in caches:
                    c.drop([(layer, experts[0])])
            if step % 211 == 0:
                budget = rng.choice([40, 60])
                for c in caches:
                    c.resize(budget)
            if step == 1500:
                for c in caches:
                    c.prior({(1, 3): 5.0, (2, 7): 2.0})
        assert kept.keys() == scored.keys()
        assert (kept.hits, kept.evictions, kept.used) == (scored.hits, scored.evictions, scored.used)


def test_a_profile_prior_keeps_what_past_runs_used_over_a_newcomer():
    cache = ExpertCache(100, FREQUENCY)
    cache.prior({(0, 0): 3.0})
    cache.get((0, 0))
    assert cache.put((0, 0), "profiled", 100)
    cache.get((0, 1))
    cache.get((0, 1))  # looked up twice now: more than a cold cache's resident, less than the profiled one's 4
    assert not cache.put((0, 1), "newcomer", 100)
    assert cache.get((0, 0)) == "profiled"


def test_hits_on_warm_started_experts_are_counted_until_they_are_evicted():
    cache = ExpertCache(200, "lru")
    cache.put((0, 0), "warm", 100, warm=True)
    cache.put((0, 1), "read", 100)
    cache.get((0, 0))
    cache.get((0, 1))
    assert (cache.hits, cache.warm_hits) == (2, 1)
    cache.get((0, 1))
    cache.put((0, 2), "new", 100)  # evicts the warm one (least recent)
    cache.put((0, 0), "again", 100)  # read again by demand: no longer a warm start's
    cache.get((0, 0))
    assert cache.warm_hits == 1


def test_lrfu_keeps_what_recent_tokens_used_over_what_an_old_passage_used_often():
    cache = ExpertCache(200, LRFU)
    for _ in range(6):  # expert 0 in six tokens of an old passage
        cache.look_up(0, [0])
    cache.put((0, 0), "old favourite", 100)
    for _ in range(int(4 / LRFU_DECAY)):  # 40 tokens later (four half-lives): its score is 6/16 of a lookup
        cache.look_up(0, [1, 2])
    cache.put((0, 1), "recent", 100)
    assert cache.put((0, 2), "recent too", 100)  # admitted: it outscores the old favourite, which goes
    assert (0, 0) not in cache and (0, 1) in cache and (0, 2) in cache and cache.used == 200


def test_lrfu_between_experts_used_at_the_same_time_keeps_the_more_used_and_refuses_a_one_off():
    cache = ExpertCache(200, LRFU)
    for _ in range(3):
        cache.look_up(0, [0, 1])
    cache.look_up(0, [0])
    cache.put((0, 0), "used four times", 100)
    cache.put((0, 1), "used three times", 100)
    assert cache.look_up(0, [2]) == [None]  # a newcomer once, as recent as the residents
    assert not cache.put((0, 2), "once", 100)  # it scores under the least of them: refused
    cache.look_up(0, [2])
    cache.look_up(0, [2])  # now three lookups, the latest: it outscores the one whose uses are older
    assert cache.put((0, 2), "thrice", 100)
    assert (0, 1) not in cache and (0, 0) in cache and (0, 2) in cache


def test_lrfu_weighs_a_prompt_chunks_lookups_by_the_share_of_rows_that_chose_each_expert():
    cache = ExpertCache(100, LRFU)
    cache.look_up(0, [0, 1], shares=[1.0, 0.01])  # a chunk: every row chose 0, one row in a hundred chose 1
    cache.put((0, 1), "rarely chosen", 100)
    assert cache.put((0, 0), "chosen by every row", 100) and (0, 1) not in cache
    assert not cache.put((0, 1), "rarely chosen", 100)


def test_lrfu_ages_an_expert_by_the_calls_of_its_own_layer():
    cache = ExpertCache(100, LRFU)
    cache.look_up(0, [0])
    cache.look_up(0, [0])
    cache.put((0, 0), "layer 0, used in two tokens", 100)
    for _ in range(20):  # twenty calls of layer 1 alone: a layer 0 expert's score does not age meanwhile
        cache.look_up(1, [5])
    cache.look_up(1, [6])  # a layer 1 newcomer used once: it scores under the layer 0 expert's two lookups
    assert not cache.put((1, 6), "layer 1, used once", 100) and (0, 0) in cache
    cache.look_up(1, [6])
    cache.look_up(1, [6])  # three lookups in its layer's last three calls: it outscores the other now
    assert cache.put((1, 6), "layer 1, used thrice", 100) and (0, 0) not in cache


def test_lrfu_keeps_a_stable_half_when_every_token_uses_15_of_16_experts():
    """The default model's routing: nearly every expert in every token, so their scores sit together near the cap.
    A cache of half the experts must keep its half (a hit for each resident the token uses), not swap residents for
    newcomers no better than them: each swap is an expert read for nothing."""
    rng = random.Random(0)
    layers, tokens = 4, 200
    cache = ExpertCache(layers * 8 * 100, LRFU)
    for _ in range(tokens):
        for layer in range(layers):
            skipped = rng.randrange(16)
            experts = [e for e in range(16) if e != skipped]
            for expert, value in zip(experts, cache.look_up(layer, experts)):
                if value is None:
                    cache.put((layer, expert), "read", 100)
    assert cache.hits / (cache.hits + cache.misses) > 0.48  # Belady: 8 of the 15 a layer uses, 8 x 15/16 / 15
    assert cache.evictions < tokens * layers / 2  # a swap now and then (before: two a layer call)
