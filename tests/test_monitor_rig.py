"""The monitor on the rig: a throttled read load on one drive shows at the rate the readers saw, on that drive only."""

from __future__ import annotations

import time

import pytest

from nightshift.engine.instruments.monitor import ENGINE_BYTES, ENGINE_IN_FLIGHT, OS_BYTES, DriveMonitor
from nightshift.engine.io.counters import DriveReadCounters
from nightshift.engine.io.devices import resolve_device
from nightshift.engine.io.direct import open_direct
from nightshift.engine.io.probe import measure, probe_file
from nightshift.engine.rig.drives import RigSpec, inside_rig, rig_up
from tests.helpers.rig import requires_rig

pytestmark = [pytest.mark.rig, requires_rig]
MiB = 1 << 20


def test_monitor_rates_follow_a_known_throttled_load(rig_place):
    state = rig_up(rig_place.rig_dir, RigSpec(2, 64 << 20, 50_000_000), rig_place.drives_file)
    drives = state.as_drives()
    names = [d.name for d in drives]
    counters = DriveReadCounters(names)
    devices = [resolve_device(d.root).counters_name for d in drives]
    with (
        probe_file(drives[0], 16 * MiB) as path,
        open_direct(path) as f,
        DriveMonitor(names, devices, counters) as monitor,
        inside_rig(state),
    ):
        start = time.monotonic()
        load = measure(f, MiB, 4, 1.5, "rig0", counters)
        end = time.monotonic()
    times, values = monitor.window()
    during = (times >= start) & (times <= end)
    span = times[during][-1] - times[during][0]
    os_rate = (values[during][-1, :, OS_BYTES] - values[during][0, :, OS_BYTES]) / span
    engine_rate = (values[during][-1, 0, ENGINE_BYTES] - values[during][0, 0, ENGINE_BYTES]) / span

    # What our counters saw is exactly what the readers did.
    assert values[-1, 0, ENGINE_BYTES] - values[0, 0, ENGINE_BYTES] == load.reads * MiB
    assert 1 <= values[:, 0, ENGINE_IN_FLIGHT].max() <= 4 and values[-1, 0, ENGINE_IN_FLIGHT] == 0
    # The device counters show the same load at the same rate, and nothing on the idle drive.
    assert os_rate[0] == pytest.approx(load.bytes_per_s, rel=0.15), (os_rate, load)
    assert engine_rate == pytest.approx(load.bytes_per_s, rel=0.15), (engine_rate, load)
    assert os_rate[1] < 0.01 * os_rate[0], os_rate
