"""The drive monitor: every 10 ms, per drive, bytes and reads completed and in flight.

Two sources side by side: the OS's device counters (what the drive did, whoever asked)
and nightshift's own read counters (what the engine asked for). Samples go into a
fixed-size numpy ring that the engine, the benchmarks and the dashboard all read
through `latest()`, `window(seconds)` and `rates(seconds)`.

The sampler keeps a fixed 10 ms grid: a late wake-up is recorded (see `cadence()`),
slots it overslept are skipped, never crammed in, so intervals stay honest.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from nightshift.engine.instruments.os_counters import OsDiskCounters
from nightshift.engine.io.counters import DriveReadCounters

# Per-drive columns of a sample; cumulative except the in-flight ones.
FIELDS = ("os_bytes", "os_reads", "os_in_flight", "engine_bytes", "engine_reads", "engine_in_flight")
OS_BYTES, OS_READS, OS_IN_FLIGHT, ENGINE_BYTES, ENGINE_READS, ENGINE_IN_FLIGHT = range(len(FIELDS))


@dataclass(frozen=True)
class DriveRates:
    """One drive over a window: read rates from both sources and mean reads in flight (NaN: source absent)."""

    os_bytes_per_s: float
    os_reads_per_s: float
    os_in_flight: float
    engine_bytes_per_s: float
    engine_reads_per_s: float
    engine_in_flight: float


@dataclass(frozen=True)
class Cadence:
    """How well the sampler kept its grid: gaps between samples and the CPU it used."""

    samples: int
    interval_s: float
    mean_gap_s: float
    p50_gap_s: float
    p99_gap_s: float
    max_gap_s: float
    skipped_slots: int
    cpu_fraction: float  # sampler thread's CPU time / wall time: share of one core


class DriveMonitor:
    """Samples drive counters on a background thread into a ring of `history_s` seconds."""

    def __init__(
        self,
        drive_names: list[str],
        device_names: list[str | None],
        engine: DriveReadCounters | None = None,
        interval_s: float = 0.01,
        history_s: float = 60.0,
    ):
        if engine is not None and engine.names != list(drive_names):
            raise ValueError("engine counters must list the same drives, in the same order")
        self.names = list(drive_names)
        self.interval_s = interval_s
        self._os = OsDiskCounters([d or "" for d in device_names])
        self._engine = engine
        capacity = max(2, int(history_s / interval_s))
        self._times = np.zeros(capacity)
        self._values = np.full((capacity, len(self.names), len(FIELDS)), np.nan)
        self._written = 0
        self._skipped = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu_s = 0.0
        self._wall_start = 0.0

    # --- sampling --------------------------------------------------------------------------

    def start(self) -> DriveMonitor:
        """Start sampling; a monitor runs once (stop() releases its counter files)."""
        if self._stop.is_set() or self._thread is not None:
            raise RuntimeError("a monitor starts once; make a new DriveMonitor")
        self._thread = threading.Thread(target=self._run, name="drive-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling, with one last sample: the window then ends with everything done before the stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self.sample()
        self._os.close()

    def __enter__(self) -> DriveMonitor:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _run(self) -> None:
        cpu0 = time.thread_time()
        self._wall_start = slot = time.monotonic()
        while not self._stop.is_set():
            self.sample()
            self._cpu_s = time.thread_time() - cpu0
            slot += self.interval_s
            now = time.monotonic()
            if now >= slot:  # overslept: skip the slots already past
                missed = int((now - slot) / self.interval_s) + 1
                self._skipped += missed
                slot += missed * self.interval_s
            time.sleep(slot - now)  # cheaper than Event.wait; stop() waits at most one interval

    def sample(self) -> None:
        """Take one sample now (the thread calls this every interval)."""
        when = time.monotonic()
        row = np.full((len(self.names), len(FIELDS)), np.nan)
        row[:, OS_BYTES : OS_IN_FLIGHT + 1] = self._os.read()
        if self._engine is not None:
            row[:, ENGINE_BYTES:] = [(s.bytes, s.reads, s.in_flight) for s in self._engine.snapshot()]
        with self._lock:
            i = self._written % len(self._times)
            self._times[i] = when
            self._values[i] = row
            self._written += 1

    # --- reading ---------------------------------------------------------------------------

    def window(self, seconds: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(times, values): samples of the last `seconds` (all kept when None), oldest first;
        values has shape (samples, drives, len(FIELDS)). Copies, safe to keep."""
        with self._lock:
            n = min(self._written, len(self._times))
            order = np.arange(self._written - n, self._written) % len(self._times)
            times = self._times[order]
            if seconds is not None and n:
                first = int(np.searchsorted(times, times[-1] - seconds))
                order, times = order[first:], times[first:]
            return times, self._values[order]

    def latest(self) -> tuple[float, dict[str, dict[str, float]]]:
        """(time, {drive: {field: value}}) of the newest sample."""
        times, values = self.window(0.0)
        if not len(times):
            raise RuntimeError("the monitor has no samples yet; start() it first")
        return float(times[-1]), {
            name: dict(zip(FIELDS, map(float, values[-1, d]))) for d, name in enumerate(self.names)
        }

    def rates(self, seconds: float) -> dict[str, DriveRates]:
        """Per drive: rates between the first and last sample of the last `seconds`, mean in flight."""
        times, values = self.window(seconds)
        if len(times) < 2:
            raise RuntimeError("rates need at least two samples; wait for the monitor to take them")
        span = times[-1] - times[0]
        delta = (values[-1] - values[0]) / span
        in_flight = values.mean(axis=0)
        return {
            name: DriveRates(
                *(
                    float(x)
                    for x in (
                        delta[d, OS_BYTES],
                        delta[d, OS_READS],
                        in_flight[d, OS_IN_FLIGHT],
                        delta[d, ENGINE_BYTES],
                        delta[d, ENGINE_READS],
                        in_flight[d, ENGINE_IN_FLIGHT],
                    )
                )
            )
            for d, name in enumerate(self.names)
        }

    def cadence(self) -> Cadence:
        """Gaps between the samples kept, slots skipped, and the sampler's share of one core so far."""
        times, _ = self.window()
        gaps = np.diff(times) if len(times) > 1 else np.array([np.nan])
        wall = time.monotonic() - self._wall_start if self._wall_start else np.nan
        return Cadence(
            len(times),
            self.interval_s,
            float(np.mean(gaps)),
            float(np.percentile(gaps, 50)),
            float(np.percentile(gaps, 99)),
            float(np.max(gaps)),
            self._skipped,
            self._cpu_s / wall,
        )
