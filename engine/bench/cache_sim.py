"""Replay routing traces against expert cache policies, with Belady's optimum as the bound.

A routing trace is what a real run looked up, in order: per streaming layer call (a prompt chunk or a
decode step), the layer, the sorted unique experts its rows selected and how many rows chose each
(`Instruments.routing`).
The engine looks every one of them up in its cache, then keeps the misses once read; `replay` does the
same with the engine's own `ExpertCache` (sizes only, no tensors), so for a given trace its hit rate is
the engine's, whatever the drives. `belady` is the offline optimum for the same lookups: on a miss with
no room it evicts the resident used furthest in the future, or keeps nothing when the newcomer itself is
(an optimum that may refuse admission, as `lru-admit` and `frequency` may).

Traces are saved as JSON lines: {"layer": L, "experts": [...], "rows": R, "counts": [...]} (traces recorded before
the counts were kept have none: each expert then weighs as in a decode step); bench/cache_traces.py records
them from real runs and replays them against the bounds; `nightshift bench cache` records or takes one, replays it
and times the policy it picks.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nightshift.engine.moe.cache import ExpertCache
from nightshift.engine.moe.settings import CACHE_POLICIES, FREQUENCY, LRFU, LRU_ADMIT
from nightshift.engine.moe.warm import RoutingProfile, counts_of

BELADY = "belady"
STATIC = "static oracle"


@dataclass(frozen=True)
class Call:
    """One streaming layer call of a trace: its layer, unique experts (sorted), rows, and per expert the rows that
    chose it (None: unknown, as in traces recorded before they were kept)."""

    layer: int
    experts: tuple[int, ...]
    rows: int
    counts: tuple[int, ...] | None = None

    @property
    def shares(self) -> list[float] | None:
        """Per expert, the share of the call's rows that chose it (what the cache weighs a lookup by)."""
        return None if self.counts is None else [count / self.rows for count in self.counts]


@dataclass(frozen=True)
class Replay:
    """One policy at one budget over one trace."""

    policy: str
    budget: int
    hits: int
    lookups: int
    bytes_read: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


def save_trace(calls: Iterable[Call], path: Path) -> int:
    """Write `calls` as JSON lines; returns how many."""
    count = 0
    with open(path, "w") as f:
        for call in calls:
            line = {"layer": call.layer, "experts": list(call.experts), "rows": call.rows}
            f.write(json.dumps(line | ({"counts": list(call.counts)} if call.counts else {})) + "\n")
            count += 1
    return count


def load_trace(path: Path) -> list[Call]:
    with open(path) as f:
        return [
            Call(d["layer"], tuple(d["experts"]), d["rows"], _counts(d.get("counts"))) for d in map(json.loads, f) if d
        ]


def _counts(counts: list[int] | None) -> tuple[int, ...] | None:
    return None if counts is None else tuple(counts)


def replay(
    calls: list[Call],
    sizes: dict[int, int],
    budget: int,
    policy: str,
    profile: RoutingProfile | None = None,
    warm: bool = False,
) -> Replay:
    """The engine's cache under `policy` and `budget` over `calls`; sizes: bytes of one expert per layer.

    As `ExpertStream` does: look up each of a call's experts, then offer the cache the ones that missed.
    `profile`: a routing profile of other runs, seeding the cache's counts as the engine does; with `warm`,
    the cache starts filled with the profile's hottest experts (the warm start, as if it finished first).
    """
    cache: ExpertCache[None] = ExpertCache(budget, policy)
    if profile is not None:
        cache.prior(profile.prior())
        for key in profile.hottest(sizes, budget) if warm else ():
            cache.put(key, None, sizes[key[0]], warm=True)
    read = 0
    for call in calls:
        missing = [e for e in call.experts if (call.layer, e) not in cache]
        cache.look_up(call.layer, call.experts, call.shares)
        for expert in missing:
            cache.put((call.layer, expert), None, sizes[call.layer])
        read += len(missing) * sizes[call.layer]
    name = policy + (" + profile" if profile is not None else "") + (" + warm" if warm else "")
    return Replay(name, budget, cache.hits, cache.hits + cache.misses, read)


def static_oracle(calls: list[Call], sizes: dict[int, int], budget: int, warm: bool = False) -> Replay:
    """The best fixed set for this trace: the experts it looks up most, pinned within `budget` (read on first
    use, or held from the start with `warm`). When routing is stationary, no policy without knowledge of the
    future does better than the fixed set of the most probable experts; this is that set with the trace's own
    frequencies, so it bounds what any profile or online count can reach."""
    counts = counts_of((call.layer, call.experts) for call in calls)
    pinned = RoutingProfile(dict(counts)).hottest(sizes, budget)
    lookups = sum(counts.values())
    cold = 0 if warm else 1  # a pinned expert's first lookup reads it
    hits = sum(counts[key] - cold for key in pinned)
    missed = {key: counts[key] for key in counts} | {key: cold for key in pinned}
    read = sum(sizes[key[0]] * n for key, n in missed.items())
    return Replay(STATIC + (" + warm" if warm else ""), budget, hits, lookups, read)


def belady(calls: list[Call], sizes: dict[int, int], budget: int, warm: bool = False) -> Replay:
    """Belady's optimum for the lookups of `calls` within `budget` bytes (exact when experts are one size).

    A call is what the engine serves at once, as `replay` does: every one of its experts is looked up against the
    cache as it was before the call, then the misses are offered. So the optimum chooses after each call which of the
    residents and the call's misses to keep: those whose next call comes soonest (a miss needed again later than
    every resident is not kept, as `lru-admit` and `frequency` may refuse one). Taken lookup by lookup instead, a
    call's later experts would be protected from its earlier misses, a bound below what the engine's own cache
    can reach.

    `warm`: the optimum may also choose what the cache holds at the start (for free, as a warm start reads it
    before it is needed): the experts first needed soonest, which is what evicting the furthest next use
    from a cache holding everything leaves."""
    never = len(calls)
    upcoming: list[dict[tuple[int, int], int]] = [{}] * len(calls)  # per call: its experts' next calls
    last: dict[tuple[int, int], int] = {}
    for c in range(len(calls) - 1, -1, -1):
        keys = [(calls[c].layer, e) for e in calls[c].experts]
        upcoming[c] = {key: last.get(key, never) for key in keys}
        last.update(dict.fromkeys(keys, c))
    resident: dict[tuple[int, int], int] = {}  # key -> its next call
    heap: list[tuple[int, tuple[int, int]]] = []  # (-next call, key); stale entries skipped
    used = hits = read = 0
    for key, first in sorted(last.items(), key=lambda item: item[1]) if warm else ():
        if used + sizes[key[0]] <= budget:
            resident[key] = first
            heapq.heappush(heap, (-first, key))
            used += sizes[key[0]]
    for ahead in upcoming:
        missing = [key for key in ahead if key not in resident]
        hits += len(ahead) - len(missing)
        read += sum(sizes[key[0]] for key in missing)
        for key in ahead.keys() - set(missing):
            resident[key] = ahead[key]
            heapq.heappush(heap, (-ahead[key], key))
        for key in sorted(missing, key=ahead.__getitem__):
            size = sizes[key[0]]
            if size > budget or ahead[key] == never:
                continue
            while used + size > budget:
                far, victim = heap[0]
                if resident.get(victim) != -far:
                    heapq.heappop(heap)
                    continue
                if -far < ahead[key]:  # every resident is needed before the newcomer: keep them
                    break
                heapq.heappop(heap)
                del resident[victim]
                used -= sizes[victim[0]]
            if used + size > budget:
                continue
            used += size
            resident[key] = ahead[key]
            heapq.heappush(heap, (-ahead[key], key))
    return Replay(BELADY + (" + warm" if warm else ""), budget, hits, sum(len(call.experts) for call in calls), read)


def decode_reads(calls: list[Call], sizes: dict[int, int], whole: Replay) -> float:
    """Bytes an online policy reads a decode pass (the one-row calls), from `whole`, its replay of `calls`: its reads
    less those over the calls before the first one-row call (the prompt's), which it serves the same way alone."""
    first, passes = _decode_start(calls)
    read = whole.bytes_read - replay(calls[:first], sizes, whole.budget, whole.policy).bytes_read
    return read / passes if passes else 0.0


def decode_reads_floor(calls: list[Call], sizes: dict[int, int], optimum: Replay) -> float:
    """The least any policy can read a decode pass, even knowing the future, from `optimum`, Belady's replay of
    `calls`: its reads less every distinct expert of the calls before the first one-row call, which each policy
    reads once from an empty cache."""
    first, passes = _decode_start(calls)
    prompt = {(call.layer, e) for call in calls[:first] for e in call.experts}
    read = optimum.bytes_read - sum(sizes[layer] for layer, _ in prompt)
    return max(0.0, read / passes) if passes else 0.0


def _decode_start(calls: list[Call]) -> tuple[int, float]:
    """Where the decode begins in `calls` (the first one-row call) and how many decode passes there are (one-row
    calls over the layers that are called)."""
    first = next((i for i, call in enumerate(calls) if call.rows == 1), len(calls))
    return first, sum(call.rows == 1 for call in calls) / max(1, len({call.layer for call in calls}))


def sweep(
    calls: list[Call],
    sizes: dict[int, int],
    expert_bytes: int,
    shares: tuple[float, ...],
    policies=CACHE_POLICIES,
    profile: RoutingProfile | None = None,
) -> dict[float, dict[str, Replay]]:
    """Every policy, the static oracle and Belady at each share of the store's expert bytes: {share: {name:
    Replay}}; with a routing profile of other runs, also each frequency policy seeded from it, cold and warm
    started, and the static oracle and Belady from a warm start (the bounds a warm start is held to)."""
    table = {}
    for share in shares:
        budget = int(share * expert_bytes)
        row = {policy: replay(calls, sizes, budget, policy) for policy in policies}
        for warm in (False, True) if profile is not None else ():
            for policy in (FREQUENCY, LRFU, LRU_ADMIT):
                found = replay(calls, sizes, budget, policy, profile, warm)
                row[found.policy] = found
        for warm in (False, True) if profile is not None else (False,):
            for bound in (static_oracle(calls, sizes, budget, warm), belady(calls, sizes, budget, warm)):
                row[bound.policy] = bound
        table[share] = row
    return table


def best_policy(table: dict[float, dict[str, Replay]], shares=(0.10, 0.25, 0.50)) -> str:
    """The engine policy with the highest mean hit rate over `shares` (the budgets a streamed model runs at),
    from a cold start (whether to warm start is a setting of its own, chosen by measurement)."""
    policies = [p for p in next(iter(table.values())) if p in CACHE_POLICIES]
    return max(policies, key=lambda p: sum(table[s][p].hit_rate for s in shares if s in table))
