"""The dashboard's parts that need no terminal: the plot's bars, ETA and figures, formatting, the CLI entry."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nightshift.app.cli import main
from nightshift.app.daemon.runs import Run, RunProgress
from nightshift.app.tui.format import duration, seconds, stamp
from nightshift.app.tui.widgets.job import eta, figures
from nightshift.app.tui.widgets.plot import History, columns


def test_plot_bars_are_scaled_to_the_largest_value_in_eighths():
    assert columns([0, 4, 8], 3, 1) == [" ▄█"]
    assert columns([0, 4, 8], 3, 2) == ["  █", " ██"]  # 4 of 8 on two rows: one full lower cell
    assert columns([1.0], 4, 1) == ["   █"]  # newest at the right, older slots empty
    assert columns([0, 0], 2, 1) == ["  "]
    assert columns(range(10), 3, 1) == ["▆▇█"]  # only the last `width` values


def test_history_is_a_ring_that_counts_what_was_added():
    history = History(3)
    for value in range(5):
        history.append(value)
    assert list(history) == [2, 3, 4] and history.added == 5


def test_eta_and_figures_come_from_the_progress_record():
    progress = RunProgress(prompt_tokens=700, generated_tokens=40, time_to_first_token=2.5, decode_tokens_per_s=8.0,
                           max_tokens=160)  # fmt: skip
    assert eta(progress) == 15.0
    assert eta(replace(progress, decode_tokens_per_s=0.0)) is None
    first, second = figures(progress).splitlines()
    assert first == "40/160 tokens  8.0 tok/s  TTFT 2.50 s  prompt 700  ETA 15 s"
    assert second == "cache hits —  prefetch recall —  prefill read amp —  last to land —"  # a dense model
    reading = figures(replace(progress, generated_tokens=0)).splitlines()[0]
    assert reading == "reading the 700-token prompt; up to 160 tokens to write"
    assert figures(RunProgress()).splitlines()[0] == "reading the 0-token prompt; up to ? tokens to write"
    streamed = replace(progress, cache_hits=1830, prefetch_recall=0.874, read_amplification=1.03, last_landed="nvme1")
    assert figures(streamed).splitlines()[1] == (
        "cache hits 1830  prefetch recall 87%  prefill read amp 1.03x  last to land nvme1"
    )


def test_formatting_fits_narrow_columns():
    assert [seconds(s) for s in (None, 4.4, 65, 7322)] == ["—", "4 s", "1 m 05 s", "2 h 02 m"]
    assert stamp("2026-11-30T22:00:01+00:00") == "11-30 22:00" and stamp(None) == "—"
    queued = Run(1, "daily", None, None, "manual", "queued", "2026-11-30T21:59:00", None, None, None, None, None, None)
    assert duration(queued) == "—"
    running = replace(queued, state="running", started="2026-11-30T22:00:00", progress=RunProgress(elapsed=12.0))
    assert duration(running) == "12 s"
    assert duration(replace(running, state="done", finished="2026-11-30T22:03:30")) == "3 m 30 s"


def test_dashboard_is_a_command_and_the_default_only_in_a_terminal(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["dashboard", "--help"])
    assert exit.value.code == 0 and "attaches to `nightshift serve`" in capsys.readouterr().out
    assert main([]) == 0  # stdin/stdout are not a terminal under pytest: help, not the app
    assert "dashboard" in capsys.readouterr().out
