"""The roofline's verdicts: a run faster than its floor is a measurement error, never a pass."""

from __future__ import annotations

from nightshift.engine.bench.decode import DecodeTiming, verdict, with_compute_floor


def figures(ms_per_token: float, disk_floor_ms: float) -> dict:
    return {
        "ms_per_token": ms_per_token,
        "disk_floor_ms": disk_floor_ms,
        "disk_floor_fraction": disk_floor_ms / ms_per_token,
    }


def test_a_run_at_its_floor_passes_and_one_beyond_it_is_flagged():
    at_floor = with_compute_floor(figures(100.0, 97.0), [1, 2], DecodeTiming([1, 2], 0.02))
    assert at_floor["roofline_fraction"] == 0.97 and not at_floor["floor_error"]
    assert verdict(at_floor) == "pass" and at_floor["tokens_identical"]
    beyond = with_compute_floor(figures(100.0, 100.5), [1, 2], DecodeTiming([1, 3], 0.02))
    assert beyond["floor_error"] and not beyond["tokens_identical"]
    assert verdict(beyond) == "measurement error: faster than its floor"


def test_a_compute_floor_slower_than_the_streamed_run_is_an_error_too():
    slowed = with_compute_floor(figures(100.0, 60.0), [1], DecodeTiming([1], 0.101))
    assert slowed["floor_error"] and verdict(slowed).startswith("measurement error")


def test_verdicts_below_the_roofline_and_compute_bound():
    assert verdict(figures(100.0, 50.0)) == "measured"  # no compute floor: no roofline
    below = with_compute_floor(figures(100.0, 80.0), [1], DecodeTiming([1], 0.02))
    assert verdict(below) == "below-roofline"
    differs = with_compute_floor(figures(100.0, 95.0), [1], DecodeTiming([2], 0.02))
    assert verdict(differs) == "pass, tokens differ from the model in RAM"
    bound = with_compute_floor(figures(100.0, 95.0), [1], DecodeTiming([1], 0.06))
    assert verdict(bound) == "pass, compute-bound"
