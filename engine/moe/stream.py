"""Everything behind one model's streaming layers, as parts with one job each, and the layer call that uses them.

    ExpertStream.experts(layer, x, indices)          a streaming layer's call (StreamingSwitch)
      1 read back the router's choice              the MLX stall; in decode, the window a read-ahead can fill;
                                                   Residency.give_back: an auto budget follows the RAM free;
                                                   Residency.settle: evicted experts' rows free (engine/moe/slab.py)
      2 find the cached experts, demand the rest   Residency.found, ExpertReader.demand
      3 run the cached experts                     Landing.run_cached: queued, MLX computes them from here on
      4 guess the next layer, hold the tail        ReadAhead.guess (its router queued at 1: ReadAhead.queue),
                                                   ReadAhead.hold_tail
      5 land the reads                             Landing: each read runs as it lands
      6 read ahead the next layer's guesses        ReadAhead.prefetch: the drives are idle until it asks
      7 count, keep, record (`_account`)           Residency.count (the cache's lookups), Tally (lookups, the
                                                   prompt's needs), ReadAhead.score (recall), Residency.keep
                                                   (cache, stacking), Tally.call, Trace.add: at the next call's
                                                   readback, while MLX computes up to its router

The parts: `ExpertReader` (engine/moe/reader.py: reads in flight, placed over the drives), `Residency`
(engine/moe/residency.py: the cache, resident layers, the warm start, RAM given back), `ReadAhead`
(engine/moe/readahead.py: next-layer guesses, tail, prefetch, recall), `Tally` (engine/moe/figures.py: calls,
lookups, experts read, a prompt's needs), the `Trace` of passes (engine/instruments/trace.py). A resident
layer's call asks `resident` instead and runs as in RAM. A store's routing profile of past runs
(engine/moe/warm.py) is counted from every call and saved at close. A benchmark's `Instruments`
(engine/instruments/probes.py), when the stream is given any, log the calls' routing and supply foreseen guesses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from pathlib import Path

import mlx.core as mx
import numpy as np

from nightshift.engine.instruments.probes import Instruments
from nightshift.engine.instruments.trace import PassTrace, Trace
from nightshift.engine.io.arenas import trim_heap
from nightshift.engine.io.ceilings import Ceilings
from nightshift.engine.io.counters import DriveReadCounters
from nightshift.engine.moe.budget import Budget
from nightshift.engine.moe.dispatch import Dispatcher, estimates_from
from nightshift.engine.moe.figures import CallCounts, DriveFigures, PrefillReads, StreamFigures, Tally
from nightshift.engine.moe.landing import Landing
from nightshift.engine.moe.readahead import ReadAhead
from nightshift.engine.moe.reader import ExpertReader
from nightshift.engine.moe.reads import LoadedExpert, Tensors
from nightshift.engine.moe.residency import Residency, routed
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.warm import RoutingProfile, WarmCounts, load_profile, save_profile
from nightshift.engine.store.manifest import Manifest


def decode_step(shape: tuple[int, ...]) -> bool:
    """Whether router indices of `shape` (..., positions, k) are a decode step: one new position per sequence,
    for one sequence or a batch of them; not a prompt chunk or a speculative verify of several positions."""
    return len(shape) < 2 or shape[-2] == 1


class ExpertStream:
    """One model's streamed experts: reader, residency, read-ahead, tally and trace, and the layer call (`experts`)."""

    def __init__(
        self,
        manifest: Manifest,
        settings: StreamSettings,
        budget: Budget,
        ceilings: Ceilings | None = None,
        instruments: Instruments | None = None,
    ):
        """`budget`: the expert cache's, sized by `budget.size_budget` before the trunk was loaded; `instruments`:
        a benchmark's counters and hooks (engine/instruments/probes.py), None (nothing counted) otherwise."""
        self.manifest = manifest
        self.settings = settings
        self.budget = budget
        self.instruments = instruments
        drives = list(manifest.drives)
        self.counters = DriveReadCounters(drives)
        self.dispatcher = Dispatcher(estimates_from(ceilings, drives), settings.dispatch)
        self.trace = Trace(keep=100_000 if settings.trace else 4096)
        self.reader = ExpertReader(
            manifest, settings, self.dispatcher, self.counters, self.trace.now, self.trace.read_done
        )
        self.tally = Tally(instruments.routing if instruments else None)
        self.residency = Residency(budget, self.reader, self.tally)
        self.ahead = ReadAhead(
            self.reader, self.residency, self.tally.calls, instruments.foresight if instruments else None
        )
        self._profile_store: Path | None = None
        self._unsettled: Callable[[], None] | None = None  # the last layer call's bookkeeping, while still to do
        self.trace.settle = self.settle_accounts

    def experts(
        self,
        layer: int,
        x: mx.array,
        indices: mx.array,
        landed: Callable[[list[int], Tensors, list[int]], None] | None = None,
    ) -> tuple[list[int], np.ndarray, tuple[Tensors, np.ndarray] | None]:
        """The experts `indices` select in `layer`: (sorted unique ids, indices on the host, and without `landed`
        all of them in one stack with each unique id's index in it).

        `landed(places, stack, index)`, if given, is called as soon as experts are here (places: theirs in the
        sorted ids; index: theirs in `stack`): once with the cached ones, then with each read as it lands, so the
        caller can run them while the rest are still being read.
        """
        # The steps of the module docstring, in order.
        record = self.trace.begin(layer)
        host = self._read_back(indices, record)
        step = decode_step(host.shape)
        logits = self.ahead.queue(layer, x, step)  # computed while the rest of this step runs up to `guess`
        self.residency.give_back(layer, record.rows)
        self.residency.settle()
        unique, counts = routed(host)
        cached = self.residency.found(layer, unique)
        chunks = list(self.residency.slabs.layers[layer].chunks)
        landing = Landing(record, unique, cached, chunks, self.reader.layers[layer], landed)
        pending = self.reader.demand(layer, landing.missing)
        self.tally.read.update((layer, e) for e in landing.missing)  # while in flight: the warm start skips them
        self._start(landing, pending)
        guess = self.ahead.guess(layer, logits, host.shape[-1], record, step)
        tail = self.ahead.hold_tail(guess, step)
        read_in_tail = self._land(layer, landing, pending, tail)
        # Only now: the drives are idle until the next layer asks, so its predicted reads take no
        # bandwidth from this layer's own (before the wait or here measured the same on small2).
        if guess is not None:
            self.ahead.prefetch(guess, read_in_tail, record.rows, step)
        self._unsettled = partial(self._account, layer, unique, counts, landing, landing.read())
        return unique, host, None if landed else landing.stacked()

    def resident(self, layer: int, indices: mx.array, release: Callable[[], None]) -> tuple[Tensors, mx.array] | None:
        """`layer`'s slab chunk and its experts' rows in it if it is resident, else None (`Residency.resident`)."""
        return self.residency.resident(layer, indices, release)

    def begin_prefill(self) -> None:
        """Start counting what a prompt needs and what reading it costs (read amplification)."""
        self.settle_accounts()
        self.tally.begin_prefill(self._bytes_read())

    def end_prefill(self) -> PrefillReads:
        """The prompt's reads; and the heap's free pages given back: a prompt pass reads many experts, each freed
        once run (or copied into the cache's slab), and their holes held 13 MB of RSS on moe128-mixtral's bf16
        export after a 16-token prompt."""
        self.settle_accounts()
        trim_heap()
        return self.tally.end_prefill(self._bytes_read(), self.reader.layers)

    def open_profile(self, store: Path) -> None:
        """Count this run into `store`'s routing profile at close; with `warm_start` and a cache, start the
        cache's counts from the profile and fill it with its hottest experts in the background."""
        self._profile_store = store
        profile = load_profile(store)
        if profile is not None and self.settings.warm_start:
            self.residency.warm_from(profile)

    def call_counts(self) -> CallCounts:
        """Streaming layer calls so far, resident ones included (they are counted when asked for)."""
        self.settle_accounts()
        self.residency.count_resident()
        return replace(self.tally.calls)

    def figures(self, settled: bool = False) -> StreamFigures:
        """Counters so far: per-drive bytes and reads, reader counts, cache and prefetch recall, calls (copies).

        `settled`: leave the newest pass's resident calls to a later count. mlx-lm's decode loop builds the next
        token's pass before it yields this one; counting that pass reads its router's choice back, which waits
        for the pass and takes away the overlap of building one token's graph with computing the last (0.89 of
        the store in RAM counting it, 30 adjacent pairs on 2 cores: docs/results.md, [13]).
        """
        self.settle_accounts()
        self.residency.count_resident(keep=len(self.reader.layers) if settled else 0)
        drives = {
            name: DriveFigures(s.bytes, s.reads) for name, s in zip(self.counters.names, self.counters.snapshot())
        }
        needed, hits, read_ahead = self.ahead.recall_counts()
        cache, warm = self.residency.cache, self.residency.warm
        return StreamFigures(
            drives=drives,
            reads=replace(self.reader.counts),
            replica_choices=self.dispatcher.choices,
            cache_hits=cache.hits if cache is not None else 0,
            cache_misses=cache.misses if cache is not None else 0,
            cache_budget=cache.budget if cache is not None else 0,
            cache_used=cache.used if cache is not None else 0,
            cache_evictions=cache.evictions if cache is not None else 0,
            resident_layers=len(self.residency.stacks),
            distinct_experts_read=len(self.tally.read),
            prefetch_recall=hits / needed if needed else 0.0,
            recall_per_layer={layer: round(r.recall, 4) for layer, r in sorted(self.ahead.recall.items())},
            calls=replace(self.tally.calls),
            recall_needed=needed,
            recall_hits=hits,
            recall_read_ahead=read_ahead,
            warm=replace(warm.counts) if warm else WarmCounts(),
            warm_hits=cache.warm_hits if cache is not None else 0,
        )

    def close(self) -> None:
        """Stop the warm start and the reader; add this run's lookups to the store's routing profile."""
        self.settle_accounts()
        self.residency.close()
        self.reader.close()
        self.residency.count_resident()
        if self._profile_store is not None and self.tally.lookups:
            profile = load_profile(self._profile_store) or RoutingProfile()
            experts = {layer: spec.num_experts for layer, spec in self.reader.layers.items()}
            save_profile(self._profile_store, profile.merged(self.tally.lookups), experts)
            self.tally.lookups = {}

    def settle_accounts(self) -> None:
        """Do the last layer call's bookkeeping now, if it is still to do (`_account`)."""
        if self._unsettled is not None:
            account, self._unsettled = self._unsettled, None
            account()

    def _account(
        self, layer: int, unique: list[int], counts: list[int], landing: Landing, read: list[tuple[int, Tensors]]
    ) -> None:
        """A layer call's bookkeeping: its lookups counted (the cache's, the tally's, the guess's recall), its reads
        kept, its trace recorded. Done at the next call's readback while MLX computes up to its router (or when
        figures are asked for): on moe128-mixtral's 4-bit copy the thread that builds the graph spent ~0.2 ms a
        layer call on it while MLX, done with the cached experts, waited for the next layer's graph."""
        rows = landing.record.rows
        self.residency.count(layer, unique, [count / rows for count in counts])
        self.tally.note(layer, unique, rows, counts)
        self.tally.need(layer, unique)
        self.ahead.score(layer, unique)
        self.residency.keep(layer, read)
        self.tally.call(rows, len(unique), landing.record.overlapped)
        self.trace.add(landing.traced())

    def _read_back(self, indices: mx.array, record: PassTrace) -> np.ndarray:
        """The router's choice on the host, timed: evaluating it is where MLX computes up to this router, the last
        call's bookkeeping done meanwhile (`async_eval` returns with up to 10 operations still to run: 0.65 ms of
        compute a layer call on moe128-mixtral's 4-bit copy).

        In a decode step that stall is the compute between one layer's reads landing and this router: the
        window a read-ahead can fill (`ReadAhead.measured`).
        """
        start = time.perf_counter()
        mx.async_eval(indices)
        self.settle_accounts()
        host = np.array(indices)  # evaluates the graph up to the router: the MLX readback stall
        record.readback_s = time.perf_counter() - start
        record.rows = host.size // host.shape[-1]
        if decode_step(host.shape):
            self.ahead.measured(record.rows, record.readback_s)
        return host

    def _start(self, landing: Landing, pending: list[tuple[Future[LoadedExpert], str]]) -> None:
        """The reads are placed: start the wait's clock and, when the caller runs experts as they come, queue the
        cached ones now, so MLX computes them while this step guesses the next layer and waits for its reads (the
        guess and the tail before them left MLX idle ~0.2 ms a layer call on moe128-mixtral's 4-bit copy)."""
        landing.start = time.perf_counter()
        landing.record.asked = landing.start - self.trace.origin
        if landing.landed is not None:
            landing.run_cached(pending)

    def _land(
        self, layer: int, landing: Landing, pending: list[tuple[Future[LoadedExpert], str]], tail: bool
    ) -> set[int]:
        """Wait for the pass's reads, running each expert as it lands when the caller gave `landed`; then
        end the tail (even when a read failed). Returns the next layer's experts the tail read."""
        overlap = landing.landed is not None
        try:
            loaded = self.reader.wait(layer, landing.missing, pending, landing.arrived if overlap else None)
        finally:
            read_in_tail = self.reader.end_tail() if tail else []
        if not overlap:
            landing.record.wait_s = time.perf_counter() - landing.start
        landing.loaded = [expert for expert, _ in loaded]
        return {e for _, e in read_in_tail}

    def _bytes_read(self) -> int:
        return sum(s.bytes for s in self.counters.snapshot())
