"""The dashboard's parts that need no terminal: plots and their scale, estimates, cards, key hints, fitting,
formatting in the user's zone, drive rows found without drives.toml, the service's own read rate, the CLI entry."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from datetime import datetime

import pytest

from nightshift.app.cli import main
from nightshift.app.daemon.runs import Run, RunProgress
from nightshift.app.paths import models_dir
from nightshift.app.tui.app import Dashboard
from nightshift.app.tui.feed import DriveRow, ProcessReads, drive_sources
from nightshift.app.tui.format import duration, seconds, stamp
from nightshift.app.tui.widgets.drives import drive_figures
from nightshift.app.tui.widgets.job import bar_total, card, earlier, eta, live_figures
from nightshift.app.tui.widgets.keys import hints
from nightshift.app.tui.widgets.plot import History, columns, round_up
from nightshift.app.tui.widgets.text import Fit, fit_rows
from nightshift.engine.generation import AnswerFigures
from nightshift.engine.io.devices import resolve_device
from nightshift.engine.io.direct import aligned_buffer, open_direct
from nightshift.engine.io.drives import Drive, format_drives
from tests.helpers.stores import import_tiny, tiny_checkpoint

PROGRESS = RunProgress(prompt_tokens=700, prompt_done=700, generated_tokens=40, time_to_first_token=2.5,
                       elapsed=7.5, decode_tokens_per_s=8.0, max_tokens=160)  # fmt: skip
BASE = Run(1, "daily", None, None, "manual", "running", "2026-11-30T21:59:00+00:00", "2026-11-30T22:00:00+00:00",
           None, None, None, None, PROGRESS)  # fmt: skip
MiB = 1 << 20
NOW = datetime.fromisoformat("2026-11-30T22:00:30+00:00").timestamp()


def test_plot_bars_on_a_fixed_scale_in_eighths():
    assert columns([0, 4, 8], 3, 1) == [" ▄█"]
    assert columns([0, 4, 8], 3, 2) == ["  █", " ██"]  # 4 of 8 on two rows: one full lower cell
    assert columns([1.0], 4, 1) == ["   █"]  # newest at the right, older slots empty
    assert columns([0, 0], 2, 1) == ["  "]
    assert columns(range(10), 3, 1) == ["▆▇█"]  # only the last `width` values
    assert columns([9.5, 160], 2, 1, top=330) == ["▁▄"]  # a blip on a busy scale stays small, but shows
    assert columns([500], 1, 1, top=330) == ["█"]  # above the scale: a full bar, not past it


def test_the_scale_is_a_round_number_above_what_is_kept():
    assert [round_up(v, 1.0) for v in (0, 0.3, 1, 1.2, 3, 7.5, 330, 2890)] == [1, 1, 1, 2, 5, 10, 500, 5000]
    assert round_up(9.5, 50.0) == 50


def test_history_is_a_ring_that_counts_what_was_added():
    history = History(3)
    for value in range(5):
        history.append(value)
    assert list(history) == [2, 3, 4] and history.added == 5
    history.clear()
    assert list(history) == [] and history.added == 6  # a plot redraws when its run's history is reset


def test_estimates_use_what_is_known():
    assert eta(PROGRESS, None) == (15.0, "at most, to max_tokens 160")
    assert eta(replace(PROGRESS, decode_tokens_per_s=0.0), None) == (None, "")
    before = replace(BASE, id=0, state="done", progress=replace(PROGRESS, generated_tokens=56, finish_reason="stop"))
    assert eta(PROGRESS, before) == (2.0, "if as long as run 0 (56 tokens)")
    assert eta(replace(PROGRESS, generated_tokens=60), before)[1] == "at most, to max_tokens 160"  # past it
    assert earlier(BASE, [BASE, before]) is before and earlier(BASE, [BASE]) is None
    reading = replace(BASE, progress=replace(PROGRESS, prompt_done=512, generated_tokens=0))
    assert live_figures(reading, before, NOW)[0] == (
        "reading the prompt: 512/700 tokens read · running 30 s\nabout 2 s in all at run 0's 280.0 tok/s"
    )
    assert live_figures(reading, None, NOW)[0].endswith("no earlier run to estimate from")
    read = replace(reading, progress=replace(reading.progress, prompt_done=700))
    assert live_figures(read, None, NOW)[0] == "prompt read (700 tokens); working out the first token · running 30 s"
    assert live_figures(replace(BASE, progress=None), None, NOW)[-1] == "preparing 30 s"
    assert live_figures(BASE, None, NOW)[0] == (
        "writing: 40/160 tokens at 8.0 tok/s · prompt 700 read at 280.0 tok/s in 2.5 s\nETA 15 s at most, to max_tokens 160"
    )


def answers(*plan: tuple[int, int, int, int, str | None]) -> list[AnswerFigures]:
    return [AnswerFigures(prompt, limit, done, tokens, ended) for prompt, limit, done, tokens, ended in plan]


def test_a_batch_is_told_from_its_answers():
    """Issue [24]: 4 answers of at most 64 tokens, not the schedule's 704; the ETA from the steps the longest open
    answer has left; a bar that ends full; "reached max_tokens" only for the answers that did."""
    reading = replace(BASE, progress=RunProgress(prompt_tokens=633, prompt_done=316, elapsed=40.0, max_tokens=256,
                                                 answers=answers((158, 64, 158, 0, None), (158, 64, 158, 0, None),
                                                                 (159, 64, 0, 0, None), (158, 64, 0, 0, None))))  # fmt: skip
    assert live_figures(reading, None, NOW)[0].startswith(
        "reading the prompts: answer 3 of 4 (0/159) · 316/633 tokens in all · running 30 s"
    )
    # 21 steps after the first tokens in 42 s: 2 s a step; answer 1 ended at 10 tokens, 3 and 4 at their limit
    # later, answer 2 has 64 - 22 = 42 steps to go.
    writing = RunProgress(prompt_tokens=633, prompt_done=633, generated_tokens=10 + 22 + 22 + 22, time_to_first_token=60.0,
                          elapsed=102.0, decode_tokens_per_s=1.8, max_tokens=256,
                          answers=answers((158, 64, 158, 10, "stop"), (158, 64, 158, 22, None), (159, 64, 159, 22, None),
                                          (158, 64, 158, 22, None)))  # fmt: skip
    assert eta(writing, None) == (84.0, "at most: the longest open answer has 42 tokens to go")
    assert bar_total(writing) == 10 + 3 * 64
    shown = live_figures(replace(BASE, progress=writing), None, NOW)[0]
    assert shown.startswith("writing 4 answers: 76/202 tokens at most · 1.8 tok/s together")
    assert shown.endswith("(1 ended by themselves, 3 still open)")
    ended = replace(writing, generated_tokens=150, finish_reason="length",
                    answers=answers((158, 64, 158, 10, "stop"), (158, 64, 158, 64, "length"),
                                    (159, 64, 159, 40, "stop"), (158, 64, 158, 36, "stop")))  # fmt: skip
    assert bar_total(ended) == 150  # the bar ends full at what was written
    done = replace(BASE, state="done", finished="2026-11-30T22:00:20+00:00", progress=ended)
    assert "150 tokens in 4 answers (3 ended by themselves, 1 reached their 64-token limit)" in card(done, NOW)[0]
    assert "max_tokens" not in card(done, NOW)[0]


def test_a_finished_run_keeps_a_card():
    done = replace(BASE, state="done", finished="2026-11-30T22:01:05+00:00", report="/r/daily-1.pdf",
                   progress=replace(PROGRESS, finish_reason="length"))  # fmt: skip
    first = card(done, NOW)[0]
    assert "done at" in first and "after 1 m 05 s" in first and "40 tokens (reached max_tokens)" in first
    assert "report /r/daily-1.pdf · o opens it" in first
    failed = replace(BASE, state="failed", finished="2026-11-30T22:00:02+00:00", error="no such file", progress=None)
    assert card(failed, NOW)[0].endswith("after 2 s\nno such file")


def test_help_and_quit_keep_their_place_as_the_bar_narrows():
    app = Dashboard.BINDINGS
    own = [binding for binding in __import__("nightshift.app.tui.screens", fromlist=["x"]).QueueScreen.BINDINGS]
    for width in (160, 80, 60, 40):
        shown = hints(own, app, width)
        text = "  ".join(f"{b.key_display or b.key} {label}" for b, label in shown)
        assert "? help" in text.lower() and "q quit" in text.lower(), width
        assert len(text) <= width or width < 50
    assert [label for _, label in hints(own, app, 160)][:3] == ["Run now", "Pause/resume", "Cancel job"]


def test_fit_shortens_before_it_cuts():
    fit = Fit("a long line of figures", "short", "s")
    assert fit.fitting(30, 1) == "a long line of figures" and fit.fitting(10, 1) == "short"
    assert Fit("two\nlines", "one").fitting(20, 1) == "one"
    rows = [("1", ("1", "report 3: month-end-2026-10-01.pdf"))]
    assert fit_rows(rows, ("run", "detail"), 1, 80) == rows
    assert fit_rows(rows, ("run", "detail"), 1, 20) == [("1", ("1", "report 3: m…"))]  # 20 - run (3) - padding (4) - 1


def test_times_are_in_the_users_zone(monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        assert stamp("2026-11-30T22:00:01+00:00") == "12-01 03:30"  # the queue's UTC
        assert stamp("2026-11-30T23:00:01+01:00") == "12-01 03:30"  # the index's schedule zone
        assert stamp(None) == "—"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_took_counts_while_a_run_runs():
    assert [seconds(s) for s in (None, 4.4, 65, 7322)] == ["—", "4 s", "1 m 05 s", "2 h 02 m"]
    assert duration(replace(BASE, state="queued", started=None), NOW) == "—"
    assert duration(BASE, NOW) == "30 s" and duration(BASE, NOW + 60) == "1 m 30 s"  # not the progress's 7.5 s
    assert duration(replace(BASE, state="done", finished="2026-11-30T22:03:30+00:00"), NOW, narrow=True) == "3m30s"


def test_a_drive_row_labels_the_devices_total_and_nightshifts_own():
    row = DriveRow("vda", "vda", 412.0, None, "experts of smollm2", ("store",))
    longest, *_, shortest = drive_figures(row, 398.4)
    assert "412.0 MB/s device, all processes" in longest and "398.4 MB/s nightshift (engine)" in longest
    assert shortest == "vda   412 dev 398 ours"


def test_without_drives_toml_the_rows_are_the_devices_of_the_stores_experts(home, tmp_path):
    assert drive_sources() == []
    store = import_tiny(models_dir(), tiny_checkpoint(tmp_path, "qwen3_moe"), "tiny-moe")
    (sources,) = drive_sources()  # two drives of the store, both folders on one device: one row
    device = resolve_device(tmp_path).counters_name
    assert (sources.name, sources.device, sources.origin) == (device, device, f"experts of {store.name}")
    assert sources.engine_drives == ("d0", "d1")
    (home / "drives.toml").write_text(format_drives([Drive("fast", tmp_path)]))
    assert [(s.name, s.origin) for s in drive_sources()] == [("fast", "drives.toml")]


def test_the_services_own_reads_come_from_its_process_counters(tmp_path):
    reads = ProcessReads()
    pid = os.getpid()
    assert reads.rate(pid) is None  # one sample: no rate yet
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(8 * MiB))
    with open_direct(data) as f:  # around the page cache: the process's storage counters see it
        buffer = aligned_buffer(MiB)
        for offset in range(0, 8 * MiB, MiB):
            f.read_into(buffer, offset)
    rate = reads.rate(pid)
    if rate is None:
        pytest.skip("no per-process I/O counters on this platform")
    (then, before), (now, after) = reads.samples[0], reads.samples[-1]
    assert after - before >= 8 * MiB and rate == pytest.approx((after - before) / (now - then) / 1e6)
    assert reads.rate(None) is None and reads.pid is None


def test_dashboard_is_a_command_and_the_default_only_in_a_terminal(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["dashboard", "--help"])
    assert exit.value.code == 0 and "attaches to `nightshift serve`" in capsys.readouterr().out
    assert main([]) == 0  # stdin/stdout are not a terminal under pytest: help, not the app
    assert "dashboard" in capsys.readouterr().out


def test_per_run_rates_and_plot_from_progress_records():
    from nightshift.app.daemon.control import Jobs
    from nightshift.app.tui.feed import ServiceState

    app = Dashboard()

    def seen(run: Run, now: float) -> None:
        app._follow_run(ServiceState(True, 1, Jobs([run], {}), []), now)

    first = replace(BASE, progress=replace(PROGRESS, elapsed=1.0, drive_bytes={"d0": 1_000_000}))
    seen(first, 100.0)
    seen(replace(first, progress=replace(first.progress, elapsed=3.0, drive_bytes={"d0": 5_000_000})), 102.0)
    assert app.engine_rates == {"d0": 2.0} and app.fresh_engine_rates(104.0) == {"d0": 2.0}
    assert app.fresh_engine_rates(105.5) == {}  # no record for a while: not shown as the rate now
    assert list(app.tokens_history) == [8.0, 8.0]
    seen(replace(first, id=2), 106.0)  # the next run: its own plot
    assert list(app.tokens_history) == [8.0]


def test_a_poll_the_busy_service_misses_keeps_its_queue_and_the_runs_plot():
    """A service that misses one poll's timeout (both cores busy generating) has not lost its runs: the queue
    stays shown with the error beside it and ages until a poll is answered; a service that is gone does not."""
    from nightshift.app.daemon.control import Jobs
    from nightshift.app.tui.feed import Memory, ServiceState, Snapshot

    app = Dashboard()

    def polled(service: ServiceState, now: float) -> None:
        snapshot = Snapshot([], Memory(None, 1, 1), 0.0, 1.0, service=service, taken_at=now)
        app.on_dashboard_refreshed(Dashboard.Refreshed(snapshot))

    for elapsed, now in ((1.0, 100.0), (3.0, 102.0)):
        polled(ServiceState(True, 1, Jobs([replace(BASE, progress=replace(PROGRESS, elapsed=elapsed))], {}), []), now)
    assert list(app.tokens_history) == [8.0, 8.0]
    timeout = "the service did not answer within 2 s"
    polled(ServiceState(False, None, Jobs([], {}), [], error=timeout), 104.0)
    assert app.service.running and app.service.jobs.current.id == 1 and app.service.error == timeout
    assert app.ages(106.0).service == pytest.approx(4.0)  # the queue's age goes on: it is marked stale
    polled(ServiceState(True, 1, Jobs([replace(BASE, progress=replace(PROGRESS, elapsed=5.0))], {}), []), 106.0)
    assert list(app.tokens_history) == [8.0, 8.0, 8.0] and app.service.error is None  # the same run's plot goes on
    polled(ServiceState(False, None, Jobs([], {}), []), 108.0)  # nothing listens: the service is gone
    assert not app.service.running and app.service.jobs.runs == []
