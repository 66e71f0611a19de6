"""What the dashboard shows, gathered in one place: the service's queue and reports, drive rates, memory.

`Feed.collect()` runs on a worker thread and returns a `Snapshot` of plain data;
the app applies it on its own thread. The service is asked over its control
socket (`app.daemon.control.request`); with none running, the same figures come
from the data dir (the run queue, the report index, the schedule files).
Per-drive rates come from a `DriveMonitor` the dashboard runs over the drives in
drives.toml or, without one, over the devices the stores' expert files are on:
OS device counters, so they show every read of the device, anyone's. The
service's own reads come from its per-process counters (/proc/PID/io through
psutil) and, per drive, from the engine's counters in the run's progress.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from nightshift.app.daemon.control import Jobs
from nightshift.app.paths import catalogue_file, doc, drives_file, models_dir
from nightshift.app.review.index import IndexEntry
from nightshift.engine.errors import NightshiftError
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.instruments.monitor import DriveMonitor
from nightshift.engine.io.ceilings import CEILINGS_FILE, Ceilings
from nightshift.engine.io.devices import resolve_device
from nightshift.engine.io.drives import load_drives
from nightshift.engine.store.manifest import is_store, read_manifest

RUNS_SHOWN = 30
RATE_WINDOW_S = 1.0  # drive rates are averaged over the last second of 10 ms samples
CPU_WINDOW_S = 2.0
# The dashboard's own threads, by name: the UI loop, Textual's input and output, the poll workers (asyncio's
# executor) and the drive monitor. Any other thread of this process is a scheduler started here (`s`): the model.
DASHBOARD_THREADS = ("MainThread", "textual-", "asyncio_", "drive-monitor")
MONITOR_RESTART_S = 2.0  # the drive monitor samples every 10 ms; no sample for this long: it is started again


@dataclass(frozen=True)
class DriveSource:
    """A row of the drive panel: a drive of drives.toml, or (without one) a device holding stores' experts.

    `engine_drives`: the drive names the engine counts reads under (a manifest's) that land on this row.
    """

    name: str
    device: str
    origin: str  # where the row comes from: "drives.toml", or the stores whose experts are there
    engine_drives: tuple[str, ...]


@dataclass(frozen=True)
class DriveRow:
    """One drive now: read MB/s from its device counters and its measured ceiling (None: not probed)."""

    name: str
    device: str
    mb_per_s: float
    ceiling_mb_per_s: float | None
    origin: str = "drives.toml"
    engine_drives: tuple[str, ...] = ()

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
    cpu_fraction: float  # the dashboard's own threads' CPU time over wall time, over the last CPU_WINDOW_S
    refresh_hz: float  # snapshots collected per second over the same window
    service: ServiceState | None = None
    catalogue: CatalogueView | None = None
    drive_note: str = ""  # why there are no drive rows, when there are none
    service_read_mb_per_s: float | None = None  # the service process's own reads (None: no counters for it)
    taken_at: float = field(default_factory=time.time)
    drives_at: float | None = None  # Unix time of the drive monitor's newest sample (None: no monitor)
    # The service's CPU over the same window, the model's work: its process's, or, with the scheduler started
    # in this dashboard, this process's less the dashboard's own threads (None: not measured yet).
    service_cpu_fraction: float | None = None


def _ceilings() -> dict[str, float]:
    """Best measured MB/s per drive from `nightshift drives probe`; empty when never probed."""
    try:
        ceilings = Ceilings.load(drives_file().parent / CEILINGS_FILE)
    except NightshiftError:
        return {}
    return {drive.name: drive.best().bytes_per_s / 1e6 for drive in ceilings.drives if drive.cells}


def service_state() -> ServiceState:
    """Ask the service; with none answering, read the data dir the same way `nightshift jobs` does."""
    from nightshift.app.daemon.control import jobs, jobs_without_service, reports, service_pid
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
        return CatalogueView([], f"no benchmark runs recorded yet ({path}): "
                                 "`nightshift bench decode --model NAME` records one")  # fmt: skip
    try:
        return CatalogueView(Catalogue(path).runs(limit=500))
    except (NightshiftError, KeyError, TypeError, ValueError) as exc:
        return CatalogueView([], f"cannot read the run catalogue {path}: {exc!r}")


def drive_sources() -> list[DriveSource]:
    """The drives of drives.toml; without that file, each device the stores' expert files are on.

    Raises NightshiftError when drives.toml is there but wrong, or names a root that is not on a device.
    """
    path = drives_file()
    if path.exists():
        return [DriveSource(d.name, resolve_device(d.root).counters_name, "drives.toml", (d.name,))
                for d in load_drives(path)]  # fmt: skip
    devices: dict[str, tuple[set[str], list[str]]] = {}  # device -> (engine drive names, stores)
    for store in sorted(models_dir().iterdir()) if models_dir().is_dir() else []:
        if not is_store(store):
            continue
        try:
            manifest = read_manifest(store)
        except NightshiftError:
            continue  # an import still running or a damaged store: `nightshift model list` says which
        for drive, root in manifest.drives.items():
            try:
                device = resolve_device(root).counters_name
            except NightshiftError:
                continue  # a drive not mounted now; the model says so when it is opened
            names, stores = devices.setdefault(device, (set(), []))
            names.add(drive)
            if store.name not in stores:
                stores.append(store.name)
    return [DriveSource(device, device, "experts of " + ", ".join(stores), tuple(sorted(names)))
            for device, (names, stores) in devices.items()]  # fmt: skip


def _changed_at(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


class ProcessReads:
    """A process's own bytes read from storage per second (its /proc/PID/io, through psutil), over ~1 s.

    None where the platform keeps no such counter (psutil has none on macOS): the engine's counters remain.
    """

    def __init__(self) -> None:
        self.pid: int | None = None
        self.samples: deque[tuple[float, int]] = deque()

    def rate(self, pid: int | None) -> float | None:
        if pid != self.pid:
            self.pid, self.samples = pid, deque()
        if pid is None:
            return None
        try:
            read = psutil.Process(pid).io_counters().read_bytes
        except (psutil.Error, AttributeError, NotImplementedError):
            return None
        now = time.monotonic()
        self.samples.append((now, read))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW_S:
            self.samples.popleft()
        then, before = self.samples[0]
        return (read - before) / (now - then) / 1e6 if now > then else None


def _thread_seconds(process: psutil.Process) -> dict[int, float]:
    """CPU seconds of each thread of `process` so far, by native thread id ({} where the platform says none)."""
    try:
        return {t.id: t.user_time + t.system_time for t in process.threads()}
    except (psutil.Error, NotImplementedError):
        return {}


def _process_seconds(pid: int) -> float | None:
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


class CpuShares:
    """The dashboard's own CPU and the model's, apart, as shares of one core over windows of CPU_WINDOW_S.

    The model runs in the service's process, which is this one when the scheduler was started in the
    dashboard: then the dashboard's share is its own threads' (DASHBOARD_THREADS) and the rest is the model's.
    """

    def __init__(self, process: psutil.Process):
        self.process = process
        self.own = self.service = 0.0
        self.service_measured = False
        self._then = time.monotonic()
        self._threads = _thread_seconds(process)
        self._service: tuple[int | None, float | None] = (None, None)  # the service's pid and its CPU seconds then

    def measure(self, service_pid: int | None) -> bool:
        """Update the shares when a window has passed; True when it had."""
        now = time.monotonic()
        span = now - self._then
        if span < CPU_WINDOW_S:
            return False
        threads = _thread_seconds(self.process)
        mine = {t.native_id for t in threading.enumerate() if t.name.startswith(DASHBOARD_THREADS)}
        spent = {tid: seconds - self._threads.get(tid, 0.0) for tid, seconds in threads.items()}
        self.own = sum(seconds for tid, seconds in spent.items() if tid in mine) / span
        here = service_pid == self.process.pid
        seconds = sum(spent.values()) if here else _process_seconds(service_pid) if service_pid else None
        pid, before = self._service
        self.service_measured = seconds is not None and pid == service_pid and (here or before is not None)
        if self.service_measured:
            self.service = (seconds - self.own * span) / span if here else (seconds - before) / span
        self._then, self._threads, self._service = now, threads, (service_pid, None if here else seconds)
        return True


class Feed:
    """The dashboard's sources; `collect()` is called from one worker at a time, never concurrently.

    The drive rows are found again whenever drives.toml or the models folder changes (checked with the queue).
    """

    def __init__(self) -> None:
        self.monitor: DriveMonitor | None = None
        self.sources: list[DriveSource] = []
        self.note = ""
        self.drives_key: tuple[float | None, float | None] | None = None
        self.ceilings: dict[str, float] = {}
        self.service_reads = ProcessReads()
        self.cpu = CpuShares(psutil.Process(os.getpid()))
        self.refresh_hz = 0.0
        self.collected = 0
        self._window_start = time.monotonic()
        self._watch_drives()

    def _watch_drives(self) -> None:
        """(Re)start the drive monitor when drives.toml or the models folder changed since it was started."""
        key = (_changed_at(drives_file()), _changed_at(models_dir()))
        if key == self.drives_key:
            return
        self.drives_key = key
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None
        self.ceilings = _ceilings()
        try:
            self.sources = drive_sources()
        except NightshiftError as exc:
            self.sources, self.note = [], f"no drive rates: {exc}"
            return
        self.note = "" if self.sources else (
            f"no drives.toml ({drives_file()}) and no model's experts on a drive: import a model "
            f"(`nightshift model import`) or write drives.toml ({doc('dashboard.md')})")  # fmt: skip
        if self.sources:
            self.monitor = DriveMonitor([s.name for s in self.sources], [s.device for s in self.sources],
                                        history_s=5.0).start()  # fmt: skip

    def _measure(self, service_pid: int | None) -> None:
        """CPU shares (the dashboard's own, the model's) and snapshots per second, over windows of CPU_WINDOW_S."""
        self.collected += 1
        now = time.monotonic()
        if self.cpu.measure(service_pid):
            self.refresh_hz = self.collected / (now - self._window_start)
            self._window_start, self.collected = now, 0

    def drives_at(self) -> float | None:
        """Unix time of the monitor's newest sample; a monitor whose samples stopped is started again."""
        if self.monitor is None:
            return None
        times, _ = self.monitor.window(0.0)
        if not len(times):
            return None
        age = time.monotonic() - float(times[-1])
        if age > MONITOR_RESTART_S:
            self.drives_key = None  # its thread died: the next read of the queue builds a new one
        return time.time() - age

    def drive_rows(self) -> list[DriveRow]:
        if self.monitor is None:
            return []
        try:
            rates = self.monitor.rates(RATE_WINDOW_S)
        except RuntimeError:  # fewer than two samples yet
            return []
        return [
            DriveRow(source.name, source.device, 0.0 if math.isnan(rate.os_bytes_per_s) else rate.os_bytes_per_s / 1e6,
                     self.ceilings.get(source.name), source.origin, source.engine_drives)
            for rate, source in zip(rates.values(), self.sources)
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
        if with_service:
            self._watch_drives()
        pid = service.pid if service is not None else service_pid
        self._measure(pid)
        return Snapshot(self.drive_rows(), self.memory(pid), self.cpu.own, self.refresh_hz, service, catalogue,
                        self.note, self.service_reads.rate(pid), drives_at=self.drives_at(),
                        service_cpu_fraction=self.cpu.service if self.cpu.service_measured else None)  # fmt: skip

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None
