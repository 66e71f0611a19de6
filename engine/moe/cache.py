"""The RAM cache of experts: a byte budget, a replacement policy, and an admission rule.

Policies (what is evicted to make room, and whether a newcomer is let in at all):

- `lru`: evict the least recently used expert; admit every read.
- `lru-admit`: LRU order, but a newcomer is admitted only if it has been looked up at least as often as
  the expert it would evict (a cold miss need not evict a hot expert).
- `frequency`: evict the resident looked up least often (counts halve every `DECAY_EVERY` lookups so old
  favourites fade; ties: least recent), with the same admission rule.
- `frequency-open`: the same order, admitting every read.
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

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

from nightshift.engine.moe.settings import FREQUENCY, LRU, LRU_ADMIT, S3FIFO

Key = tuple[int, int]  # (layer, expert)
V = TypeVar("V")
DECAY_EVERY = 4096
SMALL_SHARE = 0.1  # S3-FIFO's small queue, as a share of the budget
MAX_TURNS = 3  # S3-FIFO: lookups remembered per expert


class ExpertCache(Generic[V]):
    """Experts kept in RAM within `budget` bytes; hits and misses counted; thread-safe."""

    def __init__(self, budget_bytes: int, policy: str = LRU):
        self.budget = budget_bytes
        self.policy = policy
        self.used = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.warm_hits = 0  # hits on experts put by the warm start, while they stay resident
        self._warm: set[Key] = set()
        self._items: OrderedDict[Key, tuple[V, int]] = OrderedDict()  # LRU order, least recent first
        self._counts: dict[Key, float] = {}
        self._lookups = 0
        self._lock = threading.Lock()
        # S3-FIFO only: the small and main queues (insertion order), their bytes, ghosts, turns per expert.
        self._small: OrderedDict[Key, None] = OrderedDict()
        self._main: OrderedDict[Key, None] = OrderedDict()
        self._small_bytes = 0
        self._ghost: OrderedDict[Key, None] = OrderedDict()
        self._turns: dict[Key, int] = {}

    @property
    def admits_all(self) -> bool:
        return self.policy not in (FREQUENCY, LRU_ADMIT)

    def get(self, key: Key) -> V | None:
        with self._lock:
            return self._get(key)

    def get_many(self, keys: list[Key]) -> None:
        """Look `keys` up as `get` would, under one lock (the resident layers' lookups, counted in bulk)."""
        with self._lock:
            for key in keys:
                self._get(key)

    def _get(self, key: Key) -> V | None:
        self._count(key)
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
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
                if not self.admits_all and self._counts.get(victim, 0) > self._counts.get(key, 0):
                    return False
                self._evict(victim)
            self._items[key] = (value, nbytes)
            self.used += nbytes
            if warm:
                self._warm.add(key)
            if self.policy == S3FIFO:
                self._enter_s3fifo(key, nbytes)
            return True

    def prior(self, counts: dict[Key, float]) -> None:
        """Start the lookup counts from `counts` (a routing profile's): frequency admission and eviction then
        favour what past runs used most until this run's own lookups outweigh it (counts decay as they go)."""
        with self._lock:
            for key, count in counts.items():
                self._counts[key] = self._counts.get(key, 0) + count

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

    def values(self, keys: list[Key]) -> list[V | None]:
        """The values of `keys` (None where not resident), without counting a lookup."""
        with self._lock:
            return [item[0] if (item := self._items.get(key)) else None for key in keys]

    def update(self, key: Key, value: V) -> None:
        """Replace a resident key's value (its bytes and place in the policy unchanged)."""
        with self._lock:
            self._items[key] = (value, self._items[key][1])

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
        self.used -= nbytes
        self.evictions += 1
        if key in self._small:
            del self._small[key]
            self._small_bytes -= nbytes
        self._main.pop(key, None)
        self._turns.pop(key, None)
        self._warm.discard(key)

    def _victim(self) -> Key:
        if self.policy in (LRU, LRU_ADMIT):
            return next(iter(self._items))
        if self.policy == S3FIFO:
            return self._s3fifo_victim()
        return min(self._items, key=lambda k: self._counts.get(k, 0))  # ties: least recent (dict order)

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

    def _count(self, key: Key) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1
        self._lookups += 1
        if self._lookups % DECAY_EVERY == 0:
            self._counts = {k: c / 2 for k, c in self._counts.items() if c >= 1}
