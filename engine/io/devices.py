"""From a drive's root directory to the block device under it, so its OS counters can be read.

Linux: the root's st_dev names the device (/sys/dev/block/MAJOR:MINOR), /proc/self/mountinfo
names the mount; a partition's whole disk is its sysfs parent. File systems without a
block device of their own in st_dev (btrfs, for one) are resolved through the mount's source.
macOS: psutil finds the mount, `diskutil info -plist` the whole disk (for APFS, the
physical store under the container), which is what the OS's per-disk counters report.
"""

from __future__ import annotations

import os
import plistlib
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from nightshift.engine.errors import NightshiftError


class DeviceNotFoundError(NightshiftError):
    """A drive root is not on a block device whose counters nightshift can read."""


@dataclass(frozen=True)
class DriveDevice:
    """Where a drive root lives: its mount, the device holding it and the disk that device is on."""

    root: Path
    mount_point: Path
    fs_type: str
    source: str  # what the mount table says is mounted, e.g. /dev/sda1
    device: str  # kernel name of the device holding the file system: sda1, loop3, disk3s1
    disk: str  # the whole disk: sda, loop3, disk0 (drives on one disk share its bandwidth)
    counters_name: str  # the name under which the OS counts this drive's reads


@dataclass(frozen=True)
class Mount:
    major: int
    minor: int
    mount_point: Path
    fs_type: str
    source: str


def resolve_device(root: str | os.PathLike) -> DriveDevice:
    """The mount, device and disk under the directory `root` (which must exist)."""
    root = Path(root)
    if not root.exists():
        raise DeviceNotFoundError(f"drive root {root} does not exist; create it or fix drives.toml")
    if sys.platform.startswith("linux"):
        return _resolve_linux(root)
    if sys.platform == "darwin":
        return _resolve_macos(root)
    raise DeviceNotFoundError(f"finding the device under {root} is supported on Linux and macOS only")


# --- Linux -----------------------------------------------------------------------------------


def parse_mountinfo(text: str) -> list[Mount]:
    """Mounts listed in the text of /proc/self/mountinfo (see proc(5)), in mount order."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        major, minor = (int(n) for n in fields[2].split(":"))
        mounts.append(Mount(major, minor, Path(_unescape(fields[4])), fields[dash + 1], _unescape(fields[dash + 2])))
    return mounts


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_of(path: Path, mounts: list[Mount], dev: tuple[int, int] | None = None) -> Mount:
    """The mount `path` is on: the longest mount point above it (the latest one mounted wins),
    preferring mounts of the device `dev` when given."""
    path = path.resolve()
    candidates = [m for m in mounts if path == m.mount_point or m.mount_point in path.parents]
    if dev is not None and any((m.major, m.minor) == dev for m in candidates):
        candidates = [m for m in candidates if (m.major, m.minor) == dev]
    if not candidates:
        raise DeviceNotFoundError(f"no mount found above {path}")
    longest = max(len(m.mount_point.parts) for m in candidates)
    return [m for m in candidates if len(m.mount_point.parts) == longest][-1]


def _resolve_linux(root: Path) -> DriveDevice:
    st_dev = root.stat().st_dev
    dev = (os.major(st_dev), os.minor(st_dev))
    mount = mount_of(root, parse_mountinfo(Path("/proc/self/mountinfo").read_text()), dev)
    sysfs = Path(f"/sys/dev/block/{dev[0]}:{dev[1]}")
    if not sysfs.exists() and mount.source.startswith("/dev/"):
        # btrfs and others report an anonymous st_dev; the mounted source is the real device.
        try:
            rdev = os.stat(mount.source).st_rdev
            sysfs = Path(f"/sys/dev/block/{os.major(rdev)}:{os.minor(rdev)}")
        except OSError:
            pass
    if not sysfs.exists():
        raise DeviceNotFoundError(
            f"{root} is on a {mount.fs_type} file system ({mount.source} at {mount.mount_point}) with no block "
            "device, so its reads cannot be counted; put the drive root on a disk (ext4, xfs, apfs, ...)"
        )
    device_dir = sysfs.resolve()
    disk_dir = device_dir.parent if (device_dir / "partition").exists() else device_dir
    # /proc/diskstats counts partitions on their own, which keeps two partitions of one disk apart.
    return DriveDevice(
        root, mount.mount_point, mount.fs_type, mount.source, device_dir.name, disk_dir.name, device_dir.name
    )


# --- macOS -----------------------------------------------------------------------------------


def whole_disk_from_diskutil(info: dict) -> str:
    """The physical whole disk (diskN) behind a `diskutil info -plist` record; APFS volumes
    live on a synthesized container disk whose physical store is what the counters see."""
    stores = info.get("APFSPhysicalStores") or []
    if stores and stores[0].get("APFSPhysicalStore"):
        name = stores[0]["APFSPhysicalStore"]
    else:
        name = info.get("ParentWholeDisk") or info.get("DeviceIdentifier", "")
    match = re.match(r"(disk\d+)", name)
    if not match:
        raise DeviceNotFoundError(f"diskutil reports no whole disk for {info.get('DeviceIdentifier', '?')}")
    return match.group(1)


def _resolve_macos(root: Path) -> DriveDevice:
    import psutil

    path = root.resolve()
    parts = [
        p for p in psutil.disk_partitions(all=True) if path == Path(p.mountpoint) or Path(p.mountpoint) in path.parents
    ]
    if not parts:
        raise DeviceNotFoundError(f"no mount found above {path}")
    part = max(parts, key=lambda p: len(Path(p.mountpoint).parts))
    if not part.device.startswith("/dev/disk"):
        raise DeviceNotFoundError(
            f"{root} is on {part.device} ({part.fstype}), not a disk; its reads cannot be counted"
        )
    try:
        out = subprocess.run(["diskutil", "info", "-plist", part.device], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise DeviceNotFoundError(f"`diskutil info {part.device}` failed: {exc}") from exc
    disk = whole_disk_from_diskutil(plistlib.loads(out))
    device = part.device.removeprefix("/dev/")
    return DriveDevice(root, Path(part.mountpoint), part.fstype, part.device, device, disk, disk)
