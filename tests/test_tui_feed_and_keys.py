"""A dashboard never shows stale figures as live, and its keys act as in the tools people like (issue [24]).

The feed here is a real `Snapshot` source that can be made to hang in `collect()` (as a stuck poll
would); the app's own timer must notice and say so, with the age, and go back to live when the feed does.
Ctrl+C quits, j and k move in lists.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time

from nightshift.app.daemon.control import Jobs
from nightshift.app.daemon.runs import Run, RunProgress
from nightshift.app.tui.ages import STALE_AFTER_S, Ages, age_label, stale_line
from nightshift.app.tui.app import Dashboard
from nightshift.app.tui.feed import DriveRow, Memory, ServiceState, Snapshot
from nightshift.app.tui.widgets.text import Fit
from tests.helpers.waits import until

GiB = 1 << 30
WRITING = RunProgress(prompt_tokens=400, prompt_done=400, generated_tokens=12, time_to_first_token=30.0,
                      elapsed=35.0, decode_tokens_per_s=2.2, max_tokens=160)  # fmt: skip
RUN = Run(3, "month-end", None, None, "manual", "running", "2026-12-01T10:00:00+00:00", "2026-12-01T10:00:01+00:00",
          None, None, None, 4242, WRITING)  # fmt: skip
WAIT_S = 60.0  # a hang guard only: what is checked is the age the screen reports


class StallingFeed:
    """Fresh snapshots until `stall()`; then `collect()` blocks (a poll stuck in the service or the OS)."""

    def __init__(self) -> None:
        self.collected = 0
        self.fresh_at = 0.0  # when the newest snapshot was taken
        self.stalled = threading.Event()
        self.released = threading.Event()

    def age(self) -> float:
        """How old the newest snapshot really is: no age the screen shows can be more (rounded, +1 s)."""
        return time.time() - self.fresh_at

    def collect(self, with_service: bool, service_pid: int | None) -> Snapshot:
        if self.stalled.is_set():
            self.released.wait()
        self.collected += 1
        now = self.fresh_at = time.time()
        reviews = {"beancount": None, "daily": None, "month-end": None}
        service = ServiceState(True, 4242, Jobs([RUN], reviews), []) if with_service else None
        return Snapshot([DriveRow("vda", "vda", 12.5, None, "experts of smollm2")], Memory(GiB, 24 * GiB, 16 * GiB),
                        0.02, 10.0, service, None, taken_at=now, drives_at=now)  # fmt: skip

    def close(self) -> None:
        self.released.set()


def banner(app: Dashboard) -> str:
    """The banner's text; "" until the Live screen has been composed."""
    found = app.screen.query("#banner")
    return found.first(Fit).text if found else ""


def subtitle(app: Dashboard, panel: str) -> str:
    """A panel's border subtitle: where it says how old its figures are."""
    return app.screen.query_one(panel).border_subtitle or ""


def test_a_stalled_feed_is_marked_stale_with_its_age_and_live_again_after():
    """The ages shown are checked against the feed's real age when they were read, not against a time: how soon the
    marker comes depends on how busy the machine is (a loaded one runs the app's timer late)."""

    async def scenario() -> tuple[tuple[str, float], tuple[str, str, float], str]:
        feed = StallingFeed()
        app = Dashboard(feed=feed)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(
                pilot, lambda: feed.collected >= 6 and "service running" in banner(app), WAIT_S, "the first refreshes"
            )
            assert "STALE" not in banner(app) and app.screen.query_one("#drives").border_subtitle == "live"
            feed.stalled.set()
            await until(pilot, lambda: "STALE" in banner(app), WAIT_S, "the stale marker")
            stale = banner(app), feed.age()  # the queue (read less often) may turn stale a moment before the drives
            await until(pilot, lambda: all(subtitle(app, panel).startswith("STALE") for panel in ("#drives", "#job")),
                        WAIT_S, "each panel's own marker")  # fmt: skip
            panels = subtitle(app, "#drives"), subtitle(app, "#job"), feed.age()
            feed.stalled.clear()
            feed.released.set()
            await until(pilot, lambda: "STALE" not in banner(app), WAIT_S, "the feed to be live again")
            return stale, panels, banner(app)

    (stale, stale_age), (drives, job, panels_age), after = asyncio.run(scenario())
    shown_age = int(re.search(r"nothing fresh for (\d+) s", stale).group(1))
    assert STALE_AFTER_S - 1 <= shown_age <= stale_age + 1  # stale once old, and never older than it is
    for label in (drives, job):
        assert STALE_AFTER_S - 1 <= int(re.match(r"STALE: (\d+) s old", label).group(1)) <= panels_age + 1
    assert after.startswith("service running")


def test_polls_go_on_when_the_event_loop_runs_late(monkeypatch):
    """The freeze of issue [24]: Textual's one-shot `set_timer` drops its callback for good when its task starts
    later than its delay. Here Textual's clock jumps ahead on every other reading, as a loop preempted between
    two readings sees it; the dashboard must keep polling (it once re-armed a one-shot timer after each poll,
    and stopped after a few)."""
    from textual import _time

    readings = [0]
    offset = [0.0]
    real = _time.get_time

    def late_clock() -> float:
        readings[0] += 1
        if readings[0] % 2 == 0:
            offset[0] += 0.03  # longer than a tick: any timer measured across this reading looks late
        return real() + offset[0]

    monkeypatch.setattr(_time, "get_time", late_clock)

    async def scenario() -> int:
        feed = StallingFeed()
        app = Dashboard(feed=feed, tick_s=0.02)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: feed.collected >= 100, WAIT_S, "100 polls")
        return feed.collected

    assert asyncio.run(scenario()) >= 100


def test_ctrl_c_quits_and_j_k_move_in_lists():
    async def scenario() -> tuple[list[str], bool]:
        feed = StallingFeed()
        app = Dashboard(feed=feed)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(
                pilot, lambda: feed.collected >= 6 and "service running" in banner(app), WAIT_S, "the first refreshes"
            )
            await pilot.press("2")
            await until(pilot, lambda: app.screen.query("#schedules") and app.screen.query_one("#schedules").row_count == 3,
                        WAIT_S, "the Queue's reviews")  # fmt: skip
            table = app.screen.query_one("#schedules")
            table.focus()
            moved = []
            for key in ("j", "j", "k"):
                await pilot.press(key)
                moved.append(table.selected())
            await pilot.press("ctrl+c")
            await until(pilot, lambda: not app.is_running, WAIT_S, "Ctrl+C to quit")
            return moved, app.is_running

    moved, running = asyncio.run(scenario())
    assert moved == ["daily", "month-end", "daily"] and not running


def test_ages_are_said_in_words():
    assert age_label(None) == "" and age_label(0.2) == "live" and age_label(2.4) == "2 s old"
    assert age_label(12.0) == "STALE: 12 s old"
    ages = Ages(snapshot=9.0, drives=9.0, service=9.4, record=None, polling=9.1)
    assert ages.stale and not Ages(0.1, 0.1, 0.4, 0.9, 0.0).stale
    assert stale_line(ages) == "STALE: nothing fresh for 9 s, the figures below are old; the poll in flight has run 9 s"
