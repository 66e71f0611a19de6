"""Which replica serves a read: the one expected to finish first.

Each drive has a bandwidth and latency estimate (from `nightshift drives probe`
when present, then following measurements) and a count of the bytes in flight
on it (queued or being read), shared by the demand and prefetch queues. A read of
n bytes on drive d is expected to complete after latency(d) + (in_flight(d) + n) /
bandwidth(d): the bytes already placed there are served first, or alongside at
shared bandwidth.

Bandwidth is measured as a busy drive's throughput: bytes completed over the time
between completions (or since the drive became busy), summed over the last WINDOW
reads. Timing single reads instead (bytes ahead + n over its latency) swung with
every burst a throttle or a drive's cache allowed, and the drive that looked
fastest for a moment was handed a whole layer's reads.

With `load_left`, a read read in chunks (a read-ahead that may be aborted) holds a `Booking`: its chunks stop
counting as they land, and what an aborted read will not read stops counting when it is aborted, not when its
chunk under way ends; so a drive is as busy as what is left of its reads.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from nightshift.engine.io.ceilings import Ceilings
from nightshift.engine.moe.settings import FIRST_REPLICA, LEAST_COMPLETION

DEFAULT_BANDWIDTH = 1e9  # bytes/s, until measured
DEFAULT_LATENCY = 1e-4  # s
WINDOW = 16  # completed reads the throughput is measured over


@dataclass
class DriveEstimate:
    bandwidth: float = DEFAULT_BANDWIDTH
    latency: float = DEFAULT_LATENCY
    in_flight: int = 0  # bytes
    samples: int = 0
    mark: float = 0.0  # last completion, or when the drive last became busy
    recent: deque = field(default_factory=lambda: deque(maxlen=WINDOW))  # (bytes, seconds) per completion


def estimates_from(ceilings: Ceilings | None, drives: list[str]) -> dict[str, DriveEstimate]:
    """Starting estimates: a drive's best probed bandwidth and its latency at the smallest probed read."""
    out = {name: DriveEstimate() for name in drives}
    for ceiling in ceilings.drives if ceilings else []:
        if ceiling.name in out and ceiling.cells:
            smallest = min(ceiling.cells, key=lambda c: (c.read_bytes, c.queue_depth))
            out[ceiling.name] = DriveEstimate(ceiling.best().bytes_per_s, smallest.mean_latency_s)
    return out


class Booking:
    """The bytes of one placed read (or part) still counted in flight on its drive (`Dispatcher.settle`, `trim`)."""

    def __init__(self, drive: str, nbytes: int):
        self.drive = drive
        self.left = nbytes


class Dispatcher:
    """Chooses a replica per read (`least_completion`, or always the first: `first_replica`)."""

    def __init__(
        self,
        estimates: dict[str, DriveEstimate],
        policy: str = LEAST_COMPLETION,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.policy = policy
        self.choices = 0  # reads that had more than one replica to choose from (the policy mattered)
        self._drives = estimates
        self._clock = clock
        self._lock = threading.Lock()

    def expected_completion(self, drive: str, nbytes: int) -> float:
        est = self._drives[drive]
        return est.latency + (est.in_flight + nbytes) / est.bandwidth

    def drained(self, drives: list[str]) -> float:
        """Seconds until the busiest of `drives` is expected to have read everything placed on it."""
        with self._lock:
            return max((self.expected_completion(d, 0) for d in drives if self._drives[d].in_flight), default=0.0)

    def choose(self, candidates: list[str], nbytes: int) -> str:
        """The drive to read `nbytes` from, now counted in flight there until `finished`."""
        with self._lock:
            self.choices += len(candidates) > 1
            if self.policy == FIRST_REPLICA:
                drive = candidates[0]
            else:
                drive = min(candidates, key=lambda d: self.expected_completion(d, nbytes))
            est = self._drives[drive]
            if est.in_flight == 0:
                est.mark = self._clock()
            est.in_flight += nbytes
            return drive

    def finished(self, drive: str, nbytes: int, ok: bool, booking: Booking | None = None) -> None:
        """A read placed by `choose` is done (or cancelled: ok=False); a successful one is a throughput sample.
        With `booking`, what it still counts leaves the drive's load (the rest already did)."""
        with self._lock:
            est = self._drives[drive]
            if booking is None:
                est.in_flight -= nbytes
            else:
                est.in_flight -= booking.left
                booking.left = 0
            if not ok:
                return
            now = self._clock()
            est.recent.append((nbytes, max(now - est.mark, 1e-9)))
            est.mark = now
            est.bandwidth = sum(b for b, _ in est.recent) / sum(t for _, t in est.recent)
            est.samples += 1

    def settle(self, booking: Booking, nbytes: int) -> None:
        """`nbytes` of a booked read have landed: its drive no longer counts them."""
        with self._lock:
            done = min(nbytes, booking.left)
            booking.left -= done
            self._drives[booking.drive].in_flight -= done

    def trim(self, booking: Booking, keep: int) -> None:
        """A booked read will read at most `keep` more bytes (aborted): its drive no longer counts the rest."""
        with self._lock:
            dropped = max(0, booking.left - keep)
            booking.left -= dropped
            self._drives[booking.drive].in_flight -= dropped

    def bandwidth(self, drives: set[str]) -> float:
        """Summed bandwidth estimate of `drives` (bytes/s), without copying every estimate as `snapshot` does."""
        with self._lock:
            return sum(est.bandwidth for name, est in self._drives.items() if name in drives)

    def snapshot(self) -> dict[str, DriveEstimate]:
        with self._lock:
            return {
                name: DriveEstimate(
                    est.bandwidth, est.latency, est.in_flight, est.samples, est.mark, deque(est.recent, maxlen=WINDOW)
                )
                for name, est in self._drives.items()
            }
