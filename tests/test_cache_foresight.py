"""Belady's bound taken call by call, as the engine's cache serves a call, and bench.cache_foresight's forecast
replays between the engine's `lrfu` (no forecast) and Belady (every lookup foreseen)."""

from __future__ import annotations

import numpy as np

from bench.cache_foresight import Learned, fit, foreseen_replay, next_call, rest_of_token
from nightshift.engine.bench.cache_sim import Call, belady, decode_reads, decode_reads_floor, replay
from nightshift.engine.moe.settings import LRFU, LRU


def test_belady_keeps_a_call_s_misses_over_its_own_hits_needed_no_more():
    """Budget 2, expert 1 and 2 held; the next call wants 0 and 1, the one after 0 and 2. After the second call
    1 is needed no more: the optimum keeps 0 and 2 (3 hits). Taken lookup by lookup, 1 would still look needed
    when 0 missed, 2 would go, and only 2 hits remain: below what a cache evicting after the call can do."""
    calls = [Call(0, (1, 2), 1), Call(0, (0, 1), 1), Call(0, (0, 2), 1)]
    bound = belady(calls, {0: 1}, 2)
    assert (bound.hits, bound.lookups, bound.bytes_read) == (3, 6, 3)
    assert foreseen_replay(calls, 2, lambda c: {(0, 0): 2, (0, 2): 2} if c == 1 else {}) == 3 / 6


def random_calls(seed: int, tokens: int = 40, layers: int = 3, experts: int = 8, k: int = 3) -> list[Call]:
    rng = np.random.default_rng(seed)
    return [
        Call(layer, tuple(sorted(rng.choice(experts, k, replace=False).tolist())), 1, (1,) * k)
        for _ in range(tokens)
        for layer in range(layers)
    ]


def everything_ahead(calls: list[Call]):
    """The forecast that names every later lookup: each key's next call."""

    def forecast(c: int) -> dict[tuple[int, int], int]:
        ahead: dict[tuple[int, int], int] = {}
        for j in range(len(calls) - 1, c, -1):
            ahead.update({(calls[j].layer, e): j for e in calls[j].experts})
        return ahead

    return forecast


def test_the_engine_s_cache_shown_every_lookup_ahead_reaches_belady_and_shown_none_is_lrfu():
    for seed in range(6):
        calls = random_calls(seed)
        for budget in (3, 6, 12):
            bound = belady(calls, dict.fromkeys(range(3), 1), budget)
            assert foreseen_replay(calls, budget, everything_ahead(calls)) == bound.hit_rate
            lrfu = replay(calls, dict.fromkeys(range(3), 1), budget, LRFU).hit_rate
            assert foreseen_replay(calls, budget, lambda c: {}) == lrfu
            assert lrfu <= foreseen_replay(calls, budget, next_call(calls, 1.0, 8)) <= bound.hit_rate


def test_the_rest_of_the_token_names_the_later_layers_of_this_token_only():
    calls = [Call(layer, (layer, 7), 1) for _ in range(2) for layer in (1, 2, 3)]
    forecast = rest_of_token(calls)
    assert forecast(0) == {(2, 2): 1, (2, 7): 1, (3, 3): 2, (3, 7): 2}
    assert forecast(2) == {}  # the token's last layer: the next token is not foreseen
    assert forecast(3) == {(2, 2): 4, (2, 7): 4, (3, 3): 5, (3, 7): 5}


def test_a_forecast_of_given_recall_names_that_share_of_the_next_call_and_as_many_others():
    calls = [Call(layer, tuple(range(4 * t, 4 * t + 4)), 1) for t in range(3) for layer in (1, 2)]
    named = next_call(calls, 0.5, 16)(1)  # after layer 2 of the first token: both layers' next calls, 4 each
    for layer, position in ((1, 2), (2, 3)):
        keys = {e for (at, e), j in named.items() if at == layer and j == position}
        assert len(keys) == 4 and len(keys & set(calls[position].experts)) == 2


def test_the_learned_forecast_ranks_an_expert_used_every_token_above_one_used_once():
    """Fitted on a trace where expert 0 is chosen every token and the others at random, its victims are the
    one-offs: at a budget of 2 it keeps 0 and hits it every token after the first."""
    rng = np.random.default_rng(0)
    calls = [
        Call(1, tuple(sorted({0, *rng.choice(np.arange(1, 30), 2, replace=False).tolist()})), 1) for _ in range(200)
    ]
    weights = fit([calls], 30)
    cache = Learned(2, weights)
    for call in calls:
        missing = [e for e in call.experts if (call.layer, e) not in cache]
        cache.look_up(call.layer, call.experts)
        cache.observe(call.layer, call.experts, None, 30)
        for expert in missing:
            cache.put((call.layer, expert), None, 1)
    assert (1, 0) in cache and cache.hits >= 199


def test_a_decode_pass_s_reads_leave_out_the_prompt_s_and_no_policy_reads_less_than_the_floor():
    """A 4-row prompt call of experts 0-3, then one-row calls over one layer, budget 2 of 1-byte experts: LRU reads
    what it misses after the prompt (the prompt's own reads left out), and no policy reads less a pass than the
    floor, Belady's reads less the prompt's distinct experts, which every cache reads once from empty."""
    decode = [(0, 1), (2, 3), (0, 1), (2, 3)]
    calls = [Call(0, (0, 1, 2, 3), 4, (1, 1, 1, 1)), *(Call(0, pair, 1, (1, 1)) for pair in decode)]
    assert decode_reads(calls, {0: 1}, replay(calls, {0: 1}, 2, LRU)) == 2.0  # {2, 3} held after the prompt: all miss
    floor = decode_reads_floor(calls, {0: 1}, belady(calls, {0: 1}, 2))
    assert floor == (belady(calls, {0: 1}, 2).bytes_read - 4) / 4
    for seed in range(4):
        more = [calls[0], *random_calls(seed, tokens=20, layers=1, experts=6, k=2)]
        lowest = decode_reads_floor(more, {0: 1}, belady(more, {0: 1}, 3))
        assert all(decode_reads(more, {0: 1}, replay(more, {0: 1}, 3, policy)) >= lowest for policy in (LRU, LRFU))
