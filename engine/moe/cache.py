"""The RAM cache of experts: a byte budget, a replacement policy, and an admission rule.

Policies (what is evicted to make room, and whether a newcomer is let in at all):

- `lru`: evict the least recently used expert; admit every read.
- `lru-admit`: LRU order, but a newcomer is admitted only if it has been looked up at least as often as
  the expert it would evict (a cold miss need not evict a hot expert).
- `frequency`: evict the resident looked up least often (counts halve every `DECAY_EVERY` lookups so old
  favourites fade; ties: least recent), with the same admission rule.
- `frequency-open`: the same order, admitting every read.
- `lrfu`: LRFU (Lee et al., IEEE ToC 2001): each lookup adds its weight to an expert's score, and a score halves
  over every `1 / LRFU_DECAY` calls of the expert's own layer (one call a layer per decode token), so what the
  last few tokens used outranks what an old passage used often; evict the lowest score, admit a newcomer only
  if it outscores its victim by at least one call's decay (near-equal experts are not swapped, a read a swap).
  A lookup's weight is the share of the call's rows that chose the expert (1 in a decode step; a prompt chunk's
  experts by how much of the chunk used them). Measured best on trained
  routing: docs/results.md, "Cache policy on trained routing".
- `s3fifo`: S3-FIFO (Yang et al., SOSP 2023): newcomers enter a small FIFO (a tenth of the budget); one
  looked up again while there moves on to the main FIFO, the others leave and are remembered in a ghost
  list, from which a returning expert goes straight to the main FIFO; the main FIFO gives each expert
  looked up since its last turn another round.

A routing profile of past runs (engine/moe/warm.py) may seed the lookup counts (`prior`), so the frequency
policies protect the experts past runs used most from the first token on, and the cache may be filled with
them at open (`put(..., warm=True)`; hits on those are counted apart, `warm_hits`).

The engine and `nightshift bench cache` run this same class (the simulator with sizes and no values), so
a replayed trace predicts the engine's hits exactly, and the simulator's pick is the engine's default.
"""

from __future__ import annotations

import heapq
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from nightshift.engine.moe.settings import FREQUENCY, LRFU, LRU, LRU_ADMIT, S3FIFO

Key = tuple[int, int]  # (layer, expert)
V = TypeVar("V")
DECAY_EVERY = 4096
SMALL_SHARE = 0.1  # S3-FIFO's small queue, as a share of the budget
MAX_TURNS = 3  # S3-FIFO: lookups remembered per expert
LRFU_DECAY = 0.1  # LRFU: a score's halvings per call of its layer (half-life 10 decode tokens; 0.05-0.2 within 1 %)


class ExpertCache(Generic[V]):
    """Experts kept in RAM within `budget` bytes; hits and misses counted; thread-safe."""

    def __init__(self, budget_bytes: int, policy: str = LRU, on_evict: Callable[[Key], None] | None = None):
        """`on_evict(key)`: told of each key the cache lets go (where its value is held elsewhere: the slabs)."""
        self.budget = budget_bytes
        self.policy = policy
        self.on_evict = on_evict
        self.used = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.warm_hits = 0  # hits on experts put by the warm start, while they stay resident
        self._warm: set[Key] = set()
        self._items: OrderedDict[Key, tuple[V, int]] = OrderedDict()  # LRU order, least recent first
        self._counts: dict[Key, float] = {}  # frequency: lookups; LRFU: log2 of the score plus LRFU_DECAY x clock
        self._clock: dict[int, int] = {}  # LRFU: calls per layer (`look_up`)
        self._lookups = 0
        self._lock = threading.Lock()
        # S3-FIFO only: the small and main queues (insertion order), their bytes, ghosts, turns per expert.
        self._small: OrderedDict[Key, None] = OrderedDict()
        self._main: OrderedDict[Key, None] = OrderedDict()
        self._small_bytes = 0
        self._ghost: OrderedDict[Key, None] = OrderedDict()
        self._turns: dict[Key, int] = {}
        # frequency / LRFU: each resident's rank in its layer (its stored count, then its place in `_items`' order)
        # and a heap of ranks per layer, stale entries skipped: a victim is the least of one heap top a layer, not a
        # score computed for each resident (re-scoring ~1 100 residents after each layer's lookups took 11 % of the
        # decode thread's samples on moe128-mixtral at 25 %; docs/results.md, session 11). Within a layer the order by stored count is the
        # order by score: an LRFU score is the stored count less the layer's clock, the same for all its experts.
        self._ranks: dict[Key, tuple[float, int]] = {}
        self._heaps: dict[int, list[tuple[float, int, Key]]] = {}
        self._heaped = 0  # entries in the heaps, stale ones included
        self._touches = 0  # when each resident was last put or hit: `_items`' order

    @property
    def ranks(self) -> bool:
        """Whether the policy evicts the lowest score (frequency, frequency-open, lrfu): residents are ranked."""
        return self.policy not in (LRU, LRU_ADMIT, S3FIFO)

    @property
    def admits_all(self) -> bool:
        return self.policy not in (FREQUENCY, LRU_ADMIT, LRFU)

    def get(self, key: Key) -> V | None:
        with self._lock:
            return self._get(key, 1.0)

    def look_up(self, layer: int, experts: Sequence[int], shares: Sequence[float] | None = None) -> list[V | None]:
        """One layer call's lookups, under one lock: the values of `experts` (None where not resident).

        `shares`: per expert, the share of the call's rows that chose it (None: 1 each, as in a decode step);
        LRFU weighs each lookup by it and counts the call on the layer's clock; the other policies count 1.
        """
        with self._lock:
            self._clock[layer] = self._clock.get(layer, 0) + 1
            return [self._get((layer, e), 1.0 if shares is None else shares[i]) for i, e in enumerate(experts)]

    def _get(self, key: Key, weight: float) -> V | None:
        self._count(key, weight)
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self._rank(key)
        self.warm_hits += key in self._warm
        if key in self._turns:
            self._turns[key] = min(self._turns[key] + 1, MAX_TURNS)
        self.hits += 1
        return item[0]

    def put(self, key: Key, value: V, nbytes: int, warm: bool = False) -> bool:
        """Keep `value` if the policy admits it within the budget; True if kept. `warm`: put by the warm
        start, not after a lookup (its hits are counted in `warm_hits`)."""
        with self._lock:
            if key in self._items or nbytes > self.budget:
                return key in self._items
            while self.used + nbytes > self.budget:
                victim = self._victim()
                if not self._admits(key, victim):
                    return False
                self._evict(victim)
            self._items[key] = (value, nbytes)
            self.used += nbytes
            if warm:
                self._warm.add(key)
            self._rank(key)
            if self.policy == S3FIFO:
                self._enter_s3fifo(key, nbytes)
            return True

    def prior(self, counts: dict[Key, float]) -> None:
        """Start the lookup counts from `counts` (a routing profile's): frequency admission and eviction then
        favour what past runs used most until this run's own lookups outweigh it (counts decay as they go)."""
        with self._lock:
            for key, count in counts.items():
                if self.policy == LRFU:
                    self._count(key, count)  # as one lookup that heavy, decaying from here
                else:
                    self._counts[key] = self._counts.get(key, 0) + count
            self._rerank()

    def resize(self, budget_bytes: int) -> list[Key]:
        """Set a new budget; evicts in the policy's order down to it. Returns the evicted keys."""
        with self._lock:
            self.budget = budget_bytes
            evicted = []
            while self.used > self.budget:
                evicted.append(self._victim())
                self._evict(evicted[-1])
            return evicted

    def drop(self, keys: list[Key]) -> None:
        """Evict `keys` (those resident) whatever the policy says."""
        with self._lock:
            for key in keys:
                if key in self._items:
                    self._evict(key)

    def keys(self) -> list[Key]:
        with self._lock:
            return list(self._items)

    def __contains__(self, key: Key) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def _evict(self, key: Key) -> None:
        nbytes = self._items.pop(key)[1]
        self._ranks.pop(key, None)
        self.used -= nbytes
        self.evictions += 1
        if key in self._small:
            del self._small[key]
            self._small_bytes -= nbytes
        self._main.pop(key, None)
        self._turns.pop(key, None)
        self._warm.discard(key)
        if self.on_evict is not None:
            self.on_evict(key)

    def _admits(self, key: Key, victim: Key) -> bool:
        """Whether newcomer `key` may take `victim`'s place. Under `lrfu` it must lead by at least one call's
        decay: experts that nearly every token uses all sit near the same capped score, and without the margin
        whichever skipped a token last would be swapped out for a newcomer no better than it, a read a swap (a
        model routing 15 of 16 experts a token: 0.2 % hits at 10 % of expert bytes where Belady gets 10.3 %)."""
        if self.admits_all:
            return True
        margin = LRFU_DECAY if self.policy == LRFU else 0.0
        return self._score(key) >= self._score(victim) + margin

    def _victim(self) -> Key:
        if self.policy in (LRU, LRU_ADMIT):
            return next(iter(self._items))
        if self.policy == S3FIFO:
            return self._s3fifo_victim()
        best: tuple[float, int, Key] | None = None
        for layer, heap in self._heaps.items():
            while heap and self._ranks.get(heap[0][2]) != heap[0][:2]:  # evicted, or ranked again since
                heapq.heappop(heap)
                self._heaped -= 1
            if heap:
                stored, touched, key = heap[0]
                candidate = (self._score_of(layer, stored), touched, key)  # ties: least recent
                if best is None or candidate < best:
                    best = candidate
        assert best is not None, "a victim is asked for only while something is resident"
        return best[2]

    def _least_scored(self) -> Key:
        """The victim found by scoring every resident (ties: least recent): what the ranks give, for a subclass
        whose `_score` is not the stored count (the forecasts of bench/cache_foresight.py), which they cannot
        follow."""
        return min(self._items, key=self._score)

    def _rank(self, key: Key) -> None:
        """Rank a resident just put or hit (it moved to the end of `_items`) for the victim search; no-op for the
        policies that do not rank."""
        if not self.ranks:
            return
        self._touches += 1
        self._ranks[key] = rank = (self._stored(key), self._touches)
        heapq.heappush(self._heaps.setdefault(key[0], []), (*rank, key))
        self._heaped += 1
        if self._heaped > 4 * len(self._ranks) + 256:  # mostly stale entries: rebuild from the ranks
            self._rerank()

    def _rerank(self) -> None:
        """Every resident ranked afresh (counts changed wholesale: a decay, a prior), the heaps rebuilt."""
        if not self.ranks:
            return
        self._ranks = {key: (self._stored(key), touched) for key, (_, touched) in self._ranks.items()}
        self._heaps = {}
        for key, rank in self._ranks.items():
            self._heaps.setdefault(key[0], []).append((*rank, key))
        for heap in self._heaps.values():
            heapq.heapify(heap)
        self._heaped = len(self._ranks)

    def _score(self, key: Key) -> float:
        """What eviction and admission compare: lookups (frequency), or log2 of the decayed score now (LRFU)."""
        return self._score_of(key[0], self._stored(key))

    def _stored(self, key: Key) -> float:
        """What orders a layer's residents: lookups (frequency), or the stored log2 score (LRFU; never looked up:
        -inf)."""
        if self.policy != LRFU:
            return self._counts.get(key, 0)
        stored = self._counts.get(key)
        return -math.inf if stored is None else stored

    def _score_of(self, layer: int, stored: float) -> float:
        return stored - LRFU_DECAY * self._clock.get(layer, 0) if self.policy == LRFU else stored

    def _enter_s3fifo(self, key: Key, nbytes: int) -> None:
        self._turns[key] = 0
        if key in self._ghost:  # evicted from the small queue not long ago: it has earned the main queue
            del self._ghost[key]
            self._main[key] = None
        else:
            self._small[key] = None
            self._small_bytes += nbytes

    def _s3fifo_victim(self) -> Key:
        """The next expert S3-FIFO evicts; moves the small queue's re-used experts to main on the way."""
        while True:
            if self._small and (self._small_bytes >= SMALL_SHARE * self.budget or not self._main):
                key = next(iter(self._small))
                if self._turns[key] > 0:  # looked up again while in the small queue: promoted to main
                    del self._small[key]
                    self._small_bytes -= self._items[key][1]
                    self._main[key] = None
                    self._turns[key] = 0
                    continue
                self._ghost[key] = None
                while len(self._ghost) > max(len(self._main), 1):
                    self._ghost.popitem(last=False)
                return key
            key = next(iter(self._main))
            if self._turns[key] > 0:  # another round at the back of main
                self._main.move_to_end(key)
                self._turns[key] -= 1
                continue
            return key

    def _count(self, key: Key, weight: float) -> None:
        if self.policy == LRFU:  # stored as log2(score) + decay x clock: nothing to update as the clock moves
            now = LRFU_DECAY * self._clock.get(key[0], 0)
            stored = self._counts.get(key)
            score = weight + (0.0 if stored is None else 2.0 ** (stored - now))
            self._counts[key] = math.log2(score) + now
            return
        self._counts[key] = self._counts.get(key, 0) + 1
        self._lookups += 1
        if self._lookups % DECAY_EVERY == 0:
            self._counts = {k: c / 2 for k, c in self._counts.items() if c >= 1}
            self._rerank()
