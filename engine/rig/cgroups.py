"""Groups of processes the benchmarks limit: per-device reads (the rig) and memory (`bench peer`, pressure runs).

Reads: cgroup v1 blkio or v2 io.max, whichever is here. v1 (`/sys/fs/cgroup/blkio`):
`blkio.throttle.read_bps_device` / `read_iops_device`, one "MAJOR:MINOR VALUE" line per device. v2
(`/sys/fs/cgroup` with the io controller): `io.max` lines "MAJOR:MINOR rbps=VALUE riops=VALUE", after
enabling io for child groups.

Memory: v1 `/sys/fs/cgroup/memory` (`memory.limit_in_bytes`) or v2 `memory.max`. A memory cgroup counts
its processes' page cache as well as their own memory, so a limit bounds what mmap keeps of a file too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nightshift.engine.errors import NightshiftError

V1_ROOT = Path("/sys/fs/cgroup/blkio")
V2_ROOT = Path("/sys/fs/cgroup")
MEMORY_V1 = Path("/sys/fs/cgroup/memory")


class CgroupError(NightshiftError):
    """The machine has no usable cgroup read throttle, or a cgroup could not be set up or removed."""


@dataclass(frozen=True)
class ReadThrottle:
    """One cgroup whose member processes' reads are limited per device."""

    path: Path
    version: int

    def limit_reads(self, major: int, minor: int, bytes_per_s: int, reads_per_s: int | None = None) -> None:
        """Cap reads from device MAJOR:MINOR by processes in this group."""
        if self.version == 1:
            self._write("blkio.throttle.read_bps_device", f"{major}:{minor} {bytes_per_s}")
            if reads_per_s:
                self._write("blkio.throttle.read_iops_device", f"{major}:{minor} {reads_per_s}")
        else:
            iops = f" riops={reads_per_s}" if reads_per_s else ""
            self._write("io.max", f"{major}:{minor} rbps={bytes_per_s}{iops}")

    def read_limits(self) -> dict[tuple[int, int], int]:
        """The bytes/s cap per (major, minor) as the kernel reports it now."""
        limits: dict[tuple[int, int], int] = {}
        name = "blkio.throttle.read_bps_device" if self.version == 1 else "io.max"
        for line in (self.path / name).read_text().splitlines():
            device, *values = line.split()
            major, minor = (int(n) for n in device.split(":"))
            for value in values:
                value = value.removeprefix("rbps=")
                if value.isdigit():
                    limits[(major, minor)] = int(value)
                    break
        return limits

    def add(self, pid: int) -> None:
        """Move process `pid` (all its threads) into the group."""
        self._write("cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def _write(self, name: str, line: str) -> None:
        try:
            (self.path / name).write_text(line + "\n")
        except OSError as exc:
            raise CgroupError(f"cannot write {line!r} to {self.path / name}: {exc.strerror}") from exc


def throttle_root() -> tuple[int, Path]:
    """(cgroup version, hierarchy root) of the read throttle this machine offers."""
    if (V1_ROOT / "blkio.throttle.read_bps_device").exists():
        return 1, V1_ROOT
    controllers = V2_ROOT / "cgroup.controllers"
    if controllers.exists() and "io" in controllers.read_text().split():
        return 2, V2_ROOT
    raise CgroupError(
        "no cgroup read throttle here: neither cgroup v1 blkio (/sys/fs/cgroup/blkio) nor the cgroup v2 io "
        "controller is available; enable one (e.g. boot with the blkio/io controller mounted) to build a rig"
    )


def current_cgroup(version: int) -> Path:
    """The directory of the throttle hierarchy's cgroup this process is in now."""
    _, root = throttle_root()
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (version == 1 and "blkio" in controllers.split(",")) or (version == 2 and controllers == ""):
            return root / path.lstrip("/")
    raise CgroupError("this process is in no blkio/io cgroup (/proc/self/cgroup lists none)")


def create_throttle(name: str) -> ReadThrottle:
    """A new, empty cgroup `name` under the throttle hierarchy; refuses to reuse an existing one."""
    version, root = throttle_root()
    path = root / name
    if version == 2:
        _enable_io_for_children(root)
    try:
        path.mkdir()
    except FileExistsError:
        raise CgroupError(f"cgroup {path} already exists (a rig is up? run `nightshift rig down`)") from None
    except OSError as exc:
        raise CgroupError(f"cannot create cgroup {path}: {exc.strerror} (are you root?)") from exc
    return ReadThrottle(path, version)


def _enable_io_for_children(root: Path) -> None:
    control = root / "cgroup.subtree_control"
    if "io" not in control.read_text().split():
        try:
            control.write_text("+io\n")
        except OSError as exc:
            raise CgroupError(f"cannot enable the io controller in {control}: {exc.strerror}") from exc


def remove_throttle(path: Path) -> None:
    """Remove the cgroup at `path` (already gone is fine); refuses while processes are in it."""
    if not path.exists():
        return
    throttle = ReadThrottle(path, 1 if V1_ROOT in path.parents else 2)
    if pids := throttle.pids():
        raise CgroupError(f"processes {pids} still run in {path}; stop them, then run `nightshift rig down` again")
    try:
        os.rmdir(path)
    except OSError as exc:
        raise CgroupError(f"cannot remove cgroup {path}: {exc.strerror}") from exc


def command_in(procs_file: Path, argv: list[str]) -> list[str]:
    """`argv` wrapped so that it enters the cgroup whose `cgroup.procs` is `procs_file` before it runs."""
    return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs_file), *argv]


# (v1 file, v2 file) for each figure a memory group reports
_MEMORY_FILES = {
    "limit": ("memory.limit_in_bytes", "memory.max"),
    "usage": ("memory.usage_in_bytes", "memory.current"),
    "peak": ("memory.max_usage_in_bytes", "memory.peak"),
}
_ANON = ("total_rss", "anon")  # memory.stat key of the processes' own (anonymous) memory
_FILE = ("total_cache", "file")  # ... and of the page cache charged to the group


@dataclass(frozen=True)
class MemoryGroup:
    """One memory cgroup: its processes' memory and page cache are counted, and held to its limit."""

    path: Path
    version: int

    @classmethod
    def create(cls, name: str, limit: int | None = None) -> MemoryGroup:
        """A new, empty memory cgroup `name` (no limit unless `limit` bytes are given)."""
        v1 = MEMORY_V1.is_dir()
        root = MEMORY_V1 if v1 else V2_ROOT
        if not v1 and "memory" not in (root / "cgroup.controllers").read_text().split():
            raise CgroupError("no memory cgroup here: neither cgroup v1 memory nor the v2 memory controller")
        try:
            (root / name).mkdir()
        except FileExistsError:
            raise CgroupError(f"cgroup {root / name} already exists (left by a run that died? rmdir it)") from None
        except OSError as exc:
            raise CgroupError(f"cannot create cgroup {root / name}: {exc.strerror} (are you root?)") from exc
        group = cls(root / name, 1 if v1 else 2)
        if limit is not None:
            group.set_limit(limit)
        return group

    def set_limit(self, limit: int) -> None:
        """Hold the group to `limit` bytes; the kernel reclaims page cache down to it first."""
        self._write(self._file("limit"), str(limit))

    def add(self, pid: int) -> None:
        self._write("cgroup.procs", str(pid))

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def figure(self, name: str) -> int:
        """limit, usage or peak usage, in bytes."""
        text = (self.path / self._file(name)).read_text().strip()
        return int(text) if text.isdigit() else -1  # v2 "max": none

    def stat(self) -> dict[str, int]:
        return {
            key: int(value)
            for key, value in (line.split() for line in (self.path / "memory.stat").read_text().splitlines())
        }

    def anon_bytes(self) -> int:
        """Memory the processes hold themselves (not page cache)."""
        return self.stat()[_ANON[self.version - 1]]

    def file_bytes(self) -> int:
        """Page cache charged to the group (file pages its processes read or mapped)."""
        return self.stat()[_FILE[self.version - 1]]

    def oom_kills(self) -> int:
        """Processes the kernel killed for want of memory in this group."""
        name, key = ("memory.oom_control", "oom_kill") if self.version == 1 else ("memory.events", "oom_kill")
        for line in (self.path / name).read_text().splitlines():
            if line.startswith(key + " "):
                return int(line.split()[1])
        return 0

    def remove(self) -> None:
        """Remove the (empty) group; its page cache stays cached, charged to the parent."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise CgroupError(f"cannot remove cgroup {self.path}: {exc.strerror}") from exc

    def _file(self, name: str) -> str:
        return _MEMORY_FILES[name][self.version - 1]

    def _write(self, name: str, value: str) -> None:
        try:
            (self.path / name).write_text(value + "\n")
        except OSError as exc:
            raise CgroupError(f"cannot write {value!r} to {self.path / name}: {exc.strerror}") from exc
