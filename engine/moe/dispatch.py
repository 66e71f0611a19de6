"""Which replica serves a read: the one expected to finish first.

Each drive has a bandwidth and latency estimate (from `nightshift drives probe`
when present, then following measurements) and a count of the bytes in flight
on it, shared by the demand and prefetch pools. A read of n bytes on drive d is
expected to complete after latency(d) + (in_flight(d) + n) / bandwidth(d): the
bytes already queued there are served first, or alongside at shared bandwidth.
A finished read of n bytes that had `ahead` bytes in flight beside it, taking t
seconds, measures bandwidth (ahead + n) / (t - latency), folded in with an EWMA.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from engine.io.ceilings import Ceilings

DEFAULT_BANDWIDTH = 1e9  # bytes/s, until measured
DEFAULT_LATENCY = 1e-4  # s
SMOOTHING = 0.2


@dataclass
class DriveEstimate:
    bandwidth: float = DEFAULT_BANDWIDTH
    latency: float = DEFAULT_LATENCY
    in_flight: int = 0  # bytes
    samples: int = 0


def estimates_from(ceilings: Ceilings | None, drives: list[str]) -> dict[str, DriveEstimate]:
    """Starting estimates: a drive's best probed bandwidth and its latency at the smallest probed read."""
    out = {name: DriveEstimate() for name in drives}
    for ceiling in ceilings.drives if ceilings else []:
        if ceiling.name in out and ceiling.cells:
            smallest = min(ceiling.cells, key=lambda c: (c.read_bytes, c.queue_depth))
            out[ceiling.name] = DriveEstimate(ceiling.best().bytes_per_s, smallest.mean_latency_s)
    return out


class Dispatcher:
    """Chooses a replica per read (`least_completion`, or always the first: `first_replica`)."""

    def __init__(self, estimates: dict[str, DriveEstimate], policy: str = "least_completion"):
        self.policy = policy
        self.choices = 0  # reads that had more than one replica to choose from (the policy mattered)
        self._drives = estimates
        self._lock = threading.Lock()

    def expected_completion(self, drive: str, nbytes: int) -> float:
        est = self._drives[drive]
        return est.latency + (est.in_flight + nbytes) / est.bandwidth

    def choose(self, candidates: list[str], nbytes: int) -> tuple[str, int]:
        """The drive to read `nbytes` from, now counted in flight, and the bytes that were ahead of it."""
        with self._lock:
            self.choices += len(candidates) > 1
            if self.policy == "first_replica":
                drive = candidates[0]
            else:
                drive = min(candidates, key=lambda d: self.expected_completion(d, nbytes))
            ahead = self._drives[drive].in_flight
            self._drives[drive].in_flight += nbytes
            return drive, ahead

    def finished(self, drive: str, nbytes: int, ahead: int, seconds: float, ok: bool) -> None:
        """A read chosen by `choose` is done; a successful one updates the drive's bandwidth estimate."""
        with self._lock:
            est = self._drives[drive]
            est.in_flight -= nbytes
            if ok and seconds > est.latency:
                measured = (ahead + nbytes) / (seconds - est.latency)
                est.bandwidth += SMOOTHING * (measured - est.bandwidth)
                est.samples += 1

    def snapshot(self) -> dict[str, DriveEstimate]:
        with self._lock:
            return {name: DriveEstimate(**vars(est)) for name, est in self._drives.items()}
