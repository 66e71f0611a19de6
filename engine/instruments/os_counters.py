"""The OS's cumulative read counters per block device: sysfs on Linux, psutil elsewhere."""

from __future__ import annotations

import os
import sys

import numpy as np

SECTOR = 512  # the kernel counts 512-byte sectors whatever the device's block size


class OsDiskCounters:
    """Reads (bytes, reads completed, reads in flight) for named devices; NaN where the OS has no figure.

    On Linux each device's /sys/class/block/NAME/stat (the /proc/diskstats fields of one
    device, partitions included) stays open and is re-read in place: a few microseconds a sample.
    """

    def __init__(self, device_names: list[str]):
        self.names = list(device_names)
        self._linux = sys.platform.startswith("linux")
        self._fds = [self._open_stat(name) for name in self.names] if self._linux else []

    @staticmethod
    def _open_stat(name: str) -> int:
        try:
            return os.open(f"/sys/class/block/{name}/stat", os.O_RDONLY) if name else -1
        except OSError:
            return -1

    def read(self) -> np.ndarray:
        """A (devices, 3) float array of bytes read, reads completed and reads in flight."""
        out = np.full((len(self.names), 3), np.nan)
        if self._linux:
            for row, fd in enumerate(self._fds):
                if fd >= 0:
                    fields = os.pread(fd, 512, 0).split()
                    out[row] = (int(fields[2]) * SECTOR, int(fields[0]), int(fields[8]))
        else:
            import psutil

            disks = psutil.disk_io_counters(perdisk=True) or {}
            for row, name in enumerate(self.names):
                if name in disks:
                    out[row, :2] = (disks[name].read_bytes, disks[name].read_count)
        return out

    def close(self) -> None:
        for fd in self._fds:
            if fd >= 0:
                os.close(fd)
        self._fds = []
