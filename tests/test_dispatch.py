"""The dispatcher sends each read to the replica expected to finish first, and learns drive speeds."""

from __future__ import annotations

import pytest

from nightshift.engine.io.ceilings import Ceilings, DriveCeiling, ProbeCell
from nightshift.engine.moe.dispatch import DEFAULT_BANDWIDTH, WINDOW, Dispatcher, DriveEstimate, estimates_from

MB = 1_000_000


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_least_expected_completion_prefers_the_idle_then_the_faster_drive():
    d = Dispatcher({"slow": DriveEstimate(bandwidth=100 * MB), "fast": DriveEstimate(bandwidth=400 * MB)})
    assert d.choose(["slow", "fast"], 4 * MB) == "fast"
    # fast now has 4 MB queued: 8 MB / 400 MB/s = 20 ms beats 4 MB / 100 MB/s = 40 ms, so fast again
    assert d.choose(["slow", "fast"], 4 * MB) == "fast"
    assert d.snapshot()["fast"].in_flight == 8 * MB
    # with 8 MB queued, fast would take 30 ms: still ahead of slow's 40 ms
    assert d.choose(["slow", "fast"], 4 * MB) == "fast"
    # 16 MB on fast (50 ms) loses to idle slow (40 ms)
    assert d.choose(["slow", "fast"], 4 * MB) == "slow"
    assert d.choices == 4


def test_a_layer_of_reads_placed_at_once_is_spread_evenly_over_equal_drives():
    d = Dispatcher({name: DriveEstimate() for name in ("a", "b", "c")})
    placed = [d.choose(["a", "b", "c"], MB) for _ in range(8)]
    assert sorted(placed.count(name) for name in "abc") == [2, 3, 3]


def test_bandwidth_is_a_busy_drives_throughput_over_recent_reads():
    clock = Clock()
    d = Dispatcher({"a": DriveEstimate(latency=0.0)}, clock=clock)
    for _ in range(4):  # four 10 MB reads queued at once on a drive serving 100 MB/s
        d.choose(["a"], 10 * MB)
    assert d.snapshot()["a"].in_flight == 40 * MB
    for _ in range(4):  # they complete every 0.1 s
        clock.now += 0.1
        d.finished("a", 10 * MB, ok=True)
    est = d.snapshot()["a"]
    assert est.in_flight == 0 and est.samples == 4
    assert est.bandwidth == pytest.approx(100 * MB)
    clock.now += 5.0  # idle time is not counted: the next read measures from when it was placed
    d.choose(["a"], 10 * MB)
    clock.now += 0.1
    d.finished("a", 10 * MB, ok=True)
    assert d.snapshot()["a"].bandwidth == pytest.approx(100 * MB)
    for _ in range(WINDOW):  # the drive slows to 50 MB/s: the estimate follows within a window of reads
        d.choose(["a"], 10 * MB)
        clock.now += 0.2
        d.finished("a", 10 * MB, ok=True)
    assert d.snapshot()["a"].bandwidth == pytest.approx(50 * MB)


def test_failed_or_cancelled_reads_release_their_bytes_and_teach_no_bandwidth():
    d = Dispatcher({"a": DriveEstimate()})
    drive = d.choose(["a"], MB)
    d.finished(drive, MB, ok=False)
    est = d.snapshot()["a"]
    assert est.bandwidth == DEFAULT_BANDWIDTH and est.samples == 0 and est.in_flight == 0


def test_first_replica_policy_ignores_load():
    d = Dispatcher({"a": DriveEstimate(), "b": DriveEstimate()}, policy="first_replica")
    assert [d.choose(["a", "b"], MB) for _ in range(3)] == ["a", "a", "a"]


def test_estimates_start_from_the_probe():
    cells = [ProbeCell(4096, 1, 10, 1.0, 50 * MB, 2e-4, 3e-4), ProbeCell(1 << 20, 8, 10, 1.0, 800 * MB, 5e-3, 6e-3)]
    ceilings = Ceilings("now", "test", [DriveCeiling("a", "/r", "loop0", "O_DIRECT", cells)])
    est = estimates_from(ceilings, ["a", "b"])
    assert est["a"].bandwidth == 800 * MB and est["a"].latency == 2e-4
    assert est["b"].bandwidth == DEFAULT_BANDWIDTH
