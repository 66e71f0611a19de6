"""An optional RAM cache of experts with a byte budget.

Two policies, measured against each other by `nightshift bench`: `lru` evicts the
least recently used expert; `frequency` evicts the resident expert used least
often (counts halve every `DECAY_EVERY` lookups so old favourites fade), and
admits a newcomer only if it has been used at least as often as its victim.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

from nightshift.engine.moe.settings import FREQUENCY, LRU

Key = tuple[int, int]  # (layer, expert)
V = TypeVar("V")
DECAY_EVERY = 4096


class ExpertCache(Generic[V]):
    def __init__(self, budget_bytes: int, policy: str = LRU):
        self.budget = budget_bytes
        self.policy = policy
        self.used = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[Key, tuple[V, int]] = OrderedDict()
        self._counts: dict[Key, float] = {}
        self._lookups = 0
        self._lock = threading.Lock()

    def get(self, key: Key) -> V | None:
        with self._lock:
            self._count(key)
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item[0]

    def put(self, key: Key, value: V, nbytes: int) -> bool:
        """Keep `value` if the policy admits it within the budget; True if kept."""
        with self._lock:
            if key in self._items or nbytes > self.budget:
                return key in self._items
            while self.used + nbytes > self.budget:
                victim = self._victim()
                if self.policy == FREQUENCY and self._counts.get(victim, 0) > self._counts.get(key, 0):
                    return False
                self.used -= self._items.pop(victim)[1]
            self._items[key] = (value, nbytes)
            self.used += nbytes
            return True

    def __contains__(self, key: Key) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def _victim(self) -> Key:
        if self.policy == LRU:
            return next(iter(self._items))
        return min(self._items, key=lambda k: self._counts.get(k, 0))  # ties: least recent (dict order)

    def _count(self, key: Key) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1
        self._lookups += 1
        if self._lookups % DECAY_EVERY == 0:
            self._counts = {k: c / 2 for k, c in self._counts.items() if c >= 1}
