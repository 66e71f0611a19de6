"""Tail read-ahead: guesses at the next layer's experts, read by drives done with their share of this layer.

The guesses are held, not placed: a drive starts one only once it has no demand work left while another
drive still has some, and only if the read is expected to end within half a read of the layer's last one
(estimated when the layer's reads were placed). So a drive that finished its share of a layer early reads
ahead instead of idling, no read-ahead shares a drive with the layer's own reads, and few run on into the
next layer's. Ending the tail (the layer's reads have landed) drops the guesses no drive started.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from nightshift.engine.instruments.trace import PREFETCH
from nightshift.engine.moe.reads import Abort, Key, LoadedExpert, Placed, ReadCounts, Ticket
from nightshift.engine.moe.tickets import Placer
from nightshift.engine.store.manifest import MoeLayer

Load = Callable[[MoeLayer, int, str, list[Ticket], Abort | None], LoadedExpert]


@dataclass(frozen=True)
class Held:
    """A tail read-ahead waiting for a drive with no demand work (its future is pending until it starts)."""

    layer: int
    expert: int
    placed: Placed


class Tail:
    """One reader's tail: its demand work per drive, the guesses it holds, the read-aheads it started.

    Every method but the read itself runs under the reader's `lock`, held by the caller.
    """

    def __init__(
        self,
        placer: Placer,
        layers: dict[int, MoeLayer],
        pools: dict[str, ThreadPoolExecutor],
        load: Load,
        counts: ReadCounts,
        lock: threading.Lock,
        clock: Callable[[], float],
    ):
        """`pools`: the prefetch queue of each drive; `load`: how a placed read is carried out."""
        self.placer = placer
        self.dispatcher = placer.dispatcher
        self.settings = placer.settings
        self.layers = layers
        self._pools = pools
        self._load = load
        self.counts = counts
        self._lock = lock
        self.clock = clock
        drives = list(placer.manifest.drives)
        self._demand_work = dict.fromkeys(drives, 0)  # demand reads placed on each drive, queued or running
        self._reading = dict.fromkeys(drives, 0)  # tail read-aheads running on each drive
        self._held: list[Held] = []
        self._ends = 0.0  # clock time the held read-aheads must end by (about when the layer's last read lands)

    def demand_placed(self, tickets: list[Ticket]) -> None:
        """A demand read was queued on its tickets' drives."""
        for ticket in tickets:
            self._demand_work[ticket.drive] += 1

    def demand_done(self, tickets: list[Ticket]) -> None:
        """A demand read ended (landed or failed): its drives may now start held read-aheads."""
        for ticket in tickets:
            self._demand_work[ticket.drive] -= 1
        self.pump()

    def hold(self, layer: int, experts: list[int]) -> list[Held]:
        """Hold read-aheads of `experts` (none in flight) of `layer`, most confident first; the reader keeps them
        in flight. Called right after the current layer's reads were placed, so the drives' queues say when it
        ends (`pump` once they are in flight)."""
        self._ends = self.clock() + self.dispatcher.drained(list(self._demand_work))
        held = [
            Held(layer, expert, Placed(Future(), [], Abort.of(self.settings, self.dispatcher))) for expert in experts
        ]
        self._held += held
        return held

    def end(self) -> tuple[list[Key], list[Held]]:
        """The layer's reads have landed: (the read-aheads started, those no drive started, to be dropped)."""
        started = [(h.layer, h.expert) for h in self._held if h.placed.tickets]
        dropped = [held for held in self._held if not held.placed.tickets]
        self._held = []
        return started, dropped

    def pump(self) -> None:
        """Start held read-aheads, most confident first, on drives with no demand work while another has some.

        Once no drive has demand work the layer's reads have landed: what is still held waits for `end`.
        """
        idle = {
            d for d, work in self._demand_work.items() if not work and self._reading[d] < self.settings.prefetch_threads
        }
        if not idle or not any(self._demand_work.values()):  # every drive busy (the usual case), or no tail
            return
        for held in self._held:
            if not idle:
                return
            if held.placed.tickets or held.placed.future.cancelled():
                continue
            replicas = dict(self.placer.replicas(held.layer, held.expert))
            spec = self.layers[held.layer]
            free = [d for d in replicas if d in idle and self._fits(d, spec.file_bytes)]
            if not free or not held.placed.future.set_running_or_notify_cancel():
                continue
            drive = self.dispatcher.choose(free, spec.file_bytes)
            held.placed.tickets.append(Ticket(drive, replicas[drive], spec.file_bytes))
            self._reading[drive] += 1
            if self._reading[drive] >= self.settings.prefetch_threads:
                idle.discard(drive)
            self.counts.tail_prefetch += 1
            self.counts.prefetch_reads += 1
            self._pools[drive].submit(self._run, held, spec)

    def _fits(self, drive: str, nbytes: int) -> bool:
        """A read of `nbytes` on `drive` started now ends within half a read of the layer's last one."""
        read_s = self.dispatcher.expected_completion(drive, nbytes)
        return self.clock() + read_s / 2 <= self._ends

    def _run(self, held: Held, spec: MoeLayer) -> None:
        ticket = held.placed.tickets[0]
        try:
            held.placed.future.set_result(self._load(spec, held.expert, PREFETCH, [ticket], held.placed.abort))
        except BaseException as exc:  # handed to whoever joins the read, as a pool's future would be
            held.placed.future.set_exception(exc)
        finally:
            with self._lock:
                self._reading[ticket.drive] -= 1
                self.pump()
