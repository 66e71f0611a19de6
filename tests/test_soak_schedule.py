"""Soak: scheduled runs back to back through the real service with a stepped clock; every one finishes and
the process's open descriptors and memory do not grow. (The 200-run figures: `bench/soak.py`.)"""

from __future__ import annotations

import pytest

from bench.soak import WARM_UP, soak
from nightshift.app.daemon.runs import RunQueue


@pytest.mark.slow
def test_scheduled_runs_back_to_back_all_finish_with_flat_descriptors_and_memory(home, tiny_model):
    result = soak(tiny_model, runs=WARM_UP + 5)
    figures = result.figures()
    assert [s.state for s in result.samples] == ["done"] * (WARM_UP + 5)
    runs = RunQueue().recent(100)
    assert len(runs) == WARM_UP + 5 and {run.origin for run in runs} == {"schedule"}  # each due run queued once
    assert len({run.due for run in runs}) == WARM_UP + 5
    assert figures["fds_end"] <= figures["fds_after_warm_up"]  # no descriptor leaks per run
    assert figures["rss_mb_end"] <= figures["rss_mb_after_warm_up"] * 1.1  # no memory growth beyond noise
    assert len(list((home / "reports" / "soak").glob("*.pdf"))) == WARM_UP + 5
