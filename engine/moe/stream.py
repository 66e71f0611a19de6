"""Everything behind one model's streaming layers: reads, cache, next-layer prefetch, trace, figures."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nightshift.engine.instruments.trace import CACHE, ExpertRead, PassTrace, Trace
from nightshift.engine.io.ceilings import Ceilings
from nightshift.engine.io.counters import DriveReadCounters
from nightshift.engine.moe.cache import ExpertCache
from nightshift.engine.moe.dispatch import Dispatcher, estimates_from
from nightshift.engine.moe.prefetch import Recall, Router, predict, router_of
from nightshift.engine.moe.reader import ExpertReader, LoadedExpert, Tensors, as_stored
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.store.manifest import Manifest

WINDOW_SMOOTHING = 0.2


@dataclass(frozen=True)
class PrefillReads:
    """One prefill's reads: bytes read from the drives, and the bytes of the distinct experts it needed."""

    bytes_read: int
    unique_bytes: int

    @property
    def amplification(self) -> float:
        return self.bytes_read / self.unique_bytes if self.unique_bytes else 0.0


@dataclass
class NextLayer:
    """The MoE layer after a given one, and (once resolved against a real hidden state) its router."""

    layer: int
    block: nn.Module
    num_experts: int
    router: Router | None = None
    resolved: bool = False


@dataclass(frozen=True)
class Guess:
    """The experts a layer is predicted to ask for, most confident first."""

    layer: int
    experts: list[int]


@dataclass
class CallCounts:
    """Streaming layer calls, the rows they carried and the unique experts they selected (summed over calls).

    unique / calls is the mean number of experts one layer call reads: 1 row needs top-k, a speculative
    verify of k+1 rows needs the union of theirs.
    """

    calls: int = 0
    rows: int = 0
    unique: int = 0
    overlapped: int = 0  # experts run while others of their pass were still being read (the overlap proof)


class ExpertStream:
    def __init__(self, manifest: Manifest, settings: StreamSettings, ceilings: Ceilings | None = None):
        self.manifest = manifest
        self.settings = settings
        drives = list(manifest.drives)
        self.counters = DriveReadCounters(drives)
        self.dispatcher = Dispatcher(estimates_from(ceilings, drives), settings.dispatch)
        self.trace = Trace(keep=100_000 if settings.trace else 4096)
        self.reader = ExpertReader(manifest, settings, self.dispatcher, self.counters, self.trace.now)
        self.cache: ExpertCache[Tensors] | None = (
            ExpertCache(settings.cache_bytes, settings.cache_policy) if settings.cache_bytes else None
        )
        self.recall: dict[int, Recall] = {}
        self._next: dict[int, NextLayer] = {}
        self._predicted: dict[int, set[int]] = {}
        self._prefill_needed: set[tuple[int, int]] | None = None
        self._window: float | None = None  # seconds, smoothed readback of one-row passes
        self._prefill_bytes_at = 0
        self.calls = CallCounts()

    def follow(self, layer: int, next_layer: int, block: nn.Module, num_experts: int) -> None:
        """Declare that `next_layer` (its MoE block `block`) follows `layer`: its router predicts from here."""
        self._next[layer] = NextLayer(next_layer, block, num_experts)

    def experts(
        self, layer: int, x: mx.array, indices: mx.array, landed: Callable[[int, Tensors], None] | None = None
    ) -> tuple[list[int], np.ndarray, list[Tensors]]:
        """The experts `indices` select in `layer`: (sorted unique ids, indices on the host, their tensors).

        `landed(i, tensors)`, if given, is called for each expert (i: its place in the sorted ids) as soon as
        it is here: cached ones first, then each read as it lands, so the caller can run it while the rest
        are still being read.
        """
        record = self.trace.begin(layer)
        start = time.perf_counter()
        host = np.array(indices)  # evaluates the graph up to the router: the MLX readback stall
        record.readback_s = time.perf_counter() - start
        unique = np.unique(host).tolist()
        record.rows = host.size // host.shape[-1]
        if record.rows == 1:  # the compute window a decode step's read-ahead can fill (see _window_fill)
            w = record.readback_s
            self._window = w if self._window is None else self._window + WINDOW_SMOOTHING * (w - self._window)
        if self._prefill_needed is not None:
            self._prefill_needed.update((layer, e) for e in unique)
        self._score(layer, unique)
        found = {e: t for e in unique if (t := self._cached(layer, e)) is not None}
        missing = [e for e in unique if e not in found]
        spec = self.reader.layers[layer]
        pending = self.reader.demand(layer, missing)
        guess = self._guess_next(layer, x, host.shape[-1], record)
        tail = guess is not None and record.rows == 1 and self.settings.prefetch_tail
        if tail:
            held = self._uncached(guess.layer, guess.experts)[: self.settings.prefetch_limit or None]
            self.reader.hold_tail(guess.layer, held)
        start = time.perf_counter()
        place = {e: i for i, e in enumerate(unique)}

        def run(expert: int, still_reading: int) -> None:
            began = time.perf_counter()
            landed(place[expert], found[expert])
            record.expert_s += time.perf_counter() - began
            record.overlapped += still_reading > 0

        def arrived(i: int, loaded: LoadedExpert, still_reading: int) -> None:
            record.wait_s = time.perf_counter() - start
            found[missing[i]] = as_stored(loaded.tensors, spec)
            run(missing[i], still_reading)

        if landed is not None:
            for expert in list(found):
                run(expert, sum(not future.done() for future, _ in pending))
        try:
            landed_all = self.reader.wait(layer, missing, pending, arrived if landed is not None else None)
        finally:
            read_in_tail = self.reader.end_tail() if tail else []
        if landed is None:
            record.wait_s = time.perf_counter() - start
        # Only now: the drives are idle until the next layer asks, so its predicted reads take no
        # bandwidth from this layer's own (before the wait or here measured the same on small2).
        if guess is not None:
            self._prefetch_next(guess, {e for _, e in read_in_tail}, record)
        for expert, (loaded, _) in zip(missing, landed_all):
            if expert not in found:
                found[expert] = as_stored(loaded.tensors, spec)
            record.reads.append(loaded.read)
            if self.cache is not None:
                self.cache.put((layer, expert), found[expert], loaded.nbytes)
        record.reads += [ExpertRead(e, CACHE) for e in unique if e not in missing]
        self._count(record, unique)
        self.trace.add(record)
        return unique, host, [found[e] for e in unique]

    def begin_prefill(self) -> None:
        """Start counting what a prompt needs and what reading it costs (read amplification)."""
        self._prefill_needed = set()
        self._prefill_bytes_at = self._bytes_read()

    def end_prefill(self) -> PrefillReads:
        needed, self._prefill_needed = self._prefill_needed or set(), None
        unique = sum(self.reader.layers[layer].file_bytes for layer, _ in needed)
        return PrefillReads(self._bytes_read() - self._prefill_bytes_at, unique)

    def _bytes_read(self) -> int:
        return sum(s.bytes for s in self.counters.snapshot())

    def figures(self) -> dict:
        """Counters so far: per-drive bytes and reads, reader counts, cache and prefetch recall."""
        drives = {
            name: {"bytes": s.bytes, "reads": s.reads} for name, s in zip(self.counters.names, self.counters.snapshot())
        }
        needed = sum(r.needed for r in self.recall.values())
        hits = sum(r.predicted_hits for r in self.recall.values())
        return {
            "drives": drives,
            "reads": {**vars(self.reader.counts), "replica_choices": self.dispatcher.choices},
            "cache_hits": self.cache.hits if self.cache else 0,
            "cache_misses": self.cache.misses if self.cache else 0,
            "prefetch_recall": hits / needed if needed else 0.0,
            "recall_per_layer": {layer: round(r.recall, 4) for layer, r in sorted(self.recall.items())},
            "calls": vars(self.calls).copy(),
        }

    def close(self) -> None:
        self.reader.close()

    def _count(self, record: PassTrace, unique: list[int]) -> None:
        self.calls.calls += 1
        self.calls.rows += record.rows
        self.calls.unique += len(unique)
        self.calls.overlapped += record.overlapped

    def _cached(self, layer: int, expert: int) -> Tensors | None:
        return self.cache.get((layer, expert)) if self.cache is not None else None

    def _score(self, layer: int, needed: list[int]) -> None:
        """Recall of the prediction made for this layer, if one was."""
        predicted = self._predicted.pop(layer, None)
        if predicted is None:
            return
        recall = self.recall.setdefault(layer, Recall())
        recall.needed += len(needed)
        recall.predicted += len(predicted)
        recall.predicted_hits += len(predicted.intersection(needed))

    def _window_fill(self, layer: int) -> int | None:
        """How many of `layer`'s experts the drives can read while the model computes up to its router.

        The window is the readback time of recent one-row passes (the compute between one layer's reads
        landing and the next layer's router); beyond what fits in it, a wrong guess only takes bandwidth
        from the demands that follow. None until a window has been measured.
        """
        if self._window is None:
            return None
        in_use = set(self.settings.use_drives or self.manifest.drives)
        return max(1, int(self._window * self.dispatcher.bandwidth(in_use) / self.reader.layers[layer].file_bytes))

    def _guess_next(self, layer: int, x: mx.array, k: int, record: PassTrace) -> Guess | None:
        """The next MoE layer's experts as predicted from `x`, or None where this pass does not read ahead."""
        nxt = self._next.get(layer)
        wanted_here = self.settings.prefetch or (record.rows > 1 and self.settings.prefill_prefetch)
        if nxt is None or not wanted_here or nxt.layer in self.settings.prefetch_off:
            return None
        if not nxt.resolved:
            nxt.router, nxt.resolved = router_of(nxt.block, nxt.num_experts, x.shape[-1]), True
        if nxt.router is None:
            return None
        start = time.perf_counter()
        experts = predict(nxt.router, x, k)
        record.predict_s = time.perf_counter() - start
        return Guess(nxt.layer, experts)

    def _uncached(self, layer: int, experts: list[int]) -> list[int]:
        return [e for e in experts if self.cache is None or (layer, e) not in self.cache]

    def _prefetch_next(self, guess: Guess, read_in_tail: set[int], record: PassTrace) -> None:
        """Start reading the guessed experts not cached nor already read in this pass's tail, within the caps."""
        limit = max(0, self.settings.prefetch_limit - len(read_in_tail)) if self.settings.prefetch_limit else None
        fill = self._window_fill(guess.layer) if record.rows == 1 and self.settings.prefetch_fill else None
        caps = [c for c in (limit, fill) if c is not None]
        rest = [e for e in guess.experts if e not in read_in_tail]
        ahead = rest[: min(caps)] if caps else rest
        self._predicted[guess.layer] = set(ahead) | read_in_tail
        self.reader.prefetch(guess.layer, self._uncached(guess.layer, ahead))
