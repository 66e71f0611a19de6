"""An independent check of the probe: fio (https://fio.readthedocs.io) reading the same file the same way.

fio keeps `queue_depth` direct reads in flight with libaio from one thread, where the
probe uses that many threads; both read random aligned offsets for a fixed time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from nightshift.engine.errors import NightshiftError
from nightshift.engine.io.direct import open_direct
from nightshift.engine.io.drives import Drive
from nightshift.engine.io.probe import measure, probe_file


class FioError(NightshiftError):
    """fio is missing or failed."""


@dataclass(frozen=True)
class Agreement:
    """The probe and fio on one drive at one (read size, queue depth)."""

    drive: str
    read_bytes: int
    queue_depth: int
    probe_bytes_per_s: float
    fio_bytes_per_s: float


def fio_read(path: Path, read_bytes: int, queue_depth: int, seconds: float) -> float:
    """Bytes/s fio measures reading `path` with O_DIRECT, random offsets, `queue_depth` in flight."""
    if not shutil.which("fio"):
        raise FioError("fio is not installed (Debian: `apt-get install fio`)")
    argv = [
        "fio",
        "--name=nightshift-check",
        f"--filename={path}",
        "--rw=randread",
        f"--bs={read_bytes}",
        "--direct=1",
        "--ioengine=libaio",
        f"--iodepth={queue_depth}",
        "--time_based",
        f"--runtime={max(1, round(seconds))}",
        "--ramp_time=0",
        "--output-format=json",
        "--readonly",
    ]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise FioError(f"fio failed on {path}: {done.stderr.strip() or done.stdout.strip()}")
    report = json.loads(done.stdout[done.stdout.index("{") :])
    return float(report["jobs"][0]["read"]["bw_bytes"])


def compare_with_fio(
    drive: Drive,
    settings: list[tuple[int, int]],
    seconds: float = 3.0,
) -> list[Agreement]:
    """Probe and fio, one after the other on the same file, for each (read size, queue depth)."""
    results = []
    with probe_file(drive, 4 * max(size for size, _ in settings)) as path, open_direct(path) as f:
        for size, depth in settings:
            ours = measure(f, size, depth, seconds).bytes_per_s
            results.append(Agreement(drive.name, size, depth, ours, fio_read(path, size, depth, seconds)))
    return results
