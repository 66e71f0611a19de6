"""What one expert read is: where it was placed, what it landed as, and what the reader counts of them.

The reader's parts share these: `tickets` places a read, `expert_files` carries it out, `tail` holds
read-aheads for drives done early, and `reader` keeps the reads in flight.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from nightshift.engine.errors import NightshiftError
from nightshift.engine.instruments.trace import ExpertRead
from nightshift.engine.moe.dispatch import Booking, Dispatcher
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.store.manifest import MoeLayer
from nightshift.engine.store.safetensors_io import DTYPES

Key = tuple[int, int]  # (layer, expert)
Tensors = dict[str, mx.array]


class ExpertReadError(NightshiftError):
    """No replica of an expert could be read."""


class ReadAborted(Exception):
    """A read-ahead stopped part way because its layer asked and did not use it (`prefetch_abort`); nobody waits
    on it, so this only ends its future."""


class Abort:
    """A read-ahead's stop (`prefetch_abort`): set when its layer asked without it, and its parts, read in chunks,
    stop at the next one. With a dispatcher (`load_left`) the parts under way are booked with it, and setting the
    stop trims each to the chunk it is reading, so its drive stops counting the rest at once (engine/moe/dispatch.py).
    """

    def __init__(self, dispatcher: Dispatcher | None = None):
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._dispatcher = dispatcher
        self._parts: list[tuple[Booking, int]] = []

    @classmethod
    def of(cls, settings: StreamSettings, dispatcher: Dispatcher) -> Abort | None:
        """The stop a read-ahead gets under `settings`: none without `prefetch_abort`."""
        if not settings.prefetch_abort:
            return None
        return cls(dispatcher if settings.load_left else None)

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        with self._lock:
            self._event.set()
            for booking, chunk in self._parts:
                self._dispatcher.trim(booking, chunk)

    def book(self, drive: str, nbytes: int, chunk: int) -> Booking | None:
        """A part of `nbytes` on `drive`, read in `chunk`s, starts: its booking (None without a dispatcher)."""
        if self._dispatcher is None:
            return None
        booking = Booking(drive, nbytes)
        with self._lock:
            self._parts.append((booking, chunk))
        return booking


@dataclass(frozen=True)
class Ticket:
    """One read placed by the dispatcher: drive, file, bytes, and where in the file they start (a part's)."""

    drive: str
    path: Path
    nbytes: int
    offset: int = 0


@dataclass(frozen=True)
class Placed:
    """A read in flight: its future and where it was placed (released from the drives if it is cancelled);
    `abort`, where the read can be aborted (a read-ahead, with `prefetch_abort`): set, it stops at its next chunk."""

    future: Future
    tickets: list[Ticket]
    abort: Abort | None = None


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
    wasted_prefetch_bytes: int = 0  # bytes of those already started (read, or being read, for nothing)
    declined_prefetch: int = 0  # uncached guesses the window held that the odds left unread (`prefetch_cap` odds)
    # read-aheads held back off a drive the next layer's demands likely want (`spare_demand_drives`)
    spared_prefetch: int = 0
    promoted_prefetch: int = 0  # prefetches still queued when demanded: cancelled and read by the demand pool
    cancelled_prefetch: int = 0  # prefetches never started (promoted, or no longer wanted)
    aborted_prefetch: int = 0  # started prefetches the layer did not use, stopped part way (`prefetch_abort`)
    aborted_prefetch_bytes: int = 0  # bytes those did not read (counted in wasted_prefetch_bytes, never read)
    tail_prefetch: int = 0  # read-aheads started by drives done with their share of a layer (hold_tail)
    read_cpu_s: float = 0.0  # CPU the reader threads spent in the reads they carried out (`timed_reads` of them)
    timed_reads: int = 0

    def cpu_per_read(self) -> float:
        """The CPU seconds a read has cost so far, on average (0 before any: nothing known)."""
        return self.read_cpu_s / self.timed_reads if self.timed_reads else 0.0


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
