"""The dispatcher sends each read to the replica expected to finish first, and learns drive speeds."""

from __future__ import annotations

import pytest

from engine.io.ceilings import Ceilings, DriveCeiling, ProbeCell
from engine.moe.dispatch import DEFAULT_BANDWIDTH, Dispatcher, DriveEstimate, estimates_from

MB = 1_000_000


def test_least_expected_completion_prefers_the_idle_then_the_faster_drive():
    d = Dispatcher({"slow": DriveEstimate(bandwidth=100 * MB), "fast": DriveEstimate(bandwidth=400 * MB)})
    first, ahead = d.choose(["slow", "fast"], 4 * MB)
    assert (first, ahead) == ("fast", 0)
    # fast now has 4 MB queued: 8 MB / 400 MB/s = 20 ms beats 4 MB / 100 MB/s = 40 ms, so fast again
    assert d.choose(["slow", "fast"], 4 * MB) == ("fast", 4 * MB)
    # with 8 MB queued, fast would take 30 ms: still ahead of slow's 40 ms
    assert d.choose(["slow", "fast"], 4 * MB)[0] == "fast"
    # 16 MB on fast (50 ms) loses to idle slow (40 ms)
    assert d.choose(["slow", "fast"], 4 * MB)[0] == "slow"
    assert d.choices == 4


def test_in_flight_bytes_are_released_and_bandwidth_follows_measurements():
    d = Dispatcher({"a": DriveEstimate(bandwidth=1000 * MB, latency=0.0)})  # a read of 10 MB alone
    drive, ahead = d.choose(["a"], 10 * MB)
    assert d.snapshot()["a"].in_flight == 10 * MB
    d.finished(drive, 10 * MB, ahead, seconds=0.1, ok=True)  # measured 100 MB/s
    est = d.snapshot()["a"]
    assert est.in_flight == 0 and est.samples == 1
    assert 100 * MB < est.bandwidth < 1000 * MB
    for _ in range(50):
        drive, ahead = d.choose(["a"], 10 * MB)
        d.finished(drive, 10 * MB, ahead, seconds=0.1, ok=True)
    assert d.snapshot()["a"].bandwidth == pytest.approx(100 * MB, rel=0.01)


def test_failed_reads_do_not_teach_a_bandwidth():
    d = Dispatcher({"a": DriveEstimate()})
    drive, ahead = d.choose(["a"], MB)
    d.finished(drive, MB, ahead, seconds=5.0, ok=False)
    assert d.snapshot()["a"].bandwidth == DEFAULT_BANDWIDTH and d.snapshot()["a"].samples == 0


def test_first_replica_policy_ignores_load():
    d = Dispatcher({"a": DriveEstimate(), "b": DriveEstimate()}, policy="first_replica")
    assert [d.choose(["a", "b"], MB)[0] for _ in range(3)] == ["a", "a", "a"]


def test_estimates_start_from_the_probe():
    cells = [ProbeCell(4096, 1, 10, 1.0, 50 * MB, 2e-4, 3e-4), ProbeCell(1 << 20, 8, 10, 1.0, 800 * MB, 5e-3, 6e-3)]
    ceilings = Ceilings("now", "test", [DriveCeiling("a", "/r", "loop0", "O_DIRECT", cells)])
    est = estimates_from(ceilings, ["a", "b"])
    assert est["a"].bandwidth == 800 * MB and est["a"].latency == 2e-4
    assert est["b"].bandwidth == DEFAULT_BANDWIDTH
