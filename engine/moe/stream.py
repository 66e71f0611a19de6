"""Everything behind one model's streaming layers: reads, cache, next-layer prefetch, trace, figures.

One layer call (`ExpertStream.experts`) takes these steps, in this order:

1. read back the router's choice (the MLX stall, and in decode the compute window a read-ahead can fill);
2. count what the pass needs (the prompt's unique experts, the recall of this layer's prediction);
3. look the experts up in the RAM cache and place demand reads of the rest;
4. guess the next layer's experts and hold the most confident for drives that finish early (the tail);
5. land the experts: the cached ones run first, together, then each read as it lands, while the others are
   still being read;
6. prefetch the next layer's guesses, now that the drives are idle;
7. keep what was read in the cache, and record the pass.

When the cache's budget holds every expert of the model, a layer whose experts have all been read is made
resident: its experts are stacked once (as the model held in RAM has them) and its calls skip all of the
above, running the family's switch on the stack with the router's own indices, as in RAM; their lookups are
counted as cache hits afterwards (`figures()`), from the indices once evaluated, so nothing waits on them.
A store's routing profile of past runs (engine/moe/warm.py) is counted from every call and saved at close;
with `warm_start`, the cache is filled from it at open in the background, each expert kept at the next layer
call (`_take_warm`), and its counts start from it.
An auto budget is checked against the RAM available now and then (`budget.Pressure`); when another process
takes RAM, resident layers are unstacked and the cache evicts down to what is left.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nightshift.engine.instruments.trace import CACHE, ExpertRead, PassTrace, Trace
from nightshift.engine.io.ceilings import Ceilings
from nightshift.engine.io.counters import DriveReadCounters
from nightshift.engine.moe.budget import Budget, Pressure
from nightshift.engine.moe.cache import ExpertCache
from nightshift.engine.moe.dispatch import Dispatcher, estimates_from
from nightshift.engine.moe.prefetch import Recall, Router, predict, router_of
from nightshift.engine.moe.reader import ExpertReader
from nightshift.engine.moe.reads import LoadedExpert, ReadCounts, Tensors, as_stored
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.warm import RoutingProfile, WarmCounts, WarmFill, load_profile, save_profile
from nightshift.engine.store.manifest import Manifest, MoeLayer

WINDOW_SMOOTHING = 0.2
RESIDENT_BACKLOG, RESIDENT_KEEP = 1024, 64  # resident calls held before counting; the newest left to evaluate


def decode_step(shape: tuple[int, ...]) -> bool:
    """Whether router indices of `shape` (..., positions, k) are a decode step: one new position per sequence,
    for one sequence or a batch of them; not a prompt chunk or a speculative verify of several positions."""
    return len(shape) < 2 or shape[-2] == 1


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


@dataclass(frozen=True)
class DriveFigures:
    """What one drive has delivered so far."""

    bytes: int
    reads: int


@dataclass(frozen=True)
class StreamFigures:
    """A stream's counters at one moment, typed for the caller (made JSON only where a record is written).

    drives: bytes and reads completed per drive name.
    reads: what the reader did (demand, prefetch, joined, split, fallbacks, ...): config assertions check these.
    replica_choices: reads that had more than one replica to choose from (where the dispatch policy mattered).
    cache_hits, cache_misses: lookups in the RAM expert cache (0 without one).
    warm: what the warm start read and kept (engine/moe/warm.py); warm_hits: lookups it served.
    cache_budget, cache_used: the cache's budget now (auto: lowered while another process needs the RAM)
    and the bytes it holds; resident_layers: layers held stacked, as in RAM; cache_evictions.
    distinct_experts_read: (layer, expert) pairs read and used; with the drives' reads summed, the proof that
    no expert was read twice (equal when split reads are off).
    prefetch_recall: of the experts predicted layers needed, the share their prediction had named
        (recall_hits of recall_needed: the counts, so a caller can take the recall of a stretch of them).
    recall_per_layer: the same per predicted layer, rounded to 4 places.
    calls: streaming layer calls, the rows they carried, their unique and overlapped experts.
    """

    drives: dict[str, DriveFigures]
    reads: ReadCounts
    replica_choices: int
    cache_hits: int
    cache_misses: int
    cache_budget: int
    cache_used: int
    cache_evictions: int
    resident_layers: int
    distinct_experts_read: int
    prefetch_recall: float
    recall_per_layer: dict[int, float]
    calls: CallCounts
    recall_needed: int = 0
    recall_hits: int = 0
    warm: WarmCounts = field(default_factory=WarmCounts)
    warm_hits: int = 0

    @property
    def bytes_read(self) -> int:
        """Bytes read from all drives together."""
        return sum(d.bytes for d in self.drives.values())

    @property
    def cache_hit_rate(self) -> float:
        lookups = self.cache_hits + self.cache_misses
        return self.cache_hits / lookups if lookups else 0.0


@dataclass
class Landing:
    """One pass's experts as they come: `found` holds the cached ones, then each read as it lands.

    With a `landed` callback the experts run the moment they are here, timed into the trace, while the other
    reads are still in flight (the overlap): the cached ones handed over together, then each read as it lands;
    without one, the pass only waits and the layer runs them stacked.
    """

    record: PassTrace
    unique: list[int]  # the pass's experts, sorted; `landed` is told their places in this list
    found: dict[int, Tensors]
    spec: MoeLayer
    landed: Callable[[list[int], list[Tensors]], None] | None
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

    def _run(self, experts: list[int], still_reading: int) -> None:
        began = time.perf_counter()
        self.landed([self._place[e] for e in experts], [self.found[e] for e in experts])
        self.record.expert_s += time.perf_counter() - began
        self.record.overlapped += len(experts) * (still_reading > 0)


class ExpertStream:
    """One model's streamed experts: the reader and its drives, the RAM cache, next-layer guesses, trace and counts.

    Every streaming MoE layer of the model calls `experts` once per forward pass (see the module docstring).
    """

    def __init__(self, manifest: Manifest, settings: StreamSettings, budget: Budget, ceilings: Ceilings | None = None):
        """`budget`: the expert cache's, sized by `budget.size_budget` before the trunk was loaded."""
        self.manifest = manifest
        self.settings = settings
        drives = list(manifest.drives)
        self.counters = DriveReadCounters(drives)
        self.dispatcher = Dispatcher(estimates_from(ceilings, drives), settings.dispatch)
        self.trace = Trace(keep=100_000 if settings.trace else 4096)
        self.reader = ExpertReader(manifest, settings, self.dispatcher, self.counters, self.trace.now)
        self.budget = budget
        self.cache: ExpertCache[Tensors | None] | None = (
            ExpertCache(budget.bytes, settings.cache_policy) if budget.bytes else None
        )
        self.pressure = Pressure(budget) if budget.auto and budget.bytes else None
        self.stacks: dict[int, Tensors] = {}  # resident layers: every expert stacked, as in RAM
        self._holders: dict[int, Callable[[], None]] = {}  # layer -> how its switch lets go of the stack
        self._resident_calls: list[tuple[int, mx.array]] = []  # (layer, indices) not yet counted as hits
        self._read: set[tuple[int, int]] = set()  # experts read and used: drive reads beyond these are re-reads
        self.routing: list[tuple[int, tuple[int, ...], int]] | None = None  # see record_routing
        self._foresight: list[tuple[int, tuple[int, ...]]] | None = None  # see foresee
        self.lookups: dict[tuple[int, int], int] = {}  # lookups per (layer, expert): the profile's, at close
        self.warm: WarmFill | None = None
        self._warm_taken = False  # every warm read kept: nothing left to look for
        self._profile_store: Path | None = None
        self.recall: dict[int, Recall] = {}
        self._next: dict[int, NextLayer] = {}
        self._predicted: dict[int, set[int]] = {}
        self._prefill_needed: set[tuple[int, int]] | None = None
        self._windows: dict[int, float] = {}  # rows -> seconds, smoothed readback of decode steps that wide
        self._prefill_bytes_at = 0
        self.calls = CallCounts()

    def follow(self, layer: int, next_layer: int, block: nn.Module, num_experts: int) -> None:
        """Declare that `next_layer` (its MoE block `block`) follows `layer`: its router predicts from here."""
        self._next[layer] = NextLayer(next_layer, block, num_experts)

    def experts(
        self,
        layer: int,
        x: mx.array,
        indices: mx.array,
        landed: Callable[[list[int], list[Tensors]], None] | None = None,
    ) -> tuple[list[int], np.ndarray, list[Tensors]]:
        """The experts `indices` select in `layer`: (sorted unique ids, indices on the host, their tensors).

        `landed(places, tensors)`, if given, is called as soon as experts are here (places: theirs in the sorted
        ids): once with the cached ones, then with each read as it lands, so the caller can run them while the
        rest are still being read.
        """
        # Mirrors the steps in the module docstring; each helper's docstring says why it runs where it does.
        self._give_back()
        record = self.trace.begin(layer)
        host = self._read_back(indices, record)
        step = decode_step(host.shape)
        unique = np.unique(host).tolist()
        self._note(layer, unique, record.rows)
        self._count_needed(layer, unique)
        landing = Landing(record, unique, self._look_up(layer, unique), self.reader.layers[layer], landed)
        pending = self.reader.demand(layer, landing.missing)
        self._read.update((layer, e) for e in landing.missing)  # while in flight: the warm start skips them
        guess = self._guess_next(layer, x, host.shape[-1], record, step)
        tail = self._hold_tail(guess, step)
        read_in_tail = self._land(layer, landing, pending, tail)
        # Only now: the drives are idle until the next layer asks, so its predicted reads take no
        # bandwidth from this layer's own (before the wait or here measured the same on small2).
        if guess is not None:
            self._prefetch_next(guess, read_in_tail, record, step)
        self._keep(layer, landing)
        self._record(landing)
        return unique, host, [landing.found[e] for e in unique]

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

    def open_profile(self, store: Path) -> None:
        """Count this run into `store`'s routing profile at close; with `warm_start` and a cache, start the
        cache's counts from the profile and fill it with its hottest experts in the background."""
        self._profile_store = store
        profile = load_profile(store)
        if profile is None or self.cache is None or not self.settings.warm_start:
            return
        self.cache.prior(profile.prior())
        sizes = {layer: spec.file_bytes for layer, spec in self.reader.layers.items()}
        window = self.settings.prefetch_threads * len(self.settings.use_drives or self.manifest.drives)
        self.warm = WarmFill(self.reader, profile.hottest(sizes, self.cache.budget), window, self._read.__contains__)

    def record_routing(self) -> None:
        """From now on, log every call's (layer, sorted unique experts, rows) in `self.routing`, in the order
        the cache is asked (`nightshift bench cache` replays it). Resident calls are logged when counted."""
        self.routing = []

    def foresee(self, calls: list[tuple[int, tuple[int, ...]]]) -> None:
        """Guess each next layer's experts from `calls` instead of its router: a recorded run's (layer, experts)
        in call order from its open on (`record_routing`), found by this stream's own call count. The same
        prompt decoded greedily asks the same, so every guess is right and a decode measures what prediction
        could gain at most (`bench cache --foresight`). Resident layers' calls are counted late: meant for
        budgets under the expert bytes, where no layer is stacked."""
        self._foresight = calls

    def resident(self, layer: int, indices: mx.array, release: Callable[[], None]) -> Tensors | None:
        """`layer`'s stacked experts if it is resident (its call is then counted later), else None.

        The caller may keep the stack between calls; `release()` is how it lets go when the layer stops being
        resident. Also where memory pressure is looked at: a resident model calls nothing else of the stream.
        """
        self._give_back()
        self._take_warm()
        stack = self.stacks.get(layer)
        if stack is not None:
            self._holders[layer] = release
            self._resident_calls.append((layer, indices))
            if len(self._resident_calls) > RESIDENT_BACKLOG:
                self._count_resident(keep=RESIDENT_KEEP)
        return stack

    def call_counts(self) -> CallCounts:
        """Streaming layer calls so far, resident ones included (they are counted when asked for)."""
        self._count_resident()
        return replace(self.calls)

    def figures(self, settled: bool = False) -> StreamFigures:
        """Counters so far: per-drive bytes and reads, reader counts, cache and prefetch recall, calls (copies).

        `settled`: leave the newest pass's resident calls to a later count. mlx-lm's decode loop builds the next
        token's pass before it yields this one; counting that pass reads its router's choice back, which waits
        for the pass and takes away the overlap of building one token's graph with computing the last (0.89 of
        the store in RAM counting it, 30 adjacent pairs on 2 cores: docs/results.md, [13]).
        """
        self._count_resident(keep=len(self.reader.layers) if settled else 0)
        drives = {
            name: DriveFigures(s.bytes, s.reads) for name, s in zip(self.counters.names, self.counters.snapshot())
        }
        needed = sum(r.needed for r in self.recall.values())
        hits = sum(r.predicted_hits for r in self.recall.values())
        return StreamFigures(
            drives=drives,
            reads=replace(self.reader.counts),
            replica_choices=self.dispatcher.choices,
            cache_hits=self.cache.hits if self.cache else 0,
            cache_misses=self.cache.misses if self.cache else 0,
            cache_budget=self.cache.budget if self.cache else 0,
            cache_used=self.cache.used if self.cache else 0,
            cache_evictions=self.cache.evictions if self.cache else 0,
            resident_layers=len(self.stacks),
            distinct_experts_read=len(self._read),
            prefetch_recall=hits / needed if needed else 0.0,
            recall_per_layer={layer: round(r.recall, 4) for layer, r in sorted(self.recall.items())},
            calls=replace(self.calls),
            recall_needed=needed,
            recall_hits=hits,
            warm=replace(self.warm.counts) if self.warm else WarmCounts(),
            warm_hits=self.cache.warm_hits if self.cache else 0,
        )

    def close(self) -> None:
        """Stop the warm start and the reader; add this run's lookups to the store's routing profile."""
        if self.warm is not None:
            self.warm.close()
        self.reader.close()
        self._count_resident()
        if self._profile_store is not None and self.lookups:
            profile = load_profile(self._profile_store) or RoutingProfile()
            experts = {layer: spec.num_experts for layer, spec in self.reader.layers.items()}
            save_profile(self._profile_store, profile.merged(self.lookups), experts)
            self.lookups = {}

    def _read_back(self, indices: mx.array, record: PassTrace) -> np.ndarray:
        """The router's choice on the host, timed: evaluating it is where MLX computes up to this router.

        In a decode step that stall is the compute between one layer's reads landing and this router: the
        window a read-ahead can fill, smoothed over recent steps of as many rows (see `_window_fill`).
        """
        start = time.perf_counter()
        host = np.array(indices)  # evaluates the graph up to the router: the MLX readback stall
        record.readback_s = time.perf_counter() - start
        record.rows = host.size // host.shape[-1]
        if decode_step(host.shape):
            w, old = record.readback_s, self._windows.get(record.rows)
            self._windows[record.rows] = w if old is None else old + WINDOW_SMOOTHING * (w - old)
        return host

    def _count_needed(self, layer: int, unique: list[int]) -> None:
        """Count the experts this pass needs: toward the prompt's unique bytes while prefilling, and against
        the prediction made for this layer, if one was (its recall)."""
        if self._prefill_needed is not None:
            self._prefill_needed.update((layer, e) for e in unique)
        predicted = self._predicted.pop(layer, None)
        if predicted is None:
            return
        recall = self.recall.setdefault(layer, Recall())
        recall.needed += len(unique)
        recall.predicted_hits += len(predicted.intersection(unique))

    def _look_up(self, layer: int, unique: list[int]) -> dict[int, Tensors]:
        """The experts of `unique` the RAM cache holds (each lookup counts as a hit or a miss)."""
        if self.cache is None:
            return {}
        return {e: t for e in unique if (t := self.cache.get((layer, e))) is not None}

    def _guess_next(self, layer: int, x: mx.array, k: int, record: PassTrace, step: bool) -> Guess | None:
        """The next MoE layer's experts as predicted from `x`, or None where this pass does not read ahead."""
        nxt = self._next.get(layer)
        wanted_here = self.settings.prefetch or (not step and self.settings.prefill_prefetch)
        if nxt is None or not wanted_here or nxt.layer in self.settings.prefetch_off:
            return None
        if self._foresight is not None:  # this call is counted when it ends: the next one's place is one on
            after = self.calls.calls + 1
            known = self._foresight[after] if after < len(self._foresight) else None
            return Guess(nxt.layer, list(known[1])) if known is not None and known[0] == nxt.layer else None
        if not nxt.resolved:
            nxt.router, nxt.resolved = router_of(nxt.block, nxt.num_experts, x.shape[-1]), True
        if nxt.router is None:
            return None
        start = time.perf_counter()
        experts = predict(nxt.router, x, k)
        record.predict_s = time.perf_counter() - start
        return Guess(nxt.layer, experts)

    def _hold_tail(self, guess: Guess | None, step: bool) -> bool:
        """In a decode step, hold the guessed experts not cached (within the prefetch limit) for drives done
        with their share of this layer while another still reads; True when held (`_land` ends the tail)."""
        if guess is None or not step or not self.settings.prefetch_tail:
            return False
        held = self._uncached(guess.layer, guess.experts)[: self.settings.prefetch_limit or None]
        self.reader.hold_tail(guess.layer, held)
        return True

    def _land(
        self, layer: int, landing: Landing, pending: list[tuple[Future[LoadedExpert], str]], tail: bool
    ) -> set[int]:
        """Wait for the pass's reads, running each expert as it lands when the caller gave `landed`; then
        end the tail (even when a read failed). Returns the next layer's experts the tail read."""
        overlap = landing.landed is not None
        landing.start = time.perf_counter()
        if overlap:
            landing.run_cached(pending)
        try:
            loaded = self.reader.wait(layer, landing.missing, pending, landing.arrived if overlap else None)
        finally:
            read_in_tail = self.reader.end_tail() if tail else []
        if not overlap:
            landing.record.wait_s = time.perf_counter() - landing.start
        landing.loaded = [expert for expert, _ in loaded]
        return {e for _, e in read_in_tail}

    def _uncached(self, layer: int, experts: list[int]) -> list[int]:
        return [e for e in experts if self.cache is None or (layer, e) not in self.cache]

    def _prefetch_next(self, guess: Guess, read_in_tail: set[int], record: PassTrace, step: bool) -> None:
        """Start reading the guessed experts not cached nor already read in this pass's tail, within the caps."""
        limit = max(0, self.settings.prefetch_limit - len(read_in_tail)) if self.settings.prefetch_limit else None
        fill = self._window_fill(guess.layer, record.rows) if step and self.settings.prefetch_fill else None
        caps = [c for c in (limit, fill) if c is not None]
        rest = [e for e in guess.experts if e not in read_in_tail]
        ahead = rest[: min(caps)] if caps else rest
        self._predicted[guess.layer] = set(ahead) | read_in_tail
        self.reader.prefetch(guess.layer, self._uncached(guess.layer, ahead))

    def _window_fill(self, layer: int, rows: int) -> int | None:
        """How many of `layer`'s experts the drives can read while the model computes up to its router.

        The window is the readback time of recent decode steps of `rows` rows (the compute between one layer's
        reads landing and the next layer's router, longer with more rows); beyond what fits in it, a wrong guess
        only takes bandwidth from the demands that follow. None until a window has been measured.
        """
        window = self._windows.get(rows)
        if window is None:
            return None
        in_use = set(self.settings.use_drives or self.manifest.drives)
        return max(1, int(window * self.dispatcher.bandwidth(in_use) / self.reader.layers[layer].file_bytes))

    def _keep(self, layer: int, landing: Landing) -> None:
        """Every read expert in its stored dtypes (those not already run as they landed), and in the cache;
        the layer made resident once all its experts are, when the budget holds every expert."""
        for expert, loaded in zip(landing.missing, landing.loaded):
            if expert not in landing.found:
                landing.found[expert] = as_stored(loaded.tensors, landing.spec)
            if self.cache is not None:
                self.cache.put((layer, expert), landing.found[expert], loaded.nbytes)
        if self.cache is not None and landing.missing and self.cache.budget >= self.budget.expert_bytes:
            self._stack(layer)

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

    def _take_warm(self) -> None:
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
            self._read.add(key)
            spec = self.reader.layers[key[0]]
            if self.cache.put(key, as_stored(loaded.tensors, spec), loaded.nbytes, warm=True):
                self.warm.counts.kept += 1
                self.warm.counts.kept_bytes += loaded.nbytes
                layers.add(key[0])
        if self.cache.budget >= self.budget.expert_bytes:  # as `_keep` does
            for layer in layers - set(self.stacks):
                self._stack(layer)

    def _note(self, layer: int, unique: list[int], rows: int) -> None:
        """One call's experts into the routing profile's count (and the routing log, when recording)."""
        for expert in unique:
            self.lookups[(layer, expert)] = self.lookups.get((layer, expert), 0) + 1
        if self.routing is not None:
            self.routing.append((layer, tuple(unique), rows))

    def _give_back(self) -> None:
        """Follow an auto budget to the RAM available now: evict down when another process took RAM."""
        if self.pressure is None:
            return
        budget = self.pressure.budget_now(self.cache.used)
        if budget is None or budget == self.cache.budget:
            return
        if budget < self.budget.expert_bytes and self.stacks:
            self._count_resident()
            self._unstack()
        if self.cache.resize(budget):
            mx.clear_cache()  # MLX keeps freed buffers for reuse; hand them back to the system

    def _count_resident(self, keep: int = 0) -> None:
        """Count the lookups of resident calls (all but the last `keep`) as cache hits: their indices are
        evaluated by now, as the tokens that used them have been."""
        counted = self._resident_calls[: len(self._resident_calls) - keep]
        del self._resident_calls[: len(counted)]
        for layer, indices in counted:
            host = np.array(indices)
            unique = np.unique(host).tolist()
            self._note(layer, unique, host.size // host.shape[-1])
            self.cache.get_many([(layer, expert) for expert in unique])
            self.calls.calls += 1
            self.calls.rows += host.size // host.shape[-1]
            self.calls.unique += len(unique)

    def _record(self, landing: Landing) -> None:
        """The pass into the trace (its reads in demand order, then the cache hits) and into the call counts."""
        record = landing.record
        record.reads += [loaded.read for loaded in landing.loaded]
        record.reads += [ExpertRead(e, CACHE) for e in landing.unique if e not in landing.missing]
        self.calls.calls += 1
        self.calls.rows += record.rows
        self.calls.unique += len(landing.unique)
        self.calls.overlapped += record.overlapped
        self.trace.add(record)
