"""Expert reads in flight: demand and prefetch queues per drive, joined, promoted, cancelled, warm.

Each drive has two queues with their own threads, sized separately: demand (a layer is waiting) and prefetch
(a prediction). Both queues share one dispatcher, so in-flight bytes per drive count every queued and running
read. An expert already in flight is never read twice: a demand joins the prefetch read under way. A demand
for an expert whose prefetch is still queued (not started) cancels it and reads it in the demand pool, so a
layer never waits behind the prefetch queue. With `prefetch_abort`, a read-ahead the layer does not use that
has already started stops at its next chunk (engine/moe/expert_files.py), so the layer's demands do not share
its drive with it for the rest of its read.

The reader's parts, each with one job: `tickets` places a read (which replica, whole or in parts: split and
balanced reads), `expert_files` carries a placed read out (direct I/O, fallback to other replicas,
checksums), and `tail` holds read-aheads for drives done early with a layer's reads (`hold_tail`). They share
the reader's lock and its counts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed

import mlx.core as mx

from nightshift.engine.instruments.trace import DEMAND, PREFETCH, DriveRead
from nightshift.engine.io.arenas import cap_malloc_arenas, map_expert_tensors
from nightshift.engine.io.counters import DriveReadCounters
from nightshift.engine.moe.dispatch import Dispatcher
from nightshift.engine.moe.expert_files import ExpertFiles
from nightshift.engine.moe.reads import Abort, Key, LoadedExpert, Placed, ReadCounts, Ticket
from nightshift.engine.moe.reads import ExpertReadError as ExpertReadError  # the engine's API names it here
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.tail import Tail
from nightshift.engine.moe.tickets import Placer
from nightshift.engine.store.manifest import Manifest, MoeLayer

# MLX's buffer cache (freed arrays kept for reuse) while expert tensors are mapped: at MLX's default 32 MiB the
# step's stacks and reads were mapped afresh, 65 000 page faults a token on the padded trained-routing model
# against 28 000 on the heap (40 MiB: 56 000, 48 MiB: 42 000, 64 MiB: 28 000; docs/results.md, [22] memory).
# On the 192-neuron export 32 MiB gave 25 MB of peak RSS back for a decode 6-18 % slower, so it stays (same section).
# Since a decode step's 16-bit experts' float32 copies come in few sizes (a read expert's alone, the cached ones' in
# multiples of `cpu_prefill.COPY_STEP`), every buffer a step frees is one of a few sizes; run alone, the cache held
# 15-19 MiB after decoding that export at 10-50 %; at 25 % a limit of 4 to 64 MiB
# left the peak at 910-913 MB (the prompt pass's now) while 8 / 4 MiB faulted 3 300 / 22 600 times a token against
# ~200: the limit costs nothing there, so it stays ([22] a decode step's copies).
RECYCLE_BYTES = 64 << 20


class ExpertReader:
    """One model's expert reads: placed by `placer`, carried out by `files`, the tail held by `tail`."""

    def __init__(
        self,
        manifest: Manifest,
        settings: StreamSettings,
        dispatcher: Dispatcher,
        counters: DriveReadCounters,
        clock: Callable[[], float],
        log: Callable[[DriveRead], None] | None = None,
    ):
        """`clock`: the trace's; `log`: told of every read a drive carried out (`Trace.read_done`)."""
        self.manifest = manifest
        self.settings = settings
        self.dispatcher = dispatcher
        self.counts = ReadCounts()
        self.layers = {layer.layer: layer for layer in manifest.layers}
        drives = list(manifest.drives)
        cap_malloc_arenas()  # before the reader threads: their expert buffers must not strand freed memory
        if map_expert_tensors(slot.nbytes for layer in manifest.layers for slot in layer.tensors) is not None:
            previous = mx.set_cache_limit(RECYCLE_BYTES)  # nor leave holes in the heap, nor fault every step
            if previous > RECYCLE_BYTES:
                mx.set_cache_limit(previous)
        self._demand = {d: ThreadPoolExecutor(settings.demand_threads, f"ns-demand-{d}") for d in drives}
        self._prefetch = (
            self._demand
            if settings.shared_pool
            else {d: ThreadPoolExecutor(settings.prefetch_threads, f"ns-prefetch-{d}") for d in drives}
        )
        per_drive = settings.demand_threads + (0 if settings.shared_pool else settings.prefetch_threads)
        self._lock = threading.Lock()
        self.placer = Placer(manifest, settings, dispatcher)
        self.files = ExpertFiles(self.placer, counters, clock, self.counts, self._lock, per_drive * len(drives), log)
        self.tail = Tail(self.placer, self.layers, self._prefetch, self.files.load, self.counts, self._lock, clock)
        self._inflight: dict[Key, Placed] = {}
        self._warming: set[Key] = set()  # warm-start reads in flight: kept even when a pass does not use them

    def demand(self, layer: int, experts: list[int]) -> list[tuple[Future[LoadedExpert], str]]:
        """Start (or join) the reads of `experts`; each comes with DEMAND or PREFETCH: who reads it."""
        with self._lock:
            joined: dict[int, Placed] = {}
            for expert in experts:
                placed = self._inflight.get((layer, expert))
                if placed is not None and self._cancel(placed):  # a prefetch still queued: read it now
                    self.counts.promoted_prefetch += 1
                    placed = None
                if placed is not None:
                    joined[expert] = placed
            self.counts.joined_prefetch += len(joined)
            new = [e for e in experts if e not in joined]
            self.counts.demand_reads += len(new)
            used = set(experts)
            if self.settings.load_left:  # the unused read-aheads leave the drives' load before the demands are placed
                self._drop_unused(layer, used)
                self._place(layer, new, DEMAND)
            else:  # they still weigh on their drives while the demands are placed
                self._place(layer, new, DEMAND)
                self._drop_unused(layer, used)
            return [(self._inflight[(layer, e)].future, PREFETCH if e in joined else DEMAND) for e in experts]

    def wait(
        self,
        layer: int,
        experts: list[int],
        pending: list[tuple[Future[LoadedExpert], str]],
        landed: Callable[[int, LoadedExpert, int], None] | None = None,
    ) -> list[tuple[LoadedExpert, str]]:
        """The experts started by `demand`, once all have landed; the first read error is raised.

        `landed(i, expert, still_reading)` is called for each as it lands, in landing order (i: its place in
        `experts`; still_reading: how many of the others have not landed yet), so work on it overlaps the rest.
        """
        try:
            if landed is not None:
                place = {future: i for i, (future, _) in enumerate(pending)}
                for future in as_completed(place):
                    landed(place[future], future.result(), sum(not f.done() for f in place))
            return [(future.result(), source) for future, source in pending]
        finally:
            with self._lock:
                for expert, (future, _) in zip(experts, pending):
                    placed = self._inflight.get((layer, expert))
                    if placed is not None and placed.future is future:
                        del self._inflight[(layer, expert)]

    def prefetch(self, layer: int, experts: list[int]) -> int:
        """Start reads of the experts of `layer` not yet in flight; returns how many were started."""
        with self._lock:
            new = [e for e in experts if (layer, e) not in self._inflight]
            self._place(layer, new, PREFETCH)
            self.counts.prefetch_reads += len(new)
        return len(new)

    def warm(self, key: Key, skip: Callable[[Key], bool]) -> Future[LoadedExpert] | None:
        """Start a warm-start read (engine/moe/warm.py) on the prefetch queue, unless the expert is in flight
        already or `skip(key)` (both asked under the lock: None). A demand for it joins this read, and a pass
        that does not use it leaves it alone; it stays in flight until `settle_warm`, even once landed."""
        with self._lock:
            if key in self._inflight or skip(key):
                return None
            self._warming.add(key)
            spec = self.layers[key[0]]
            tickets = self.placer.one(spec, key[1])
            self._inflight[key] = placed = self._queue(spec, key[1], PREFETCH, tickets, abortable=False)
            return placed.future

    def settle_warm(self, key: Key, future: Future[LoadedExpert]) -> None:
        """The warm read `future` of `key` is kept or given up: no longer in flight."""
        with self._lock:
            self._warming.discard(key)
            placed = self._inflight.get(key)
            if placed is not None and placed.future is future:
                del self._inflight[key]

    def hold_tail(self, layer: int, experts: list[int]) -> None:
        """Hold read-aheads of `experts` of `layer` (most confident first) for drives that finish early (`tail`).

        Called right after the current layer's reads were placed, so the drives' queues say when it ends.
        """
        with self._lock:
            held = self.tail.hold(layer, [e for e in experts if (layer, e) not in self._inflight])
            self._inflight.update(((h.layer, h.expert), h.placed) for h in held)
            self.tail.pump()

    def end_tail(self) -> list[Key]:
        """The layer's reads have landed: drop the held read-aheads no drive started; returns those started."""
        with self._lock:
            started, dropped = self.tail.end()
            for held in dropped:
                if self._inflight.get((held.layer, held.expert)) is held.placed:
                    del self._inflight[(held.layer, held.expert)]
                    held.placed.future.cancel()
            return started

    def close(self) -> None:
        for pool in dict.fromkeys([*self._demand.values(), *self._prefetch.values()]):
            pool.shutdown(wait=True, cancel_futures=True)
        self.files.close()

    def _drop_unused(self, layer: int, used: set[int]) -> None:
        """Forget prefetches of `layer` this pass does not use; cancel those not started (caller holds the lock).

        One still running lands unclaimed and is freed (with `prefetch_abort`, stops at its next chunk); should
        the expert be needed later, it is read anew.
        """
        for key in [k for k in self._inflight if k[0] == layer and k[1] not in used and k not in self._warming]:
            placed = self._inflight.pop(key)
            if not self._cancel(placed):
                self.counts.wasted_prefetch_bytes += self.layers[layer].file_bytes
                if placed.abort is not None:
                    placed.abort.set()
            self.counts.wasted_prefetch += 1

    def _place(self, layer: int, experts: list[int], source: str) -> None:
        """Place and queue the reads of `experts` (none in flight) as one set: balanced when that is on, so the set
        lands as early as the drives allow, a read-ahead as a layer's demand (caller holds the lock)."""
        spec = self.layers[layer]
        if self.settings.balance_reads and not self.settings.split_reads:
            placed = self.placer.balanced(spec, experts)
            self.counts.balanced_reads += sum(len(tickets) > 1 for tickets in placed.values())
            self._inflight.update(((layer, e), self._queue(spec, e, source, t)) for e, t in placed.items())
        else:
            self._inflight.update(((layer, e), self._queue(spec, e, source, self.placer.one(spec, e))) for e in experts)

    def _queue(self, spec: MoeLayer, expert: int, source: str, tickets: list[Ticket], abortable: bool = True) -> Placed:
        """Queue a placed read on its first ticket's drive (later tickets: parts read beside it); a read-ahead
        can be aborted with `prefetch_abort` unless not `abortable` (a warm-start read)."""
        pools = self._demand if source == DEMAND else self._prefetch
        if source == DEMAND:
            self.tail.demand_placed(tickets)
        abort = Abort.of(self.settings, self.dispatcher) if abortable and source == PREFETCH else None
        return Placed(pools[tickets[0].drive].submit(self._load, spec, expert, source, tickets, abort), tickets, abort)

    def _load(
        self, spec: MoeLayer, expert: int, source: str, tickets: list[Ticket], abort: Abort | None
    ) -> LoadedExpert:
        """Carry a placed read out on this reader thread, its CPU counted (what a read-ahead costs the compute
        on a machine whose cores are busy: `ReadAhead`'s odds weigh it)."""
        began = time.thread_time()
        try:
            return self.files.load(spec, expert, source, tickets, abort)
        finally:
            with self._lock:
                self.counts.read_cpu_s += time.thread_time() - began
                self.counts.timed_reads += 1
                if source == DEMAND:
                    self.tail.demand_done(tickets)

    def _cancel(self, placed: Placed) -> bool:
        """Cancel a queued read, releasing its place on the drives; False if it already started."""
        if not placed.future.cancel():
            return False
        for ticket in placed.tickets:
            self.dispatcher.finished(ticket.drive, ticket.nbytes, ok=False)
        self.counts.cancelled_prefetch += 1
        return True
