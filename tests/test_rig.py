"""The rig: up builds real throttled drives, down removes all of it, a failed up leaves nothing."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nightshift.app.cli import main
from nightshift.engine.io.devices import resolve_device
from nightshift.engine.io.drives import load_drives
from nightshift.engine.rig.drives import (
    RigError,
    RigSpec,
    RigState,
    cgroup_name,
    rig_command,
    rig_down,
    rig_status,
    rig_up,
)
from tests.helpers.rig import leftovers, requires_rig
from tests.helpers.waits import wait_for

pytestmark = [pytest.mark.rig, requires_rig]

SMALL = dict(count=2, size_bytes=64 << 20, read_bps=50_000_000)
NIGHTSHIFT = Path(sys.executable).with_name("nightshift")


def test_up_builds_throttled_direct_io_drives_and_down_removes_them(rig_place):
    state = rig_up(rig_place.rig_dir, RigSpec(**SMALL, read_iops=900), rig_place.drives_file)

    drives = load_drives(rig_place.drives_file)
    assert [d.name for d in drives] == ["rig0", "rig1"]
    for drive, made in zip(drives, state.drives):
        device = resolve_device(drive.root)
        assert device.fs_type == "ext4" and device.device == Path(made.loop).name == device.disk
    _, statuses = rig_status(rig_place.rig_dir)
    assert [(s.mounted, s.direct_io, s.limit_bps) for s in statuses] == [(True, True, 50_000_000)] * 2
    if state.throttle().version == 1:
        iops = (Path(state.cgroup) / "blkio.throttle.read_iops_device").read_text().splitlines()
        assert set(iops) == {f"{d.major}:{d.minor} 900" for d in state.drives}
    inside = subprocess.run(rig_command(state, ["cat", "/proc/self/cgroup"]), capture_output=True, text=True)
    assert f"blkio:/{cgroup_name(rig_place.rig_dir)}" in inside.stdout
    assert len(leftovers(*rig_place.markers)["loop devices"]) == 2

    rig_down(rig_place.rig_dir)
    assert leftovers(*rig_place.markers) == {"loop devices": [], "mounts": [], "cgroups": []}
    assert not rig_place.drives_file.exists() and not rig_place.rig_dir.exists()


def test_failure_half_way_through_up_rolls_everything_back(rig_place):
    # A file where the second drive's mount point must go: mkdir fails after the first
    # drive is fully built and the second has its image and loop device.
    blocker = rig_place.rig_dir / "mnt" / "rig1"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("in the way")

    with pytest.raises(RigError, match=re.escape("cannot create mount point") + ".*everything it had made was removed"):
        rig_up(rig_place.rig_dir, RigSpec(**SMALL), rig_place.drives_file)

    assert leftovers(*rig_place.markers) == {"loop devices": [], "mounts": [], "cgroups": []}
    assert blocker.read_text() == "in the way"  # what we did not make stays
    assert not (rig_place.rig_dir / "images").exists() and not (rig_place.rig_dir / "rig.json").exists()
    assert not rig_place.drives_file.exists()


def test_an_existing_drives_file_is_never_overwritten(rig_place):
    rig_place.drives_file.write_text("# the user's own drives\n")
    with pytest.raises(RigError, match="already exists"):
        rig_up(rig_place.rig_dir, RigSpec(**SMALL), rig_place.drives_file)
    assert rig_place.drives_file.read_text() == "# the user's own drives\n"
    assert not rig_place.rig_dir.exists()


def test_down_refuses_while_a_process_runs_in_the_rig(rig_place):
    state = rig_up(rig_place.rig_dir, RigSpec(**SMALL), rig_place.drives_file)
    sleeper = subprocess.Popen(rig_command(state, ["sleep", "60"]))
    try:
        with pytest.raises(RigError, match=f"processes \\[{sleeper.pid}\\] still run in the rig"):
            _wait_until_in_rig(state, sleeper.pid) or rig_down(rig_place.rig_dir)
        assert RigState.load(rig_place.rig_dir).complete  # nothing was torn down
    finally:
        sleeper.kill()
        sleeper.wait()
    rig_down(rig_place.rig_dir)


def _wait_until_in_rig(state: RigState, pid: int) -> None:
    for _ in range(100):
        if pid in state.throttle().pids():
            return
        os.sched_yield()
        subprocess.run(["true"])
    raise AssertionError(f"pid {pid} never joined {state.cgroup}")


def test_cli_up_status_run_down(rig_place, monkeypatch, capsys):
    # The CLI builds in the data dir; point it at this test's place (its rig dir is <home>/nightshift-rig).
    monkeypatch.setenv("NIGHTSHIFT_HOME", str(rig_place.rig_dir.parent))
    assert main(["rig", "up", "--drives", "2", "--size-mib", "64", "--mbps", "80"]) == 0
    assert main(["rig", "status"]) == 0
    out = capsys.readouterr()
    assert "healthy" in out.err and out.out.count("\ton\t80\t") == 2
    inside = subprocess.run(
        [str(NIGHTSHIFT), "rig", "run", "--", "cat", "/proc/self/cgroup"], capture_output=True, text=True, check=True
    )
    assert f":/{cgroup_name(rig_place.rig_dir)}\n" in inside.stdout
    assert main(["rig", "limit", "--mbps", "25"]) == 0  # a new limit on the same drives
    assert main(["rig", "status"]) == 0
    assert capsys.readouterr().out.count("\ton\t25\t") == 2
    assert main(["rig", "limit", "--mbps", "0"]) == 1
    assert "read limit must be above 0" in capsys.readouterr().err
    assert main(["rig", "up", "--drives", "1"]) == 1
    assert "a rig is already up" in capsys.readouterr().err
    assert main(["rig", "down"]) == 0
    assert main(["rig", "status"]) == 1
    assert "no rig at" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (Debian package `fio`)")
def test_cli_verify_reads_every_drive_with_probe_and_fio(rig_place, monkeypatch, capsys):
    monkeypatch.setenv("NIGHTSHIFT_HOME", str(rig_place.rig_dir.parent))
    assert main(["rig", "up", "--drives", "1", "--size-mib", "128", "--mbps", "100"]) == 0
    capsys.readouterr()
    status = main(["rig", "verify", "--seconds", "1"])
    out = capsys.readouterr()
    rows = [line.split("\t") for line in out.out.splitlines()[1:]]
    assert [row[:4] for row in rows] == [["rig0", "1 MiB", "4", "100"], ["rig0", "17 MiB", "1", "100"]]
    assert status == (0 if "(within 10 %)" in out.err else 1)
    assert main(["rig", "down"]) == 0


@pytest.mark.slow
def test_ctrl_c_during_up_leaves_nothing_behind(rig_place, tmp_path):
    # mkfs.ext4 on PATH is a stand-in that says it started and then waits, so Ctrl-C lands mid-build on
    # every run (after the cgroup and the first image were made), however fast the machine builds.
    shims, started = tmp_path / "bin", tmp_path / "mkfs-started"
    shims.mkdir()
    mkfs = shims / "mkfs.ext4"
    mkfs.write_text(f"#!/bin/sh\ntouch {started}\nexec sleep 60\n")
    mkfs.chmod(0o755)
    env = {**os.environ, "NIGHTSHIFT_HOME": str(rig_place.rig_dir.parent), "PATH": f"{shims}:{os.environ['PATH']}"}
    # A run started in the background (`cmd &`) inherits SIGINT ignored; Ctrl-C at a terminal is not.
    up = subprocess.Popen(
        [str(NIGHTSHIFT), "rig", "up", "--drives", "4", "--size-mib", "256"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_for(lambda: up.poll() is not None or started.exists(), 120, "`rig up` to format its first drive", 0.005)
    up.send_signal(signal.SIGINT)
    _, err = up.communicate(timeout=60)
    assert up.returncode != 0 and "KeyboardInterrupt" in err
    assert leftovers(*rig_place.markers) == {"loop devices": [], "mounts": [], "cgroups": []}
    assert not (rig_place.rig_dir / "rig.json").exists() and not rig_place.drives_file.exists()


def test_an_unreadable_rig_record_is_named(tmp_path):
    (tmp_path / "rig.json").write_text('{"spec": {"count": 2, "colour": "red"}}')
    with pytest.raises(RigError, match="not a rig record nightshift can read"):
        rig_down(tmp_path)
