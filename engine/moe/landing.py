"""One pass's experts as they come: the cached ones first, then each read as it lands."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from nightshift.engine.instruments.trace import CACHE, ExpertRead, PassTrace
from nightshift.engine.moe.reads import LoadedExpert, Tensors, as_stored
from nightshift.engine.store.manifest import MoeLayer


@dataclass
class Landing:
    """One pass's experts as they come: `found` holds the cached ones (their rows in `chunks`, the layer's slab's
    as they were at the lookup: no later put writes these rows), then each read as it lands.

    With a `landed` callback the experts run the moment they are here, timed into the trace, while the other reads
    are still in flight (the overlap): the cached ones handed over together, then each read as it lands, each time
    as `landed(places, stack, index)`: their places in `unique`, a stack holding them (a chunk of the slab, or a
    read expert as a stack of one) and each one's index in it. Without one, the pass only waits and the layer runs
    them `stacked`.
    """

    record: PassTrace
    unique: list[int]  # the pass's experts, sorted; `landed` is told their places in this list
    found: dict[int, Tensors | tuple[int, int]]  # an expert's tensors as read, or a cached one's (chunk, row)
    chunks: list[Tensors]
    spec: MoeLayer
    landed: Callable[[list[int], Tensors, list[int]], None] | None
    missing: list[int] = field(init=False)  # not cached: read from the drives, in `unique` order
    loaded: list[LoadedExpert] = field(default_factory=list)  # the reads of `missing`, once all have landed
    start: float = 0.0  # when the wait began (perf_counter)
    _place: dict[int, int] = field(init=False, repr=False)  # expert -> its place in `unique`

    def __post_init__(self) -> None:
        self.missing = [e for e in self.unique if e not in self.found]
        self._place = {e: i for i, e in enumerate(self.unique)}

    def run_cached(self, pending: list[tuple[Future[LoadedExpert], str]]) -> None:
        """Run the cached experts first (handed over together): their compute overlaps every read still in flight."""
        if self.found:
            self._run(list(self.found), sum(not future.done() for future, _ in pending))

    def arrived(self, i: int, loaded: LoadedExpert, still_reading: int) -> None:
        """The reader's callback as the `i`th missing expert lands: view it in its stored dtypes and run it."""
        self.record.wait_s = time.perf_counter() - self.start
        self.found[self.missing[i]] = as_stored(loaded.tensors, self.spec)
        self._run([self.missing[i]], still_reading)

    def read(self) -> list[tuple[int, Tensors]]:
        """(expert, tensors as read) of every read expert, once all have landed (those not run as they landed are
        viewed in their dtypes into `found` here)."""
        for expert, loaded in zip(self.missing, self.loaded):
            if expert not in self.found:
                self.found[expert] = as_stored(loaded.tensors, self.spec)
        return [(expert, loaded.tensors) for expert, loaded in zip(self.missing, self.loaded)]

    def traced(self) -> PassTrace:
        """The pass's trace record with its reads, in demand order, then its cache hits."""
        self.record.reads += [loaded.read for loaded in self.loaded]
        self.record.reads += [ExpertRead(e, CACHE) for e in self.unique if e not in self.missing]
        return self.record

    def stacked(self) -> tuple[Tensors, np.ndarray]:
        """Every expert of the pass in one stack (the cached ones gathered from the slab, then the read ones), and
        the index in it of each expert in `unique` order."""
        cached = sorted((e for e in self.unique if isinstance(self.found[e], tuple)), key=self.found.__getitem__)
        parts = []
        for chunk, rows in self._by_chunk(cached):
            index = mx.array(np.array(rows, dtype=np.uint32))
            parts.append({name: t[index] for name, t in self.chunks[chunk].items()})
        if self.missing:
            names = [slot.name for slot in self.spec.tensors]
            parts.append({name: mx.stack([self.found[e][name] for e in self.missing]) for name in names})
        stack = parts[0] if len(parts) == 1 else {name: mx.concatenate([p[name] for p in parts]) for name in parts[0]}
        index = np.empty(len(self.unique), dtype=np.uint32)
        index[[self._place[e] for e in cached + self.missing]] = np.arange(len(self.unique))
        return stack, index

    def _by_chunk(self, cached: list[int]) -> list[tuple[int, list[int]]]:
        """Cached experts (sorted by their place in the slab) as (chunk, their rows in it), chunk by chunk."""
        out: list[tuple[int, list[int]]] = []
        for expert in cached:
            chunk, row = self.found[expert]
            if not out or out[-1][0] != chunk:
                out.append((chunk, []))
            out[-1][1].append(row)
        return out

    def _run(self, experts: list[int], still_reading: int) -> None:
        began = time.perf_counter()
        places = [self._place[e] for e in experts]
        if not isinstance(self.found[experts[0]], tuple):  # one read expert, as it landed
            self.landed(places, {name: t[None] for name, t in self.found[experts[0]].items()}, [0])
        else:  # the cached ones: a call a chunk
            order = sorted(range(len(experts)), key=lambda i: self.found[experts[i]])
            start = 0
            for chunk, rows in self._by_chunk([experts[i] for i in order]):
                self.landed([places[i] for i in order[start : start + len(rows)]], self.chunks[chunk], rows)
                start += len(rows)
        self.record.expert_s += time.perf_counter() - began
        self.record.overlapped += len(experts) * (still_reading > 0)
