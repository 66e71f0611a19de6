"""Replay routing traces against expert cache policies, with Belady's optimum as the bound.

A routing trace is what a real run looked up, in order: per streaming layer call (a prompt chunk or a
decode step), the layer and the sorted unique experts its rows selected (`ExpertStream.record_routing`).
The engine looks every one of them up in its cache, then keeps the misses once read; `replay` does the
same with the engine's own `ExpertCache` (sizes only, no tensors), so for a given trace its hit rate is
the engine's, whatever the drives. `belady` is the offline optimum for the same lookups: on a miss with
no room it evicts the resident used furthest in the future, or keeps nothing when the newcomer itself is
(an optimum that may refuse admission, as `lru-admit` and `frequency` may).

Traces are saved as JSON lines: {"layer": L, "experts": [...], "rows": R}.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nightshift.engine.moe.cache import ExpertCache
from nightshift.engine.moe.settings import CACHE_POLICIES

BELADY = "belady"


@dataclass(frozen=True)
class Call:
    """One streaming layer call of a trace: its layer, unique experts (sorted) and rows."""

    layer: int
    experts: tuple[int, ...]
    rows: int


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
            f.write(json.dumps({"layer": call.layer, "experts": list(call.experts), "rows": call.rows}) + "\n")
            count += 1
    return count


def load_trace(path: Path) -> list[Call]:
    with open(path) as f:
        return [Call(d["layer"], tuple(d["experts"]), d["rows"]) for d in map(json.loads, f) if d]


def replay(calls: list[Call], sizes: dict[int, int], budget: int, policy: str) -> Replay:
    """The engine's cache under `policy` and `budget` over `calls`; sizes: bytes of one expert per layer.

    As `ExpertStream` does: look up each of a call's experts, then offer the cache the ones that missed.
    """
    cache: ExpertCache[None] = ExpertCache(budget, policy)
    read = 0
    for call in calls:
        missing = [e for e in call.experts if (call.layer, e) not in cache]
        for expert in call.experts:
            cache.get((call.layer, expert))
        for expert in missing:
            cache.put((call.layer, expert), None, sizes[call.layer])
        read += len(missing) * sizes[call.layer]
    return Replay(policy, budget, cache.hits, cache.hits + cache.misses, read)


def belady(calls: list[Call], sizes: dict[int, int], budget: int) -> Replay:
    """Belady's optimum for the lookups of `calls` within `budget` bytes (exact when experts are one size)."""
    keys = [(call.layer, e) for call in calls for e in call.experts]
    never = len(keys)
    upcoming = [never] * len(keys)  # position of each lookup's key's next lookup
    last: dict[tuple[int, int], int] = {}
    for i in range(len(keys) - 1, -1, -1):
        upcoming[i] = last.get(keys[i], never)
        last[keys[i]] = i
    resident: dict[tuple[int, int], int] = {}  # key -> its next lookup
    heap: list[tuple[int, tuple[int, int]]] = []  # (-next lookup, key); stale entries skipped
    used = hits = read = 0
    for i, key in enumerate(keys):
        size = sizes[key[0]]
        if key in resident:
            hits += 1
        else:
            read += size
            if size > budget or upcoming[i] == never:
                continue
            while used + size > budget:
                far, victim = heap[0]
                if resident.get(victim) != -far:
                    heapq.heappop(heap)
                    continue
                if -far < upcoming[i]:  # every resident is needed before the newcomer: keep them
                    break
                heapq.heappop(heap)
                del resident[victim]
                used -= sizes[victim[0]]
            if used + size > budget:
                continue
            used += size
        resident[key] = upcoming[i]
        heapq.heappush(heap, (-upcoming[i], key))
    return Replay(BELADY, budget, hits, len(keys), read)


def sweep(
    calls: list[Call], sizes: dict[int, int], expert_bytes: int, shares: tuple[float, ...], policies=CACHE_POLICIES
) -> dict[float, dict[str, Replay]]:
    """Every policy and Belady at each share of the store's expert bytes: {share: {policy: Replay}}."""
    table = {}
    for share in shares:
        budget = int(share * expert_bytes)
        row = {policy: replay(calls, sizes, budget, policy) for policy in policies}
        row[BELADY] = belady(calls, sizes, budget)
        table[share] = row
    return table


def best_policy(table: dict[float, dict[str, Replay]], shares=(0.10, 0.25, 0.50)) -> str:
    """The policy with the highest mean hit rate over `shares` (the budgets a streamed model runs at)."""
    policies = [p for p in next(iter(table.values())) if p != BELADY]
    return max(policies, key=lambda p: sum(table[s][p].hit_rate for s in shares if s in table))
