"""Expert reads: direct I/O into pooled buffers, from the replica expected to finish first.

Each drive has two queues with their own threads, sized separately: demand (a layer
is waiting) and prefetch (a prediction). A read's replica is chosen when the read is
submitted, not when a thread picks it up, so a layer's whole set of experts is spread
over the drives at once (choosing at start time, with fewer threads than reads, piled
them on whichever drive looked fastest). Both queues share one dispatcher, so
in-flight bytes per drive count every queued and running read. An expert already in
flight is never read twice: a demand joins the prefetch read under way. A failed read (I/O error, short file, bad checksum) falls
back to the next replica; with none left the error names every drive and file.
Optionally an expert with replicas on two devices is read as two halves at once.

Balanced reads (`balance_reads`, water-filling): a layer's demand reads (and, as a set of their own, the
read-aheads of its next-layer guesses) are placed whole, one by one on the drive expected to finish first;
where that leaves some drives ending later than the level every drive
would reach if the bytes could be shared out exactly (8 reads over 3 drives: 3/3/2), the last read placed
on each such drive is cut in page-aligned parts and only its excess goes to the drives that would end
early (there: two reads split 2/3 + 1/3, the thirds to the drive with 2). So a layer has at most one split
read per late drive, never a part under a sixth of a read. (Splitting every leftover read into one part
per device, round 3's "split remainder", put many small reads last behind blk-throttle and lost 10 %.)
A demand for an expert whose prefetch is still queued (not started) cancels it and reads it
in the demand pool, so a layer never waits behind the prefetch queue.

Tail read-ahead (`hold_tail`): guesses at the next layer's experts are held, not placed, and a
drive starts one only once it has no demand work left while another drive still has some, and
only if the read is expected to end within half a read of the layer's last one (estimated when
the layer's reads were placed). So a drive that finished its share of a layer early reads ahead
instead of idling, no read-ahead shares a drive with the layer's own reads, and few run on into
the next layer's. `end_tail` (the layer's reads have landed) drops the guesses no drive started.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from nightshift.engine.errors import NightshiftError
from nightshift.engine.instruments.trace import DEMAND, PREFETCH, ExpertRead
from nightshift.engine.io.counters import DriveReadCounters
from nightshift.engine.io.direct import ALIGNMENT as ALIGN
from nightshift.engine.io.direct import DirectReadError, open_direct
from nightshift.engine.moe.buffers import BufferPool
from nightshift.engine.moe.dispatch import Dispatcher
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.store.manifest import Manifest, MoeLayer, sha256_bytes
from nightshift.engine.store.placement import existing_parent
from nightshift.engine.store.safetensors_io import DTYPES

Key = tuple[int, int]  # (layer, expert)
MIN_PART_SHARE = 6  # a balanced read's parts are at least 1/6 of the file: smaller ones gain less than they cost
Tensors = dict[str, mx.array]


class ExpertReadError(NightshiftError):
    """No replica of an expert could be read."""


@dataclass(frozen=True)
class Ticket:
    """One read placed by the dispatcher: drive, file, bytes, and where in the file they start (a part's)."""

    drive: str
    path: Path
    nbytes: int
    offset: int = 0


@dataclass(frozen=True)
class Placed:
    """A read in flight: its future and where it was placed (released from the drives if it is cancelled)."""

    future: Future
    tickets: list[Ticket]


@dataclass(frozen=True)
class Held:
    """A tail read-ahead waiting for a drive with no demand work (its future is pending until it starts)."""

    layer: int
    expert: int
    placed: Placed


@dataclass
class LoadedExpert:
    tensors: Tensors
    read: ExpertRead
    nbytes: int


@dataclass
class ReadCounts:
    """What the reader did; config assertions check these prove a setting fired."""

    demand_reads: int = 0
    prefetch_reads: int = 0
    joined_prefetch: int = 0  # demands served by a prefetch read (landed or still in flight)
    split_reads: int = 0
    balanced_reads: int = 0  # demand reads cut in parts so that every drive ends the layer together
    fallbacks: int = 0  # replicas that failed and were passed over
    wasted_prefetch: int = 0  # prefetched experts the layer did not use
    promoted_prefetch: int = 0  # prefetches still queued when demanded: cancelled and read by the demand pool
    cancelled_prefetch: int = 0  # prefetches never started (promoted, or no longer wanted)
    tail_prefetch: int = 0  # read-aheads started by drives done with their share of a layer (hold_tail)


def decode(buffer, layer: MoeLayer) -> Tensors:
    """The tensors of one expert file, copied out of `buffer` (which is reused) as unsigned integers.

    Only data is made here (reader threads must not build MLX graph nodes: each thread has its
    own MLX stream); `as_stored` gives them their dtypes on the thread that computes.
    """
    data = np.frombuffer(buffer, dtype=np.uint8, count=layer.file_bytes)
    out = {}
    for slot in layer.tensors:
        itemsize = DTYPES[slot.dtype][1]
        out[slot.name] = mx.array(
            data[slot.offset : slot.offset + slot.nbytes].view(f"<u{itemsize}").reshape(slot.shape)
        )
    return out


def as_stored(raw: Tensors, layer: MoeLayer) -> Tensors:
    """`decode`'s arrays viewed as the dtypes the store recorded (a no-op for unsigned tensors)."""
    out = {}
    for slot in layer.tensors:
        dtype = DTYPES[slot.dtype][0]
        out[slot.name] = raw[slot.name] if raw[slot.name].dtype == dtype else raw[slot.name].view(dtype)
    return out


class ExpertReader:
    def __init__(
        self,
        manifest: Manifest,
        settings: StreamSettings,
        dispatcher: Dispatcher,
        counters: DriveReadCounters,
        clock: Callable[[], float],
    ):
        self.manifest = manifest
        self.settings = settings
        self.dispatcher = dispatcher
        self.counters = counters
        self.clock = clock
        self.counts = ReadCounts()
        drives = list(manifest.drives)
        self._demand = {d: ThreadPoolExecutor(settings.demand_threads, f"ns-demand-{d}") for d in drives}
        self._prefetch = (
            self._demand
            if settings.shared_pool
            else {d: ThreadPoolExecutor(settings.prefetch_threads, f"ns-prefetch-{d}") for d in drives}
        )
        per_drive = settings.demand_threads + (0 if settings.shared_pool else settings.prefetch_threads)
        threads = per_drive * len(drives)
        parts = settings.split_reads or settings.balance_reads
        self._halves = ThreadPoolExecutor(threads, thread_name_prefix="ns-half") if parts else None
        self.buffers = BufferPool(threads, max(layer.file_bytes for layer in manifest.layers))
        self.layers = {layer.layer: layer for layer in manifest.layers}
        self.devices = {name: _device(root) for name, root in manifest.drives.items()}
        self._inflight: dict[Key, Placed] = {}
        self._paths: dict[Key, list[tuple[str, Path]]] = {}  # replica paths, built once (~17 ms a token at 50 %)
        self._demand_work = dict.fromkeys(drives, 0)  # demand reads placed on each drive, queued or running
        self._tail_reading = dict.fromkeys(drives, 0)  # tail read-aheads running on each drive
        self._held: list[Held] = []
        self._tail_ends = 0.0  # clock time the held read-aheads must end by (about when the layer's last read lands)
        self._verified: set[tuple[Path, ...]] = set()  # files (or split pairs) found intact ("first" mode)
        self._lock = threading.Lock()
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
            self._place(layer, new, DEMAND)
            self._drop_unused(layer, set(experts))
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
            self._inflight[key] = placed = self._submit(*key, PREFETCH)
            return placed.future

    def settle_warm(self, key: Key, future: Future[LoadedExpert]) -> None:
        """The warm read `future` of `key` is kept or given up: no longer in flight."""
        with self._lock:
            self._warming.discard(key)
            placed = self._inflight.get(key)
            if placed is not None and placed.future is future:
                del self._inflight[key]

    def hold_tail(self, layer: int, experts: list[int]) -> None:
        """Hold read-aheads of `experts` of `layer` (most confident first) for drives that finish early.

        Called right after the current layer's reads were placed, so the drives' queues say when it ends.
        """
        with self._lock:
            self._tail_ends = self.clock() + self.dispatcher.drained(list(self._demand_work))
            for expert in experts:
                if (layer, expert) not in self._inflight:
                    placed = self._inflight[(layer, expert)] = Placed(Future(), [])
                    self._held.append(Held(layer, expert, placed))
            self._pump()

    def end_tail(self) -> list[Key]:
        """The layer's reads have landed: drop the held read-aheads no drive started; returns those started."""
        with self._lock:
            started = [(h.layer, h.expert) for h in self._held if h.placed.tickets]
            for held in self._held:
                if not held.placed.tickets and self._inflight.get((held.layer, held.expert)) is held.placed:
                    del self._inflight[(held.layer, held.expert)]
                    held.placed.future.cancel()
            self._held = []
            return started

    def replicas(self, layer: int, expert: int) -> list[tuple[str, Path]]:
        """(drive, path) of the replicas this reader may use (`use_drives`); an error if there are none."""
        key = (layer, expert)
        replicas = self._paths.get(key) or self._paths.setdefault(key, self.manifest.replica_paths(layer, expert))
        allowed = self.settings.use_drives
        usable = [(d, p) for d, p in replicas if d in allowed] if allowed else replicas
        if not usable:
            raise ExpertReadError(
                f"expert {expert} of layer {layer} has replicas only on {', '.join(d for d, _ in replicas)}, "
                f"none of the drives in use ({', '.join(allowed)}); place the store on them with `nightshift model place`"
            )
        return usable

    def close(self) -> None:
        pools = [*self._demand.values(), *self._prefetch.values(), self._halves]
        for pool in dict.fromkeys(p for p in pools if p is not None):
            pool.shutdown(wait=True, cancel_futures=True)

    def _drop_unused(self, layer: int, used: set[int]) -> None:
        """Forget prefetches of `layer` this pass does not use; cancel those not started (caller holds the lock).

        One still running lands unclaimed and is freed; should the expert be needed later, it is read anew.
        """
        for key in [k for k in self._inflight if k[0] == layer and k[1] not in used and k not in self._warming]:
            self._cancel(self._inflight.pop(key))
            self.counts.wasted_prefetch += 1

    def _submit(self, layer: int, expert: int, source: str) -> Placed:
        """Place the read now (drive, or two drives for a split read) and queue it on its drive (caller holds the lock)."""
        spec = self.layers[layer]
        replicas = self.replicas(layer, expert)
        tickets = self._split_pair(replicas, spec.file_bytes // 2) if self.settings.split_reads else None
        return self._queue(spec, expert, source, tickets or [self._whole(replicas, spec.file_bytes)])

    def _whole(self, replicas: list[tuple[str, Path]], nbytes: int) -> Ticket:
        """A whole-file read on the replica the dispatcher expects to finish first (caller holds the lock)."""
        drive = self.dispatcher.choose([d for d, _ in replicas], nbytes)
        return Ticket(drive, dict(replicas)[drive], nbytes)

    def _queue(self, spec: MoeLayer, expert: int, source: str, tickets: list[Ticket]) -> Placed:
        """Queue a placed read on its first ticket's drive (later tickets: parts read beside it)."""
        pools = self._demand if source == DEMAND else self._prefetch
        if source == DEMAND:
            for ticket in tickets:
                self._demand_work[ticket.drive] += 1
        return Placed(pools[tickets[0].drive].submit(self._load, spec, expert, source, tickets), tickets)

    def _place(self, layer: int, experts: list[int], source: str) -> None:
        """Place and queue the reads of `experts` (none in flight) as one set: balanced when that is on, so the set
        lands as early as the drives allow, a read-ahead as a layer's demand (caller holds the lock)."""
        if self.settings.balance_reads and not self.settings.split_reads:
            self._inflight.update(
                ((layer, e), placed) for e, placed in self._place_balanced(layer, experts, source).items()
            )
        else:
            self._inflight.update(((layer, e), self._submit(layer, e, source)) for e in experts)

    def _place_balanced(self, layer: int, experts: list[int], source: str) -> dict[int, Placed]:
        """Place a set of reads whole, then cut the last read of each drive that would end late so its excess
        goes to drives that would end early (water-filling; module docstring). Caller holds the lock."""
        spec = self.layers[layer]
        placed = {e: [self._whole(self.replicas(layer, e), spec.file_bytes)] for e in experts}
        estimates = self.dispatcher.snapshot()
        in_use = [d for d in self.settings.use_drives or self.manifest.drives if d in estimates]
        level = sum(estimates[d].in_flight for d in in_use) / sum(estimates[d].bandwidth for d in in_use)
        # bytes each drive holds beyond (+) or short of (-) the level, in pages
        surplus = {d: int((estimates[d].in_flight - level * estimates[d].bandwidth) // ALIGN) for d in in_use}
        smallest = max(1, spec.file_bytes // ALIGN // MIN_PART_SHARE)
        for donor in sorted(in_use, key=lambda d: -surplus[d]):
            ours = [e for e, tickets in placed.items() if len(tickets) == 1 and tickets[0].drive == donor]
            if surplus[donor] < smallest or not ours:
                continue
            expert = ours[-1]
            parts = self._water_fill(layer, expert, placed[expert][0], surplus, smallest)
            if len(parts) > 1:
                placed[expert] = parts
                self.counts.balanced_reads += 1
        return {e: self._queue(spec, e, source, tickets) for e, tickets in placed.items()}

    def _water_fill(
        self, layer: int, expert: int, whole: Ticket, surplus: dict[str, int], smallest: int
    ) -> list[Ticket]:
        """`whole` cut so the donor keeps its first pages and drives short of the level (holding a replica, on
        another device) read the rest, each at least `smallest` pages; `surplus` and the dispatcher follow."""
        replicas = dict(self.replicas(layer, expert))
        pages = whole.nbytes // ALIGN
        give = min(surplus[whole.drive], pages - smallest)
        takers = sorted(
            (d for d in replicas if surplus.get(d, 0) <= -smallest and self.devices[d] != self.devices[whole.drive]),
            key=lambda d: surplus[d],
        )
        cuts = []
        for taker in takers:
            share = min(give, -surplus[taker])
            if share < smallest:
                break
            cuts.append((taker, share))
            give -= share
        keep = pages - sum(share for _, share in cuts)
        if not cuts:
            return [whole]
        self.dispatcher.finished(whole.drive, (pages - keep) * ALIGN, ok=False)  # those bytes move to the takers
        surplus[whole.drive] -= pages - keep
        parts, at = [Ticket(whole.drive, whole.path, keep * ALIGN)], keep
        for taker, share in cuts:
            self.dispatcher.choose([taker], share * ALIGN)
            surplus[taker] += share
            parts.append(Ticket(taker, replicas[taker], share * ALIGN, at * ALIGN))
            at += share
        return parts

    def _pump(self) -> None:
        """Start held read-aheads, most confident first, on drives with no demand work while another has some.

        Caller holds the lock. Once no drive has demand work the layer's reads have landed: what is
        still held waits for `end_tail`.
        """
        idle = {
            d
            for d, work in self._demand_work.items()
            if not work and self._tail_reading[d] < self.settings.prefetch_threads
        }
        if not idle or not any(self._demand_work.values()):  # every drive busy (the usual case), or no tail
            return
        for held in self._held:
            if not idle:
                return
            if held.placed.tickets or held.placed.future.cancelled():
                continue
            replicas = dict(self.replicas(held.layer, held.expert))
            spec = self.layers[held.layer]
            free = [d for d in replicas if d in idle and self._fits_tail(d, spec.file_bytes)]
            if not free or not held.placed.future.set_running_or_notify_cancel():
                continue
            drive = self.dispatcher.choose(free, spec.file_bytes)
            held.placed.tickets.append(Ticket(drive, replicas[drive], spec.file_bytes))
            self._tail_reading[drive] += 1
            if self._tail_reading[drive] >= self.settings.prefetch_threads:
                idle.discard(drive)
            self.counts.tail_prefetch += 1
            self.counts.prefetch_reads += 1
            self._prefetch[drive].submit(self._run_held, held, spec)

    def _fits_tail(self, drive: str, nbytes: int) -> bool:
        """A read of `nbytes` on `drive` started now ends within half a read of the layer's last one."""
        read_s = self.dispatcher.expected_completion(drive, nbytes)
        return self.clock() + read_s / 2 <= self._tail_ends

    def _run_held(self, held: Held, spec: MoeLayer) -> None:
        ticket = held.placed.tickets[0]
        try:
            held.placed.future.set_result(self._load(spec, held.expert, PREFETCH, [ticket]))
        except BaseException as exc:  # handed to whoever joins the read, as a pool's future would be
            held.placed.future.set_exception(exc)
        finally:
            with self._lock:
                self._tail_reading[ticket.drive] -= 1
                self._pump()

    def _cancel(self, placed: Placed) -> bool:
        """Cancel a queued read, releasing its place on the drives; False if it already started."""
        if not placed.future.cancel():
            return False
        for ticket in placed.tickets:
            self.dispatcher.finished(ticket.drive, ticket.nbytes, ok=False)
        self.counts.cancelled_prefetch += 1
        return True

    def _load(self, spec: MoeLayer, expert: int, source: str, tickets: list[Ticket]) -> LoadedExpert:
        try:
            with self.buffers.take() as buffer:
                read = self._read(buffer, spec, expert, source, tickets)
                return LoadedExpert(decode(buffer, spec), read, spec.file_bytes)
        finally:
            if source == DEMAND:
                with self._lock:
                    for ticket in tickets:
                        self._demand_work[ticket.drive] -= 1
                    self._pump()

    def _read(self, buffer, spec: MoeLayer, expert: int, source: str, tickets: list[Ticket]) -> ExpertRead:
        """Fill `buffer` with the expert's file as placed (whole, or halves), then from other replicas on failure."""
        problems: list[str] = []
        if len(tickets) > 1:
            read = self._read_split(buffer, spec, expert, source, tickets, problems)
            if read is not None:
                return read
        remaining = dict(self.replicas(spec.layer, expert))
        ticket = tickets[0] if len(tickets) == 1 else None
        while ticket is not None or remaining:
            if ticket is None:
                drive = self.dispatcher.choose(list(remaining), spec.file_bytes)
                ticket = Ticket(drive, remaining[drive], spec.file_bytes)
            remaining.pop(ticket.drive, None)
            start = self.clock()
            ok = self._read_part(buffer, ticket, problems)
            if ok and self._intact(buffer, spec, expert, (ticket.path,), ticket.drive, problems):
                return ExpertRead(expert, source, ticket.drive, start, self.clock(), spec.file_bytes)
            ticket = None
        names = "; ".join(problems)
        raise ExpertReadError(
            f"expert {expert} of layer {spec.layer}: no replica could be read ({names}); "
            "check the drive, then run `nightshift model verify` and re-import if no replica is intact"
        )

    def _split_pair(self, replicas: list[tuple[str, Path]], half: int) -> list[Ticket] | None:
        """Halves placed on two replicas on different devices (dispatcher's choice), or None when there are not two."""
        first = self.dispatcher.choose([d for d, _ in replicas], half)
        others = [d for d, _ in replicas if self.devices[d] != self.devices[first]]
        if not others:
            self.dispatcher.finished(first, half, ok=False)
            return None
        second = self.dispatcher.choose(others, half)
        paths = dict(replicas)
        return [Ticket(first, paths[first], half), Ticket(second, paths[second], half, half)]

    def _read_split(
        self, buffer, spec: MoeLayer, expert: int, source: str, parts: list[Ticket], problems: list[str]
    ) -> ExpertRead | None:
        """Read the parts at once (the first on this thread); None when one failed or the whole is not intact."""
        start = self.clock()
        first, *rest = parts
        others = [self._halves.submit(self._read_part, buffer, part, problems) for part in rest]
        ok = self._read_part(buffer, first, problems)
        ok = all([other.result() for other in others]) and ok
        drives = "+".join(part.drive for part in parts)
        if not ok or not self._intact(buffer, spec, expert, tuple(part.path for part in parts), drives, problems):
            return None
        if self.settings.split_reads:  # balanced reads are counted where they are cut
            with self._lock:
                self.counts.split_reads += 1
        return ExpertRead(expert, source, drives, start, self.clock(), spec.file_bytes, split=True)

    def _read_part(self, buffer, ticket: Ticket, problems: list[str]) -> bool:
        """Read the ticket's bytes at its offset of its file into the same place of `buffer`; False (noted) on failure."""
        path, drive, length, offset = ticket.path, ticket.drive, ticket.nbytes, ticket.offset
        done = 0
        self.counters.started(drive)
        try:
            with open_direct(path) as f:
                done = f.read_into(memoryview(buffer)[offset : offset + length], offset)
            if done != length:
                raise DirectReadError(f"{path}: {done} bytes at {offset}, expected {length} (file truncated?)")
            return True
        except (DirectReadError, OSError) as exc:
            done = 0
            with self._lock:
                self.counts.fallbacks += 1
            problems.append(f"drive {drive}: {exc}")
            return False
        finally:
            self.counters.finished(drive, done)
            self.dispatcher.finished(drive, length, ok=done == length)

    def _intact(
        self, buffer, spec: MoeLayer, expert: int, paths: tuple[Path, ...], drive: str, problems: list[str]
    ) -> bool:
        """The bytes read from `paths` (one file, or the two halves' files) match the manifest, if checked."""
        mode = self.settings.verify_checksums
        if mode == "off" or (mode == "first" and paths in self._verified):
            return True
        expected = self.manifest.experts[spec.layer][expert]["sha256"]
        if sha256_bytes(memoryview(buffer)[: spec.file_bytes]) == expected:
            self._verified.add(paths)
            return True
        problems.append(f"drive {drive}: {' + '.join(map(str, paths))}: checksum mismatch")
        with self._lock:
            self.counts.fallbacks += 1
        return False


def _device(root: str) -> int:
    """st_dev of a drive root: replicas on one device do not read in parallel."""
    return os.stat(existing_parent(Path(root))).st_dev
