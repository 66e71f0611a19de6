"""What a stream holds in RAM: the expert cache, layers held whole as in RAM, the warm start; RAM given back.

The cached experts' tensors are rows of a slab (engine/moe/slab.py), the cache deciding which. When the cache's budget
holds every expert of the model, a layer whose experts have all been read is made resident: its calls skip the stream's
reads, running the family's switch on the slab with the router's own indices mapped to the experts' rows by a table, as
in RAM; their lookups are counted as cache hits afterwards (`count_resident`), from the indices once evaluated, so
nothing waits on them.
With `warm_start`, the cache is filled from the store's routing profile at open in the background
(engine/moe/warm.py), each expert kept at the next layer call (`take_warm`), and its counts start from it.
An auto budget is checked against the RAM available now and then (`budget.Pressure`); when another process
takes RAM, resident layers are let go of and the cache evicts down to what is left (`give_back`). Inside a memory
cgroup's limit it may also grow, into what the model measurably leaves of the limit (`held`: MLX's memory less the
cache's slabs), so an auto cache sized at 0 there is still made.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import mlx.core as mx
import numpy as np

from nightshift.engine.io.arenas import trim_heap
from nightshift.engine.moe.budget import Budget, Pressure, working_set_bytes
from nightshift.engine.moe.cache import ExpertCache
from nightshift.engine.moe.figures import Tally
from nightshift.engine.moe.held import held_sizes
from nightshift.engine.moe.reader import ExpertReader
from nightshift.engine.moe.reads import Tensors
from nightshift.engine.moe.slab import Slabs
from nightshift.engine.moe.warm import RoutingProfile, WarmFill

RESIDENT_BACKLOG, RESIDENT_KEEP = 1024, 64  # resident calls held before counting; the newest left to evaluate


def routed(host: np.ndarray) -> tuple[list[int], list[int]]:
    """A call's router indices on the host: its sorted unique experts, and how many rows chose each."""
    flat = host.reshape(-1).tolist()
    distinct = sorted(set(flat))
    if len(distinct) == len(flat):  # each chosen once (a decode step of one row): no NumPy call (~8 against 1 us)
        return distinct, [1] * len(flat)
    unique, counts = np.unique(host, return_counts=True)
    return unique.tolist(), counts.tolist()


class Residency:
    """One stream's experts in RAM, within `budget`; the calls of resident layers are counted into `tally`."""

    def __init__(self, budget: Budget, reader: ExpertReader, tally: Tally):
        """`budget`: the expert cache's, sized by `budget.size_budget` before the trunk was loaded."""
        self.budget = budget
        self.reader = reader
        self.tally = tally
        grows = budget.auto and budget.limited  # inside a cgroup limit an auto budget may grow from 0
        self.slabs = Slabs(list(reader.layers.values()), lambda: self.cache.budget)
        self.cache: ExpertCache[None] | None = (
            ExpertCache(budget.bytes, reader.settings.cache_policy, self.slabs.drop) if budget.bytes or grows else None
        )
        grower = {"held": self.held, "working_set": partial(working_set_bytes, reader.manifest)}
        self.pressure = Pressure(budget, **grower) if budget.auto and (budget.bytes or grows) else None
        self.sizes = held_sizes(reader.layers.values())  # what the cache counts per expert: its RAM, not its file
        self.stacks: dict[int, tuple[Tensors, mx.array]] = {}  # resident layers: a slab chunk, each expert's row in it
        self.warm: WarmFill | None = None
        self._holders: dict[int, Callable[[], None]] = {}  # layer -> how its switch lets go of its resident chunk
        self._calls: list[tuple[int, mx.array]] = []  # resident (layer, indices) not yet counted as hits
        self._warm_taken = False  # every warm read kept: nothing left to look for
        self._shrunk = False  # the budget fell since the last settle

    def found(self, layer: int, unique: list[int]) -> dict[int, tuple[int, int]]:
        """The experts of `unique` the RAM cache holds, and their rows in the layer's slab, (chunk, row); the lookups
        are counted apart (`count`), once the call's cached experts are queued."""
        if self.cache is None:
            return {}
        where = self.slabs.layers[layer].where
        return {e: where[layer, e] for e in unique if (layer, e) in where}

    def count(self, layer: int, unique: list[int], shares: list[float]) -> None:
        """A call's lookups into the cache: each a hit or a miss, weighed by `shares` (the share of the call's rows
        that chose it); before anything this call reads is kept."""
        if self.cache is not None:
            self.cache.look_up(layer, unique, shares)

    def uncached(self, layer: int, experts: list[int]) -> list[int]:
        return [e for e in experts if self.cache is None or (layer, e) not in self.cache]

    def keep(self, layer: int, read: list[tuple[int, Tensors]]) -> None:
        """Every read (expert, tensors as read) of `layer` in the cache, if it admits it; the layer made resident
        once all its experts are, when the budget holds every expert."""
        if self.cache is None:
            return
        for expert, raw in read:
            self._put((layer, expert), raw)
        if read and self.cache.budget >= self.budget.expert_bytes:
            self._stack(layer)

    def settle(self) -> None:
        """A router was just read back: nothing queued reads an evicted expert's row any more (`Slabs.settle`); after
        the budget fell, the free rows' pages go back to the system."""
        self.slabs.settle()
        if self._shrunk:
            self.slabs.discard_free()
            self._shrunk = False

    def resident(self, layer: int, indices: mx.array, release: Callable[[], None]) -> tuple[Tensors, mx.array] | None:
        """`layer`'s experts if it is resident (its call is then counted later): the slab chunk holding them, and the
        row of each expert in it (the router's indices mapped through it); else None.

        The caller may keep the stack between calls; `release()` is how it lets go when the layer stops being
        resident. Also where memory pressure and the warm start are looked at: a resident model calls nothing
        else of the stream.
        """
        self.give_back(layer, indices.size // indices.shape[-1])
        self.take_warm()
        stack = self.stacks.get(layer)
        if stack is not None:
            self._holders[layer] = release
            self._calls.append((layer, indices))
            if len(self._calls) > RESIDENT_BACKLOG:
                self.count_resident(keep=RESIDENT_KEEP)
        return stack

    def count_resident(self, keep: int = 0) -> None:
        """Count the lookups of resident calls (all but the last `keep`) as cache hits: their indices are
        evaluated by now, as the tokens that used them have been."""
        counted = self._calls[: len(self._calls) - keep]
        del self._calls[: len(counted)]
        for layer, indices in counted:
            host = np.array(indices)
            rows = host.size // host.shape[-1]
            unique, counts = routed(host)
            self.tally.note(layer, unique, rows, counts)
            self.cache.look_up(layer, unique, [count / rows for count in counts])
            self.tally.call(rows, len(unique))

    def give_back(self, layer: int, rows: int) -> None:
        """Follow an auto budget to the RAM available now, at a call of `layer` with `rows` rows: evict down when another
        process took RAM (or a pass wider than any before may need the grown part); inside a limit, grow."""
        if self.pressure is None:
            return
        budget = self.pressure.budget_now(self.cache.used, layer, rows)
        if budget is None or budget == self.cache.budget:
            return
        if budget < self.budget.expert_bytes and self.stacks:
            self.count_resident()
            self._unstack()
        if self.cache.resize(budget):
            self._shrunk = True  # the evicted experts' rows handed back at the next settle
            mx.clear_cache()  # MLX keeps freed buffers for reuse; hand them back to the system
            trim_heap()  # and so does the heap: a read expert's small tensors leave holes in it

    def held(self) -> int:
        """What the model holds now besides the cache's slabs (their free rows too: made ahead, they take no RAM
        until written), as MLX counts it: its active memory and the freed buffers it keeps for reuse (a pass's
        transients: capped at the working set)."""
        return mx.get_active_memory() + mx.get_cache_memory() - self.slabs.nbytes()

    def warm_from(self, profile: RoutingProfile) -> None:
        """Start the cache's counts from `profile` and fill it with its hottest experts in the background."""
        if self.cache is None:
            return
        self.cache.prior(profile.prior())
        settings = self.reader.settings
        window = settings.prefetch_threads * len(settings.use_drives or self.reader.manifest.drives)
        self.warm = WarmFill(
            self.reader, profile.hottest(self.sizes, self.cache.budget), window, self.tally.read.__contains__
        )

    def take_warm(self) -> None:
        """Keep what the warm start read since the last call (here, on the thread that runs the layers, before
        a call looks at the cache: a layer never sees it change under it); stack layers it completed."""
        if self.warm is None or self._warm_taken:
            return
        done = self.warm.counts.done  # before taking: what lands after this is taken at a later call
        layers = set()
        landed = self.warm.take()
        self._warm_taken = done and not landed
        for key, future, loaded in landed:
            self.reader.settle_warm(key, future)
            self.tally.read.add(key)
            if self._put(key, loaded.tensors, warm=True):
                self.warm.counts.kept += 1
                self.warm.counts.kept_bytes += self.sizes[key[0]]
                layers.add(key[0])
        if self.cache.budget >= self.budget.expert_bytes:  # as `keep` does
            for layer in layers - set(self.stacks):
                self._stack(layer)

    def close(self) -> None:
        """Stop the warm start."""
        if self.warm is not None:
            self.warm.close()

    def _put(self, key: tuple[int, int], raw: Tensors, warm: bool = False) -> bool:
        """`key` in the cache if it admits it, its tensors (as read) in its layer's slab; True if kept."""
        kept = self.cache.put(key, None, self.sizes[key[0]], warm=warm)
        if kept:
            self.slabs.put(key, raw)
        return kept

    def _stack(self, layer: int) -> None:
        """Make `layer` resident once all its experts are cached, in one chunk of its slab (a chunk is one call)."""
        slab = self.slabs.layers[layer]
        rows = [slab.where.get((layer, e)) for e in range(self.reader.layers[layer].num_experts)]
        if all(rows) and len({chunk for chunk, _ in rows}) == 1:
            table = mx.array(np.array([row for _, row in rows], dtype=np.uint32))
            self.stacks[layer] = slab.chunks[rows[0][0]], table

    def _unstack(self) -> None:
        """Resident layers back to streamed ones (their experts stay in their slabs, in the cache)."""
        for layer in list(self.stacks):
            self._holders.pop(layer, lambda: None)()
            del self.stacks[layer]
