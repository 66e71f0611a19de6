"""Each drive's direct-I/O read ceiling over a grid of read sizes and queue depths.

A probe file is written on the drive, then `queue_depth` threads each keep one read of
`read_bytes` in flight at random aligned offsets for a fixed time (os.preadv releases
the GIL, so the threads overlap their reads). The file is removed afterwards.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from nightshift.engine.errors import NoSpaceError
from nightshift.engine.io.ceilings import DriveCeiling, ProbeCell
from nightshift.engine.io.counters import DriveReadCounters
from nightshift.engine.io.devices import DeviceNotFoundError, resolve_device
from nightshift.engine.io.direct import ALIGNMENT, DirectFile, aligned_buffer, open_direct, round_up
from nightshift.engine.io.drives import Drive

MiB = 1 << 20
READ_SIZES = (256 << 10, 1 * MiB, 4 * MiB, 17 * MiB)  # 17 MiB: a whole expert file of the reference model
QUEUE_DEPTHS = (1, 4, 16)
PROBE_FILE = ".nightshift-probe"


def probe_drive(
    drive: Drive,
    read_sizes: tuple[int, ...] = READ_SIZES,
    queue_depths: tuple[int, ...] = QUEUE_DEPTHS,
    seconds: float = 1.0,
    file_bytes: int = 256 * MiB,
    counters: DriveReadCounters | None = None,
) -> DriveCeiling:
    """Measure `drive` at every (read size, queue depth); counts reads in `counters` when given."""
    try:
        device = resolve_device(drive.root).device
    except DeviceNotFoundError:
        device = "none (no block device under this root)"  # still worth probing, e.g. ZFS
    with probe_file(drive, max(file_bytes, 2 * max(read_sizes))) as path, open_direct(path) as f:
        ceiling = DriveCeiling(drive.name, str(drive.root), device, f.mode)
        for size in read_sizes:
            for depth in queue_depths:
                ceiling.cells.append(measure(f, size, depth, seconds, drive.name, counters))
    return ceiling


@contextmanager
def probe_file(drive: Drive, size: int) -> Iterator[Path]:
    """A file of `size` bytes (rounded up to ALIGNMENT) on `drive` for the length of the block."""
    size = round_up(size)
    free = shutil.disk_usage(drive.root).free
    if free < size:
        raise NoSpaceError(
            f"drive {drive.name} ({drive.root}) has {free >> 20} MiB free; the probe needs "
            f"{size >> 20} MiB (pass a smaller --file-mib)"
        )
    path = Path(drive.root) / PROBE_FILE
    try:
        write_probe_file(path, size)
        yield path
    finally:
        path.unlink(missing_ok=True)


def write_probe_file(path: Path, size: int) -> None:
    """`size` bytes of incompressible data, synced to the drive."""
    chunk = os.urandom(4 * MiB)
    with open(path, "wb") as f:
        for offset in range(0, size, len(chunk)):
            f.write(chunk[: size - offset])
        f.flush()
        os.fsync(f.fileno())


def measure(
    f: DirectFile,
    read_bytes: int,
    queue_depth: int,
    seconds: float,
    drive: str = "",
    counters: DriveReadCounters | None = None,
) -> ProbeCell:
    """One cell: `queue_depth` threads reading `read_bytes` at random aligned offsets for `seconds`."""
    slots = (f.size - read_bytes) // ALIGNMENT + 1
    latencies: list[list[float]] = [[] for _ in range(queue_depth)]
    done_bytes = [0] * queue_depth
    start = time.monotonic()
    deadline = start + seconds

    def reader(k: int) -> None:
        # At least one read each: on a busy machine a thread may first run after the deadline, and a cell
        # without a sample has no rate and no latency.
        buffer = aligned_buffer(read_bytes)
        rng = random.Random(k)
        try:
            while not latencies[k] or time.monotonic() < deadline:
                offset = rng.randrange(slots) * ALIGNMENT
                t0 = time.monotonic()
                if counters:
                    counters.started(drive)
                got = f.read_into(buffer, offset, read_bytes)
                if counters:
                    counters.finished(drive, got)
                latencies[k].append(time.monotonic() - t0)
                done_bytes[k] += got
        finally:
            buffer.close()

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(queue_depth)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    every = np.concatenate([np.asarray(lat) for lat in latencies])
    return ProbeCell(
        read_bytes,
        queue_depth,
        int(every.size),
        elapsed,
        sum(done_bytes) / elapsed,
        float(every.mean()),
        float(np.percentile(every, 99)),
    )
