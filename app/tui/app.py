"""The dashboard app: its screens (one mode each), bindings, the refresh loop and the service actions.

The refresh loop is one thread worker at a time: a repeating timer starts `_poll`
unless one is in flight; `_poll` collects a snapshot off the UI thread and posts
it back as a `Refreshed` message, which the handler applies. Polls never overlap
and a slow service never stalls input. Drive figures refresh every tick (10 Hz);
the queue, reports, the running job and the history plots every `SERVICE_EVERY`
ticks. The same timer ages what is shown: a figure not refreshed for
`STALE_AFTER_S` is marked stale on screen, whatever stopped it.

Why a repeating timer and not `set_timer` re-armed after each poll: Textual's
one-shot timer (8.2) drops its callback, silently and for good, when its task
runs later than its delay (it "skips" the missed tick, and a one-shot has no
next). Under load that happened within minutes (bench/timer_drop.py), and the
whole dashboard froze with nothing marking its figures old (issue [24]).
Everything about a run is its own: its tok/s plot starts empty, nightshift's
per-drive rates come from its progress records, and its end is announced.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.message import Message

from nightshift.app.daemon.runs import Run as QueueRun
from nightshift.app.tui.ages import Ages
from nightshift.app.tui.feed import CatalogueView, Feed, ServiceState, Snapshot
from nightshift.app.tui.format import duration
from nightshift.app.tui.screens import DashboardScreen, HelpScreen, LiveScreen, QueueScreen, ReportsScreen, RunsScreen
from nightshift.app.tui.widgets.plot import History
from nightshift.app.viewer import open_pdf
from nightshift.engine.errors import NightshiftError

TICK_S = 0.1
SERVICE_EVERY = 5
ENGINE_RATE_FRESH_S = 3.0  # nightshift's per-drive rate is shown this long after the record it came from


class Dashboard(App):
    """`nightshift dashboard`."""

    CSS_PATH = "dashboard.tcss"
    TITLE = "nightshift"
    MODES = {"live": LiveScreen, "queue": QueueScreen, "reports": ReportsScreen, "runs": RunsScreen}
    DEFAULT_MODE = "live"
    ENABLE_COMMAND_PALETTE = False  # every action has a key; the footer needs the room at 80 columns
    BINDINGS = [
        Binding("1", "switch_mode('live')", "Live"),
        Binding("2", "switch_mode('queue')", "Queue"),
        Binding("3", "switch_mode('reports')", "Reports"),
        Binding("4", "switch_mode('runs')", "Runs"),
        Binding("s", "start_service", "Start the scheduler here"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),  # as btop, k9s and lazygit do
    ]

    class Refreshed(Message):
        def __init__(self, snapshot: Snapshot):
            super().__init__()
            self.snapshot = snapshot

    def __init__(self, feed: Feed | None = None, tick_s: float = TICK_S, clock: Callable[[], float] = time.time):
        super().__init__()
        self.feed = feed
        self.tick_s = tick_s
        self.clock = clock  # Unix time now: what ages are measured against (tests freeze it)
        self.ticks = 0
        self.polling_since: float | None = None  # monotonic time the poll in flight began; None: none is
        self.service_at: float | None = None  # Unix time of the latest snapshot that read the queue
        self.snapshot: Snapshot | None = None
        self.service: ServiceState | None = None
        self.catalogue: CatalogueView | None = None
        self.own_service = None  # app.daemon.service.Service started by this dashboard (s)
        self.service_thread: threading.Thread | None = None  # runs it, from start to stop
        self.quitting = threading.Event()
        self.tokens_history = History()
        self.drive_histories: dict[str, History] = {}
        self.engine_rates: dict[str, float] = {}  # nightshift's MB/s per engine drive, from the run's progress
        self.engine_rates_at = 0.0  # when (the snapshot's time) the record they came from was first seen
        self._last_progress: tuple[int, float] | None = None  # the run and elapsed time of the last point
        self.record_seen_at: float | None = None  # when the running run's latest progress record was first seen
        self._last_bytes: dict[str, int] = {}  # the run's bytes per drive at that point
        self._watched_run: int | None = None  # the run seen running at the last refresh, to announce its end

    def on_mount(self) -> None:
        if self.feed is None:
            self.feed = Feed()
        self.set_interval(self.tick_s, self._tick)
        self._tick()

    def _tick(self) -> None:
        """Start a poll unless one is in flight, and show how old the figures on screen are."""
        if self.polling_since is None:
            self.polling_since = time.monotonic()
            self._poll()
        if self.snapshot is not None and (screen := self._drawn_screen()) is not None:
            screen.show_ages(self.ages(self.clock()))

    def _drawn_screen(self) -> DashboardScreen | None:
        """The dashboard screen in view once its widgets are there: none while the app starts or shuts down
        (Textual raises ScreenStackError then) or while a dialog is on top."""
        if not self.screen_stack or not isinstance(self.screen, DashboardScreen) or not self.screen.query("#banner"):
            return None
        return self.screen

    @work(thread=True, group="poll")
    def _poll(self) -> None:
        with_service = self.ticks % SERVICE_EVERY == 0
        pid = self.service.pid if self.service is not None else None
        self.post_message(self.Refreshed(self.feed.collect(with_service, pid)))

    def ages(self, now: float) -> Ages:
        """How old each part of what is shown is at `now`, and how long the poll in flight has taken."""
        snapshot = self.snapshot
        polling = time.monotonic() - self.polling_since if self.polling_since is not None else 0.0
        drives = now - snapshot.drives_at if snapshot is not None and snapshot.drives_at else None
        service = now - self.service_at if self.service_at is not None else None
        record = now - self.record_seen_at if self.record_seen_at is not None else None
        return Ages(now - snapshot.taken_at if snapshot is not None else 0.0, drives, service, record, polling)

    def on_dashboard_refreshed(self, message: Refreshed) -> None:
        snapshot = message.snapshot
        self.polling_since = None
        self.ticks += 1
        self.snapshot = snapshot
        if snapshot.catalogue is not None:
            self.catalogue = snapshot.catalogue
        if snapshot.service is not None and self._missed_poll(snapshot.service):
            self.service = replace(self.service, error=snapshot.service.error)
        elif snapshot.service is not None:
            self.service = snapshot.service
            self.service_at = snapshot.taken_at
            self._follow_run(snapshot.service, snapshot.taken_at)
            for row in snapshot.drives:  # plotted at the queue's pace, so a plot spans a minute or more
                self.drive_histories.setdefault(row.name, History()).append(row.mb_per_s)
        if (screen := self._drawn_screen()) is not None:
            screen.show(snapshot, self.service)
            screen.show_ages(self.ages(snapshot.taken_at))

    def _missed_poll(self, state: ServiceState) -> bool:
        """Whether `state` is a poll that could not read the queue of a service last seen running. The last queue
        read stays shown, with the error beside it: a busy service that misses one poll's timeout has not lost its
        runs, and a run's tok/s plot must not restart. Its age keeps growing, so the queue is marked stale until a
        poll is answered again."""
        return bool(state.error) and self.service is not None and self.service.running

    def _follow_run(self, service: ServiceState, now: float) -> None:
        """Per run: a new run starts an empty tok/s plot; one point and nightshift's per-drive read rates per
        new progress record (the service stores one a second); a run seen running and now ended is announced."""
        current = service.jobs.current
        if self._watched_run is not None and (current is None or current.id != self._watched_run):
            self._announce(next((run for run in service.jobs.runs if run.id == self._watched_run), None))
        if current is not None and current.id != self._watched_run:
            self.tokens_history.clear()
            self._last_progress, self._last_bytes = None, {}
        self._watched_run = current.id if current is not None else None
        progress = current.progress if current is not None else None
        if progress is None:
            self.engine_rates, self.record_seen_at = {}, None
            return
        key = (current.id, progress.elapsed)
        if key == self._last_progress:
            return
        self.record_seen_at = now
        if self._last_progress is not None and progress.elapsed > self._last_progress[1]:
            span = progress.elapsed - self._last_progress[1]
            self.engine_rates = {drive: (n - self._last_bytes.get(drive, 0)) / span / 1e6
                                 for drive, n in progress.drive_bytes.items()}  # fmt: skip
            self.engine_rates_at = now
        self._last_progress, self._last_bytes = key, dict(progress.drive_bytes)
        if progress.generated_tokens >= 2:  # no decode rate before the second token
            self.tokens_history.append(progress.decode_tokens_per_s)

    def fresh_engine_rates(self, now: float) -> dict[str, float]:
        """nightshift's per-drive rates while the record they came from is recent: the average over the last
        interval between records is not shown as the rate now once no record has come for a while (a long
        chunk of the prompt being read, a run that ended)."""
        return self.engine_rates if now - self.engine_rates_at <= ENGINE_RATE_FRESH_S else {}

    def _announce(self, run: QueueRun | None) -> None:
        """A toast for a run that ended while the dashboard watched."""
        if run is None or run.state in ("queued", "running"):
            return
        took = duration(run, time.time())
        if run.state == "done":
            name = (run.report or "").rsplit("/", 1)[-1]
            self.notify(f"run {run.id} ({run.review}) done in {took}: {name}; o on Live (1) opens it",
                        title="report written")  # fmt: skip
        else:
            self.notify(f"run {run.id} ({run.review}) {run.state} after {took}: {run.error or ''}",
                        title=f"run {run.state}", severity="error" if run.state == "failed" else "warning")  # fmt: skip

    # --- actions -------------------------------------------------------------------------------

    def action_help(self) -> None:
        """Every key: the app's, then each screen's (the one in view first)."""
        screens = sorted(self.MODES.items(), key=lambda item: not isinstance(self.screen, item[1]))
        groups = [("everywhere", list(self.BINDINGS))] + [(name, list(screen.BINDINGS)) for name, screen in screens]
        self.push_screen(HelpScreen(groups))

    @work(thread=True, group="service")
    def ask_service(self, command: str, done: str, **arguments: Any) -> None:
        """Send a command to the service (off the UI thread) and say how it went; without one, say how to start it."""
        from nightshift.app.daemon.control import request

        try:
            reply = request(command, timeout=5.0, **arguments)
        except NightshiftError as exc:
            self.call_from_thread(self.notify, str(exc), severity="error")
            return
        if reply is None:
            self.call_from_thread(self.notify, "no service running: press s to start the scheduler here, or run "
                                  "`nightshift serve`", severity="warning")  # fmt: skip
            return
        self.call_from_thread(self.notify, done)
        self.ticks = 0  # the next poll reads the queue again

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """`s` only while no scheduler runs, here or in a service (the key bar offers only keys that act)."""
        if action == "start_service":
            running = self.service is not None and self.service.running
            return not running and (self.service_thread is None or not self.service_thread.is_alive())
        return True

    def action_start_service(self) -> None:
        if self.service is not None and self.service.running:
            self.notify("a service is already running", severity="warning")
            return
        if self.service_thread is None or not self.service_thread.is_alive():
            self.service_thread = threading.Thread(target=self._serve, name="dashboard-service", daemon=True)
            self.service_thread.start()

    def _serve(self) -> None:
        """The same service as `nightshift serve`, under the same single-instance lock, in this process.

        Started and stopped by this one thread: the service keeps a SQLite connection open, which only the
        thread that opened it may close.
        """
        from nightshift.app.daemon.service import Service

        service = Service()
        try:
            service.start()
        except NightshiftError as exc:
            service.lock.release()
            self.call_from_thread(self.notify, str(exc), severity="error")
            return
        self.own_service = service
        self.ticks = 0
        self.call_from_thread(self.notify, "scheduler started in this dashboard; it stops when you quit")
        self.quitting.wait()
        service.stop()

    @work(thread=True, group="viewer")
    def open_report(self, path: Path) -> None:
        """Open the PDF off the UI thread (the viewer is watched for a moment to see that it opened)."""
        if not path.is_file():
            self.call_from_thread(self.notify, f"{path} is no longer there", severity="error")
            return
        problem = open_pdf(path)
        if problem is None:
            self.call_from_thread(self.notify, f"opened {path.name}")
        else:
            self.call_from_thread(self.notify, f"nothing opened: {problem}; the report is {path}", severity="warning")

    def on_unmount(self) -> None:
        self.quitting.set()
        if self.service_thread is not None:
            self.service_thread.join()  # the scheduler stopped and its lock released before the app returns
        if self.feed is not None:
            self.feed.close()
