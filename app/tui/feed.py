"""What the dashboard shows, gathered in one place: the service's queue and reports, drive rates, memory.

`Feed.collect()` runs on a worker thread and returns a `Snapshot` of plain data;
the app applies it on its own thread. The service is asked over its control
socket (`app.daemon.control.request`); with none running, the same figures come
from the data dir (the run queue, the report index, the schedule files).
Per-drive rates come from a `DriveMonitor` the dashboard runs over the drives in
drives.toml: OS device counters, so they show every read of the drive, the
service's included.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import psutil

from nightshift.app.daemon.control import Jobs
from nightshift.app.paths import catalogue_file, drives_file
from nightshift.app.review.index import IndexEntry
from nightshift.engine import (
    CEILINGS_FILE,
    Catalogue,
    Ceilings,
    DriveMonitor,
    NightshiftError,
    Run,
    load_drives,
    resolve_device,
)

RUNS_SHOWN = 30
RATE_WINDOW_S = 1.0  # drive rates are averaged over the last second of 10 ms samples
CPU_WINDOW_S = 2.0


@dataclass(frozen=True)
class DriveRow:
    """One drive now: read MB/s from its device counters and its measured ceiling (None: not probed)."""

    name: str
    device: str
    mb_per_s: float
    ceiling_mb_per_s: float | None

    @property
    def share(self) -> float | None:
        return self.mb_per_s / self.ceiling_mb_per_s if self.ceiling_mb_per_s else None


@dataclass(frozen=True)
class ServiceState:
    """The queue and the report index as the service (or, with none running, the data dir) reports them."""

    running: bool
    pid: int | None
    jobs: Jobs
    reports: list[IndexEntry]
    error: str | None = None  # the service answered with an error, or the data dir could not be read


@dataclass(frozen=True)
class Memory:
    """The service's resident memory against the machine's RAM (the budget models are sized for)."""

    service_bytes: int | None
    total_bytes: int
    available_bytes: int


@dataclass(frozen=True)
class CatalogueView:
    """Benchmark runs from the run catalogue, newest first, and a note when there is nothing to show."""

    runs: list[Run]
    note: str = ""


@dataclass(frozen=True)
class Snapshot:
    """Everything one refresh shows; `service` and `catalogue` are None on the ticks that only refresh the drives."""

    drives: list[DriveRow]
    memory: Memory
    cpu_fraction: float  # the dashboard process's CPU time over wall time, over the last CPU_WINDOW_S
    refresh_hz: float  # snapshots collected per second over the same window
    service: ServiceState | None = None
    catalogue: CatalogueView | None = None
    drive_note: str = ""  # why there are no drive rows, when there are none
    taken_at: float = field(default_factory=time.time)


def _ceilings() -> dict[str, float]:
    """Best measured MB/s per drive from `nightshift drives probe`; empty when never probed."""
    try:
        ceilings = Ceilings.load(drives_file().parent / CEILINGS_FILE)
    except NightshiftError:
        return {}
    return {drive.name: drive.best().bytes_per_s / 1e6 for drive in ceilings.drives if drive.cells}


def service_state() -> ServiceState:
    """Ask the service; with none answering, read the data dir the same way `nightshift jobs` does."""
    from nightshift.app.commands.jobs import jobs_without_service
    from nightshift.app.daemon.control import jobs, reports, service_pid
    from nightshift.app.review.index import read_index

    try:
        pid = service_pid(timeout=2.0)
        if pid is not None:
            queue, entries = jobs(RUNS_SHOWN, timeout=2.0), reports(timeout=2.0)
            if queue is not None and entries is not None:  # else the service stopped since the ping
                return ServiceState(True, pid, queue, entries)
        return ServiceState(False, None, jobs_without_service(RUNS_SHOWN), read_index())
    except (NightshiftError, OSError, ValueError) as exc:
        return ServiceState(False, None, Jobs([], {}), [], error=str(exc))


def catalogue_view() -> CatalogueView:
    """The catalogue `nightshift runs` reads; not created when no benchmark has recorded a run yet."""
    path = catalogue_file()
    if not path.exists():
        return CatalogueView([], f"no benchmark runs recorded yet ({path}); `nightshift bench decode` records one")
    try:
        return CatalogueView(Catalogue(path).runs(limit=500))
    except (NightshiftError, KeyError, TypeError, ValueError) as exc:
        return CatalogueView([], f"cannot read the run catalogue {path}: {exc!r}")


class Feed:
    """The dashboard's sources; `collect()` is called from one worker at a time, never concurrently."""

    def __init__(self) -> None:
        self.monitor: DriveMonitor | None = None
        self.devices: list[str] = []
        self.note = ""
        self.ceilings = _ceilings()
        try:
            drives = load_drives(drives_file())
            self.devices = [resolve_device(drive.root).counters_name for drive in drives]
            self.monitor = DriveMonitor([drive.name for drive in drives], self.devices, history_s=5.0).start()
        except NightshiftError as exc:
            self.note = f"no drive rates: {exc}"
        self.process = psutil.Process(os.getpid())
        self._cpu = (time.monotonic(), self._cpu_seconds())
        self.cpu_fraction = self.refresh_hz = 0.0
        self.collected = 0

    def _cpu_seconds(self) -> float:
        times = self.process.cpu_times()
        return times.user + times.system

    def _measure_self(self) -> None:
        """This process's CPU time over wall time, and snapshots per second, over windows of CPU_WINDOW_S."""
        self.collected += 1
        now = time.monotonic()
        then, cpu_then = self._cpu
        if now - then >= CPU_WINDOW_S:
            cpu = self._cpu_seconds()
            self.cpu_fraction = (cpu - cpu_then) / (now - then)
            self.refresh_hz = self.collected / (now - then)
            self._cpu, self.collected = (now, cpu), 0

    def drive_rows(self) -> list[DriveRow]:
        if self.monitor is None:
            return []
        try:
            rates = self.monitor.rates(RATE_WINDOW_S)
        except RuntimeError:  # fewer than two samples yet
            return []
        return [
            DriveRow(name, device, 0.0 if math.isnan(rate.os_bytes_per_s) else rate.os_bytes_per_s / 1e6,
                     self.ceilings.get(name))
            for (name, rate), device in zip(rates.items(), self.devices)
        ]  # fmt: skip

    def memory(self, service_pid: int | None) -> Memory:
        ram = psutil.virtual_memory()
        try:
            rss = psutil.Process(service_pid).memory_info().rss if service_pid else None
        except psutil.Error:
            rss = None
        return Memory(rss, ram.total, ram.available)

    def collect(self, with_service: bool, service_pid: int | None) -> Snapshot:
        service = service_state() if with_service else None
        catalogue = catalogue_view() if with_service else None
        pid = service.pid if service is not None else service_pid
        self._measure_self()
        return Snapshot(self.drive_rows(), self.memory(pid), self.cpu_fraction, self.refresh_hz, service, catalogue,
                        self.note)  # fmt: skip

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None
