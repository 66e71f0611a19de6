"""Which drives hold which experts: the layout planner.

Every expert is placed once, hottest first, on the drive with the least expected
read load that still has room; then, while budgets allow, the hottest experts get
replicas on drives of *other devices*, so the reader can spread a hot expert's
reads (or split one read in halves) over devices that work in parallel. Expected
load is routing frequency x file size, measured on calibration prompts; with no
measurement every expert weighs the same and only bytes are balanced.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from nightshift.engine.errors import NoSpaceError
from nightshift.engine.io.devices import DeviceNotFoundError, resolve_device
from nightshift.engine.io.drives import Drive
from nightshift.engine.store.manifest import human_size

Key = tuple[int, int]  # (layer, expert)


@dataclass(frozen=True)
class DriveRoom:
    """A drive as the planner sees it: its device and the bytes it may hold for this store."""

    name: str
    device: str
    room: int


def existing_parent(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return path


def drive_device(drive: Drive) -> str:
    """The disk the drive's root lives on: drives sharing one do not read in parallel.

    The whole disk as `resolve_device` finds it (two partitions of one disk are one device here);
    where that cannot be resolved (no block device under the root), the file system's st_dev.
    """
    root = existing_parent(drive.root)
    try:
        return f"disk {resolve_device(root).disk}"
    except DeviceNotFoundError:
        return f"st_dev {os.stat(root).st_dev}"


def free_bytes(drive: Drive) -> int:
    return shutil.disk_usage(existing_parent(drive.root)).free


def rooms(drives: list[Drive], already_held: dict[str, int] | None = None) -> list[DriveRoom]:
    """Room per drive: its budget or its free space (plus what this store already keeps there)."""
    held = already_held or {}
    out = []
    for drive in drives:
        free = free_bytes(drive) + held.get(drive.name, 0)
        room = min(free, drive.budget_bytes) if drive.budget_bytes is not None else free
        out.append(DriveRoom(drive.name, drive_device(drive), room))
    return out


def plan_placement(
    sizes: dict[Key, int], drives: list[DriveRoom], frequency: dict[Key, float] | None = None, replicate: bool = True
) -> dict[Key, list[str]]:
    """Drives (primary first) for every expert; raises NoSpaceError if one copy of each does not fit."""
    if not drives:
        raise NoSpaceError("no drives to place experts on; list at least one in drives.toml")
    frequency = frequency or {}
    order = sorted(sizes, key=lambda k: (-frequency.get(k, 0.0), k))
    used = {d.name: 0 for d in drives}
    load = {d.name: 0.0 for d in drives}
    room = {d.name: d.room for d in drives}
    device = {d.name: d.device for d in drives}
    placed: dict[Key, list[str]] = {}

    def weight(key: Key) -> float:
        return frequency.get(key, 0.0) * sizes[key]

    for key in order:
        fits = [d.name for d in drives if used[d.name] + sizes[key] <= room[d.name]]
        if not fits:
            need = sum(sizes.values())
            have = sum(d.room for d in drives)
            raise NoSpaceError(
                f"the experts need {human_size(need)} and the drives have room for {human_size(have)} "
                f"({', '.join(f'{d.name}: {human_size(d.room)}' for d in drives)}); free space or add a drive"
            )
        best = min(fits, key=lambda n: (load[n], used[n] / max(room[n], 1)))
        placed[key] = [best]
        used[best] += sizes[key]
        load[best] += weight(key)

    if not replicate:
        return placed
    hot = [k for k in order if frequency.get(k, 0.0) > 0]
    added = True
    while added:
        added = False
        for key in hot:
            holders = placed[key]
            devices = {device[n] for n in holders}
            fits = [d.name for d in drives if d.device not in devices and used[d.name] + sizes[key] <= room[d.name]]
            if not fits:
                continue
            best = min(fits, key=lambda n: load[n])
            share = weight(key) / len(holders)
            for n in holders:  # reads of this expert now split over one more holder
                load[n] -= share - weight(key) / (len(holders) + 1)
            holders.append(best)
            used[best] += sizes[key]
            load[best] += weight(key) / len(holders)
            added = True
    return placed


def check_free_space(drives: list[Drive], needed: dict[str, int]) -> None:
    """Refuse if drives sharing a file system need more together than it has free."""
    by_file_system: dict[int, list[Drive]] = {}
    for drive in drives:
        by_file_system.setdefault(os.stat(existing_parent(drive.root)).st_dev, []).append(drive)
    for members in by_file_system.values():
        need = sum(needed.get(d.name, 0) for d in members)
        free = free_bytes(members[0])
        if need > free:
            names = ", ".join(d.name for d in members)
            raise NoSpaceError(
                f"drive(s) {names} need {human_size(need)} but their file system has {human_size(free)} free; "
                "free space, lower the budget or add a drive"
            )
