"""nightshift's own per-drive read counters: what the engine asked each drive for.

The readers bump them around every read; the drive monitor samples them next to the
OS's device counters, so the two can be compared (and the OS's used where ours are absent).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class CounterSnapshot:
    """Totals for one drive at one instant."""

    bytes: int
    reads: int
    in_flight: int


class DriveReadCounters:
    """Bytes and reads completed, and reads in flight, per drive name. Thread-safe; one lock, a few adds."""

    def __init__(self, drive_names: list[str]):
        self.names = list(drive_names)
        self._index = {name: i for i, name in enumerate(self.names)}
        self._bytes = [0] * len(self.names)
        self._reads = [0] * len(self.names)
        self._in_flight = [0] * len(self.names)
        self._lock = threading.Lock()

    def started(self, drive: str) -> None:
        """A read was issued to `drive`."""
        i = self._index[drive]
        with self._lock:
            self._in_flight[i] += 1

    def finished(self, drive: str, nbytes: int) -> None:
        """A read issued to `drive` completed with `nbytes` (0 when it failed)."""
        i = self._index[drive]
        with self._lock:
            self._in_flight[i] -= 1
            self._reads[i] += 1
            self._bytes[i] += nbytes

    def snapshot(self) -> list[CounterSnapshot]:
        """Every drive's totals, taken together under the lock, in `names` order."""
        with self._lock:
            return [CounterSnapshot(b, r, f) for b, r, f in zip(self._bytes, self._reads, self._in_flight)]
