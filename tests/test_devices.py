"""Drive resolution: from a drive root to its mount, device and whole disk."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from nightshift.engine.io.devices import (
    DeviceNotFoundError,
    Mount,
    mount_of,
    parse_mountinfo,
    resolve_device,
    whole_disk_from_diskutil,
)

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
40 27 8:17 / /mnt/my\\040drive rw,relatime shared:5 - xfs /dev/sdb1 rw
41 40 0:45 / /mnt/my\\040drive/cache rw - tmpfs tmpfs rw
42 27 8:33 / /mnt/my\\040drive rw,relatime - ext4 /dev/sdc1 rw
"""


def test_mountinfo_is_parsed_with_escapes_and_optional_fields():
    mounts = parse_mountinfo(MOUNTINFO)
    assert mounts[2] == Mount(8, 17, Path("/mnt/my drive"), "xfs", "/dev/sdb1")
    assert [m.fs_type for m in mounts] == ["proc", "ext4", "xfs", "tmpfs", "ext4"]


def test_mount_of_takes_the_deepest_mount_and_the_latest_over_an_earlier_one():
    mounts = parse_mountinfo(MOUNTINFO)
    assert mount_of(Path("/mnt/my drive/cache/x"), mounts).fs_type == "tmpfs"
    assert mount_of(Path("/mnt/my drive/experts"), mounts).source == "/dev/sdc1"  # mounted over sdb1
    assert mount_of(Path("/mnt/my drive/experts"), mounts, dev=(8, 17)).source == "/dev/sdb1"
    assert mount_of(Path("/home/me"), mounts).mount_point == Path("/")


@pytest.mark.skipif(not os.path.exists("/proc/self/mountinfo"), reason="Linux only")
def test_a_directory_on_the_root_disk_resolves_to_the_disk_under_root(tmp_path):
    drive = resolve_device(tmp_path)
    st = os.stat(tmp_path)
    sysfs = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}").resolve()
    assert drive.device == sysfs.name == drive.counters_name
    assert (Path("/sys/class/block") / drive.disk).exists()
    assert drive.mount_point in [tmp_path, *tmp_path.parents]


@pytest.mark.skipif(not os.path.exists("/dev/shm"), reason="needs a tmpfs at /dev/shm")
def test_a_file_system_without_a_block_device_is_refused_with_advice():
    with pytest.raises(DeviceNotFoundError, match=re.escape("tmpfs file system") + ".*put the drive root on a disk"):
        resolve_device("/dev/shm")


def test_a_missing_root_is_named(tmp_path):
    with pytest.raises(DeviceNotFoundError, match=re.escape(f"drive root {tmp_path / 'nope'} does not exist")):
        resolve_device(tmp_path / "nope")


def test_diskutil_records_map_to_the_physical_whole_disk():
    apfs = {
        "DeviceIdentifier": "disk3s1",
        "ParentWholeDisk": "disk3",
        "APFSPhysicalStores": [{"APFSPhysicalStore": "disk0s2"}],
    }
    assert whole_disk_from_diskutil(apfs) == "disk0"
    assert whole_disk_from_diskutil({"DeviceIdentifier": "disk4s1", "ParentWholeDisk": "disk4"}) == "disk4"
    with pytest.raises(DeviceNotFoundError, match="no whole disk"):
        whole_disk_from_diskutil({"DeviceIdentifier": "weird"})
