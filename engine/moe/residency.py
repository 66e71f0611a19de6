"""What a stream holds in RAM: the expert cache, layers stacked as in RAM, the warm start; RAM given back.

When the cache's budget holds every expert of the model, a layer whose experts have all been read is made
resident: its experts are stacked once (as the model held in RAM has them) and its calls skip the stream's
reads, running the family's switch on the stack with the router's own indices, as in RAM; their lookups are
counted as cache hits afterwards (`count_resident`), from the indices once evaluated, so nothing waits on them.
With `warm_start`, the cache is filled from the store's routing profile at open in the background
(engine/moe/warm.py), each expert kept at the next layer call (`take_warm`), and its counts start from it.
An auto budget is checked against the RAM available now and then (`budget.Pressure`); when another process
takes RAM, resident layers are unstacked and the cache evicts down to what is left (`give_back`). Inside a memory
cgroup's limit it may also grow, into what the model measurably leaves of the limit (`held`: MLX's memory less the
cache's tensors), so an auto cache sized at 0 there is still made.
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
from nightshift.engine.moe.held import held_sizes, tensor_bytes
from nightshift.engine.moe.reader import ExpertReader
from nightshift.engine.moe.reads import Tensors, as_stored
from nightshift.engine.moe.warm import RoutingProfile, WarmFill

RESIDENT_BACKLOG, RESIDENT_KEEP = 1024, 64  # resident calls held before counting; the newest left to evaluate


def routed(host: np.ndarray) -> tuple[list[int], list[int]]:
    """A call's router indices on the host: its sorted unique experts, and how many rows chose each."""
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
        self.cache: ExpertCache[Tensors | None] | None = (
            ExpertCache(budget.bytes, reader.settings.cache_policy) if budget.bytes or grows else None
        )
        grower = {"held": self.held, "working_set": partial(working_set_bytes, reader.manifest)}
        self.pressure = Pressure(budget, **grower) if budget.auto and (budget.bytes or grows) else None
        self.sizes = held_sizes(reader.layers.values())  # what the cache counts per expert: its RAM, not its file
        self.tensor_sizes = {spec.layer: tensor_bytes(spec) for spec in reader.layers.values()}
        self.stacks: dict[int, Tensors] = {}  # resident layers: every expert stacked, as in RAM
        self.warm: WarmFill | None = None
        self._holders: dict[int, Callable[[], None]] = {}  # layer -> how its switch lets go of the stack
        self._calls: list[tuple[int, mx.array]] = []  # resident (layer, indices) not yet counted as hits
        self._warm_taken = False  # every warm read kept: nothing left to look for

    def look_up(self, layer: int, unique: list[int], shares: list[float]) -> dict[int, Tensors]:
        """The experts of `unique` the RAM cache holds (each lookup counts as a hit or a miss, weighed by `shares`:
        the share of the call's rows that chose it)."""
        if self.cache is None:
            return {}
        return {e: t for e, t in zip(unique, self.cache.look_up(layer, unique, shares)) if t is not None}

    def uncached(self, layer: int, experts: list[int]) -> list[int]:
        return [e for e in experts if self.cache is None or (layer, e) not in self.cache]

    def keep(self, layer: int, read: list[tuple[int, Tensors, int]]) -> None:
        """Every read (expert, tensors, bytes) of `layer` in the cache; the layer made resident once all its experts
        are, when the budget holds every expert."""
        if self.cache is None:
            return
        for expert, tensors, nbytes in read:
            self.cache.put((layer, expert), tensors, nbytes)
        if read and self.cache.budget >= self.budget.expert_bytes:
            self._stack(layer)

    def resident(self, layer: int, indices: mx.array, release: Callable[[], None]) -> Tensors | None:
        """`layer`'s stacked experts if it is resident (its call is then counted later), else None.

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
            mx.clear_cache()  # MLX keeps freed buffers for reuse; hand them back to the system
            trim_heap()  # and so does the heap: an expert's small tensors leave holes in it

    def held(self) -> int:
        """What the model holds now besides the cache's tensors, as MLX counts it: its active memory and the freed
        buffers it keeps for reuse (a pass's transients: capped at the working set)."""
        keys = self.cache.keys() if self.cache is not None else []
        tensors = sum(self.tensor_sizes[layer] for layer, _ in keys)
        return mx.get_active_memory() + mx.get_cache_memory() - tensors

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
            spec = self.reader.layers[key[0]]
            if self.cache.put(key, as_stored(loaded.tensors, spec), self.sizes[key[0]], warm=True):
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

    def _stack(self, layer: int) -> None:
        """Stack `layer`'s experts once all are cached; the cache keeps their keys and bytes, not the copies."""
        keys = [(layer, e) for e in range(self.reader.layers[layer].num_experts)]
        experts = self.cache.values(keys)
        if any(tensors is None for tensors in experts):
            return
        names = self.reader.layers[layer].tensors
        stack = {slot.name: mx.stack([tensors[slot.name] for tensors in experts]) for slot in names}
        mx.eval(stack)
        self.stacks[layer] = stack
        for key in keys:
            self.cache.update(key, None)

    def _unstack(self) -> None:
        """Resident layers back to one cache entry per expert (one layer's copy in flight at a time)."""
        for layer, stack in list(self.stacks.items()):
            self._holders.pop(layer, lambda: None)()
            for expert in range(self.reader.layers[layer].num_experts):
                tensors = {name: stacked[expert] for name, stacked in stack.items()}
                mx.eval(tensors)
                self.cache.update((layer, expert), tensors)
            del self.stacks[layer], stack
            mx.clear_cache()
