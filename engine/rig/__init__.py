"""The test and benchmark rig: loop-device drives on one disk, each read-throttled by a cgroup (drives.py), the
cgroups that limit reads and memory (cgroups.py), and fio as an independent check of the drive probe (fio.py)."""
