"""Heartbeat: a long step is never silent, in a log or on a terminal."""

from __future__ import annotations

import io

from nightshift.app import progress
from nightshift.app.progress import Heartbeat
from tests.helpers.waits import wait_for


def test_off_a_terminal_the_status_is_said_again_with_its_seconds(monkeypatch):
    monkeypatch.setattr(progress, "PROGRESS_EVERY_S", 0.1)
    lines: list[str] = []
    with Heartbeat(lines.append) as beat:
        beat.say("calibrating")
        wait_for(lambda: len(lines) > 1, 30, "the status said again", 0.01)
        beat.note("layer 3/30")
        wait_for(lambda: lines[-1].startswith("layer 3/30 ("), 30, "the note said again", 0.01)
    assert lines[0] == "calibrating"
    repeats = lines[1:]
    assert any(line.startswith("calibrating (") and line.endswith(" s)") for line in repeats)
    assert repeats[-1].startswith("layer 3/30 (")  # a note changes what is repeated, without a line of its own
    assert "layer 3/30" not in lines[: lines.index(repeats[-1])]


def test_on_a_terminal_the_status_is_redrawn_in_place_and_a_said_line_starts_below_it(monkeypatch):
    monkeypatch.setattr(progress, "PROGRESS_EVERY_S", 0.1)
    said: list[str] = []
    terminal = io.StringIO()
    with Heartbeat(said.append, in_place=terminal) as beat:
        beat.say("writing the narrative")
        beat.note("reading the 430-token prompt")
        wait_for(
            lambda: "(1 s)" in terminal.getvalue(), 30, "the timer at 1 s", 0.01
        )  # in place, it moves every second
        beat.say("report written")
    drawn = terminal.getvalue()
    assert said == ["writing the narrative", "report written"]  # nothing repeated as new lines
    assert drawn.count("\r  reading the 430-token prompt (") >= 2
    assert "(1 s)" in drawn
    assert drawn.endswith("\n")  # the in-place line was ended before the next line was said


def test_a_status_that_carries_its_own_time_gets_no_seconds_added(monkeypatch):
    monkeypatch.setattr(progress, "PROGRESS_EVERY_S", 0.1)
    lines: list[str] = []
    with Heartbeat(lines.append) as beat:
        beat.note("12 tokens, 2.1 tok/s, 6 s", timed=False)
        wait_for(lambda: len(lines) > 1, 30, "the status said again", 0.01)
    assert set(lines) == {"12 tokens, 2.1 tok/s, 6 s"}


def test_the_last_note_is_shown_when_the_work_ends_even_if_2_s_have_not_passed():
    lines: list[str] = []
    with Heartbeat(lines.append) as beat:
        beat.say("importing")
        beat.note("imported 2.68 GB of 2.68 GB (100 %)", timed=False)
    assert lines == ["importing", "imported 2.68 GB of 2.68 GB (100 %)"]
