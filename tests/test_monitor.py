"""The drive monitor: its ring buffer, and its counters against reads whose size we know."""

from __future__ import annotations

import os

import numpy as np
import pytest

from nightshift.engine.instruments.monitor import ENGINE_BYTES, ENGINE_IN_FLIGHT, ENGINE_READS, OS_BYTES, DriveMonitor
from nightshift.engine.io.counters import DriveReadCounters
from nightshift.engine.io.devices import resolve_device
from nightshift.engine.io.direct import aligned_buffer, open_direct

MiB = 1 << 20


def test_the_ring_keeps_the_newest_samples_in_order():
    counters = DriveReadCounters(["a", "b"])
    monitor = DriveMonitor(["a", "b"], [None, None], counters, interval_s=0.01, history_s=0.05)  # 5 slots
    for i in range(12):
        counters.started("a")
        counters.finished("a", 1000 * (i + 1))
        monitor.sample()
    times, values = monitor.window()
    totals = np.cumsum([1000 * (i + 1) for i in range(12)])
    assert values[:, 0, ENGINE_BYTES].tolist() == totals[-5:].tolist()
    assert values[:, 0, ENGINE_READS].tolist() == [8, 9, 10, 11, 12]
    assert (values[:, 1, ENGINE_BYTES] == 0).all() and np.isnan(values[:, :, OS_BYTES]).all()
    assert np.all(np.diff(times) > 0)
    when, latest = monitor.latest()
    assert when == times[-1] and latest["a"]["engine_bytes"] == totals[-1] and latest["a"]["engine_in_flight"] == 0
    rates = monitor.rates(seconds=10)
    assert rates["a"].engine_bytes_per_s == pytest.approx((totals[-1] - totals[-5]) / (times[-1] - times[0]))
    counters.started("b")
    monitor.sample()
    assert monitor.latest()[1]["b"]["engine_in_flight"] == 1


def test_counters_must_match_the_drives():
    with pytest.raises(ValueError, match="same drives"):
        DriveMonitor(["a", "b"], [None, None], DriveReadCounters(["b", "a"]))


def test_a_known_read_load_shows_in_both_counters(tmp_path):
    """8 MiB read with direct I/O while the sampler thread runs: our counters see exactly that,
    the OS device counters at least that (other processes share the disk)."""
    path = tmp_path / "load"
    path.write_bytes(os.urandom(8 * MiB))
    device = resolve_device(tmp_path).counters_name
    counters = DriveReadCounters(["disk"])
    with DriveMonitor(["disk"], [device], counters) as monitor, open_direct(path) as f:
        monitor.sample()
        buffer = aligned_buffer(MiB)
        for offset in range(0, 8 * MiB, MiB):
            counters.started("disk")
            counters.finished("disk", f.read_into(buffer, offset))
        monitor.sample()
    _, values = monitor.window()
    change = values[-1, 0] - values[0, 0]
    assert change[ENGINE_BYTES] == 8 * MiB and change[ENGINE_READS] == 8
    assert change[OS_BYTES] >= 8 * MiB
    assert values[:, 0, ENGINE_IN_FLIGHT].max() <= 1
    cadence = monitor.cadence()
    assert cadence.samples == len(values) and 0 < cadence.cpu_fraction < 1


def test_cli_watch_prints_each_drive_every_interval(home, tmp_path, capsys):
    from nightshift.app.cli import main
    from nightshift.engine.io.drives import Drive, format_drives

    home.mkdir()
    (home / "drives.toml").write_text(format_drives([Drive("d0", tmp_path), Drive("d1", tmp_path)]))
    assert main(["drives", "watch", "--seconds", "0.3", "--every", "0.1"]) == 0
    out = capsys.readouterr()
    rows = [line.split("\t") for line in out.out.splitlines()]
    assert rows[0] == ["time_s", "drive", "read MB/s", "reads/s", "in flight"]
    assert [row[1] for row in rows[1:]] == ["d0", "d1"] * 3
    assert all(float(row[2]) >= 0 for row in rows[1:]) and "slots skipped" in out.err
    assert main(["drives", "watch", "--every", "0"]) == 1
