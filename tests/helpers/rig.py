"""What rig tests share: why they must skip here, a place to build a rig, and proof it left nothing behind."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from nightshift.engine.rig.cgroups import CgroupError, throttle_root
from nightshift.engine.rig.drives import cgroup_name


def rig_skip_reason() -> str | None:
    """Why a rig cannot be built on this machine, or None when it can."""
    if os.geteuid() != 0:
        return "rig tests need root (loop devices, mounts, cgroups)"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control missing)"
    for tool in ("losetup", "mkfs.ext4", "mount"):
        if not shutil.which(tool):
            return f"`{tool}` is missing (util-linux / e2fsprogs)"
    try:
        throttle_root()
    except CgroupError:
        return "no cgroup v1 blkio or v2 io controller"
    return None


requires_rig = pytest.mark.skipif(rig_skip_reason() is not None, reason=rig_skip_reason() or "")


def leftovers(*markers: str) -> dict[str, list[str]]:
    """Loop devices, mounts and cgroups whose description contains any of `markers`."""
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout.splitlines()
    mounts = Path("/proc/mounts").read_text().splitlines()
    _, root = throttle_root()
    groups = [str(p) for p in root.iterdir() if p.is_dir()]

    def mine(lines: list[str]) -> list[str]:
        return [line for line in lines if any(m in line for m in markers)]

    return {"loop devices": mine(loops), "mounts": mine(mounts), "cgroups": mine(groups)}


class RigPlace:
    """A rig directory and drives file unique to one test, and what names its leftovers."""

    def __init__(self, tmp_path: Path):
        self.rig_dir = tmp_path / "nightshift-rig"
        self.drives_file = tmp_path / "drives.toml"
        self.markers = (str(tmp_path), cgroup_name(self.rig_dir))
