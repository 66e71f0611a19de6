"""Benchmark: the drive monitor's cadence and CPU cost while direct reads run on every drive.

    python -m bench.monitor_load --drives-file DRIVES [--rig-dir RIG] [--seconds 10]

With --rig-dir the process joins the rig's cgroup first, so the drives run at their limits.
Prints, per drive, what the readers counted next to what the monitor saw (engine and OS
counters), then the sampler's gaps (mean, p50, p99, max), skipped slots and share of one core.
"""

from __future__ import annotations

import argparse
import threading
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path

from nightshift.engine.instruments.monitor import Cadence, DriveMonitor, DriveRates
from nightshift.engine.io.ceilings import ProbeCell
from nightshift.engine.io.counters import DriveReadCounters
from nightshift.engine.io.devices import resolve_device
from nightshift.engine.io.direct import open_direct
from nightshift.engine.io.drives import Drive, load_drives
from nightshift.engine.io.probe import measure, probe_file
from nightshift.engine.rig.drives import RigState, inside_rig

MiB = 1 << 20


@dataclass(frozen=True)
class LoadReport:
    cells: dict[str, ProbeCell]  # what each drive's readers measured themselves
    seen: dict[str, DriveRates]  # what the monitor saw over the same stretch
    cadence: Cadence


def monitor_under_load(
    drives: list[Drive],
    seconds: float,
    read_bytes: int = MiB,
    queue_depth: int = 4,
    file_bytes: int = 256 * MiB,
) -> LoadReport:
    """Run `queue_depth` readers on every drive at once for `seconds` with the monitor sampling."""
    counters = DriveReadCounters([d.name for d in drives])
    devices = [resolve_device(d.root).counters_name for d in drives]
    cells: dict[str, ProbeCell] = {}
    with ExitStack() as stack:
        files = [stack.enter_context(open_direct(stack.enter_context(probe_file(d, file_bytes)))) for d in drives]
        monitor = stack.enter_context(DriveMonitor([d.name for d in drives], devices, counters))

        def load(drive: Drive, f) -> None:
            cells[drive.name] = measure(f, read_bytes, queue_depth, seconds, drive.name, counters)

        threads = [threading.Thread(target=load, args=(d, f)) for d, f in zip(drives, files)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seen = monitor.rates(seconds)
        cadence = monitor.cadence()
    return LoadReport(cells, seen, cadence)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drives-file", type=Path, required=True)
    parser.add_argument("--rig-dir", type=Path, help="join this rig's cgroup first")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--read-mib", type=int, default=1)
    parser.add_argument("--queue-depth", type=int, default=4)
    args = parser.parse_args(argv)
    with inside_rig(RigState.load(args.rig_dir)) if args.rig_dir else nullcontext():
        report = monitor_under_load(load_drives(args.drives_file), args.seconds, args.read_mib * MiB, args.queue_depth)
    print("drive\treaders MB/s\tmonitor engine MB/s\tmonitor OS MB/s\tOS reads/s\tOS in flight")
    for name, cell in report.cells.items():
        r = report.seen[name]
        print(
            f"{name}\t{cell.bytes_per_s / 1e6:.1f}\t{r.engine_bytes_per_s / 1e6:.1f}\t{r.os_bytes_per_s / 1e6:.1f}\t"
            f"{r.os_reads_per_s:.0f}\t{r.os_in_flight:.2f}"
        )
    c = report.cadence
    print(
        f"sampler: {c.samples} samples every {c.interval_s * 1e3:g} ms; gap mean {c.mean_gap_s * 1e3:.3f} ms, "
        f"p50 {c.p50_gap_s * 1e3:.3f}, p99 {c.p99_gap_s * 1e3:.3f}, max {c.max_gap_s * 1e3:.3f} ms; "
        f"{c.skipped_slots} slots skipped; CPU {c.cpu_fraction:.2%} of one core"
    )


if __name__ == "__main__":
    main()
