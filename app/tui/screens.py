"""The dashboard's screens: Live, Queue, Reports, Runs, plus help and confirmation dialogs.

Every screen draws from the app's latest snapshot (`app.snapshot`) in `show()`;
the app calls it on the screen in view whenever a snapshot arrives, and a
screen calls it itself when it comes back into view. Times are the user's zone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, DataTable, Header, Input, Static

from nightshift.app.daemon.runs import Run as QueueRun
from nightshift.app.paths import doc
from nightshift.app.review.index import IndexEntry
from nightshift.app.tui.ages import Ages, age_label, stale_line
from nightshift.app.tui.feed import CatalogueView, ServiceState, Snapshot
from nightshift.app.tui.format import duration, gib, seconds, stamp, zone
from nightshift.app.tui.widgets.drives import DrivePanel
from nightshift.app.tui.widgets.hosts import HostsPanel
from nightshift.app.tui.widgets.job import JobPanel
from nightshift.app.tui.widgets.keys import KeyBar
from nightshift.app.tui.widgets.plot import History
from nightshift.app.tui.widgets.text import Fit, Line, Table
from nightshift.engine.instruments.catalogue import Run
from nightshift.engine.instruments.catalogue import compare as compare_runs

BREAKPOINTS = [(0, "-short"), (40, "-tall")]
WIDTHS = [(0, "-narrow"), (70, "-normal"), (120, "-wide")]  # screen width: below 70, shorter wording
RECORD_ONE = "nightshift bench decode --model NAME"  # screen height: from 40 rows, plots get several rows


class DashboardView(Protocol):
    """What the screens read from, and ask of, the app that shows them (app.py's `Dashboard`)."""

    snapshot: Snapshot | None
    service: ServiceState | None
    catalogue: CatalogueView | None
    own_service: object | None  # a Service this dashboard started, if any
    drive_histories: dict[str, History]
    tokens_history: History

    def fresh_engine_rates(self, now: float) -> dict[str, float]: ...

    def ask_service(self, command: str, done: str, **arguments: Any) -> object: ...

    def open_report(self, path: Path) -> None: ...

    def push_screen(self, screen: Screen, *args: Any, **kwargs: Any) -> object: ...


class DashboardScreen(Screen):
    """A screen that redraws from the app's latest snapshot."""

    app: DashboardView  # type: ignore[assignment]  # Textual types it as any App
    VERTICAL_BREAKPOINTS = BREAKPOINTS
    HORIZONTAL_BREAKPOINTS = WIDTHS

    def compose_frame(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Fit(id="banner")

    def compose_keys(self) -> ComposeResult:
        yield KeyBar()

    def on_screen_resume(self) -> None:
        if self.app.snapshot is not None:
            self.show(self.app.snapshot, self.app.service)
            self.show_ages(self.app.ages(self.app.clock()))

    def show(self, snapshot: Snapshot, service: ServiceState | None) -> None:
        self.draw(snapshot, service)
        self.query_one(KeyBar).update_keys()

    def show_ages(self, ages: Ages) -> None:
        """The banner, saying STALE while the feed is; each screen then marks its own figures' ages."""
        snapshot, service = self.app.snapshot, self.app.service
        banner = self.query_one("#banner", Fit)
        if ages.stale:
            banner.set(stale_line(ages), f"STALE: nothing fresh for {max(ages.snapshot, ages.service or 0):.0f} s")
        elif snapshot is not None:
            banner.set(*self.banner(snapshot, service, ages))
        banner.set_class(ages.stale or (service is not None and not service.running), "warning")
        self.set_class(ages.stale, "-stale")
        self.draw_ages(ages)

    def banner(self, snapshot: Snapshot, service: ServiceState | None, ages: Ages) -> tuple[str, ...]:
        own = f"dashboard {snapshot.cpu_fraction:.1%} CPU, {snapshot.refresh_hz:.1f}/s"
        times = f"times in {zone()}"
        queue = "" if ages.service is None or ages.service < 1.0 else f" · queue {ages.service:.0f} s old"
        if service is None:
            return ("reading the queue…",)
        if service.error:
            return (f"cannot read the queue: {service.error}",)
        if service.running:
            where = "in this dashboard" if self.app.own_service else f"pid {service.pid}"
            return (f"service running ({where}) · {times} · {own}{queue}", f"service running ({where}) · {times}{queue}",
                    f"service {where}{queue}")  # fmt: skip
        return (
            f"no service running: schedules do not fire; s starts the scheduler here (until you quit) · {times}{queue}",
            "no service running: s starts the scheduler here",
            "no service: s starts one",
        )

    def draw_ages(self, ages: Ages) -> None:
        """Screen-specific part of `show_ages`: the age of each panel's figures."""

    def draw(self, snapshot: Snapshot, service: ServiceState | None) -> None:
        """Screen-specific part of `show`."""

    @property
    def narrow(self) -> bool:
        return self.size.width < WIDTHS[1][0]


def report_ids(service: ServiceState) -> dict[int, int]:
    """Run id -> the id of the report (or failure entry) it wrote."""
    return {entry.run: entry.id for entry in service.reports if entry.run is not None}


def queue_strip(service: ServiceState, now: float) -> tuple[str, ...]:
    """The queue in one line for Live: the next scheduled run, what waits, the last finished run."""
    upcoming = sorted((when, name) for name, when in service.jobs.next_runs.items() if when)
    following = f"{upcoming[0][1]} at {stamp(upcoming[0][0])}" if upcoming else "none scheduled"
    queued = [run for run in service.jobs.runs if run.state == "queued"]
    waiting = ", ".join(f"{run.id} {run.review}" for run in queued) or "nothing"
    last = next((run for run in service.jobs.runs if run.state in ("done", "failed", "interrupted")), None)
    ended = f"{last.id} {last.review} {last.state} ({duration(last, now)})" if last else "none yet"
    return (f"next scheduled: {following} · queued: {waiting} · last: {ended}",
            f"next: {following} · queued: {len(queued)}", f"next: {following}")  # fmt: skip


class LiveScreen(DashboardScreen):
    """The service, per-drive throughput (the device's and nightshift's own), the run's whole life, the queue."""

    BINDINGS = [Binding("o", "open", "Open last report")]

    def compose(self) -> ComposeResult:
        yield from self.compose_frame()
        yield Fit(id="memory")
        yield DrivePanel(self.app.drive_histories, id="drives")
        yield HostsPanel(id="hosts")
        yield JobPanel(self.app.tokens_history, id="job")
        yield Fit(id="strip")
        yield from self.compose_keys()

    def on_mount(self) -> None:
        self.query_one("#drives").border_title = "drives MB/s: device (anyone's) · nightshift's"
        self.query_one("#job").border_title = "run"
        self.query_one("#hosts").border_title = "hosts (serve --hosts): nightshift's MB/s per drive"

    def draw(self, snapshot: Snapshot, service: ServiceState | None) -> None:
        memory = snapshot.memory
        pid = service.pid if service is not None and service.running else None
        reads = snapshot.service_read_mb_per_s
        own = f"{reads:.1f} MB/s" if reads is not None else "—"
        ram = f"{gib(memory.total_bytes)} RAM, {gib(memory.available_bytes)} free"
        cpu = "—" if snapshot.service_cpu_fraction is None else f"{snapshot.service_cpu_fraction:.0%}"
        if pid is None:
            self.query_one("#memory", Fit).set(f"memory: no service; {ram}", f"no service · {ram}")
        else:
            where = "scheduler in this dashboard" if self.app.own_service else f"service pid {pid}"
            self.query_one("#memory", Fit).set(
                f"{where}: {gib(memory.service_bytes)} resident of {ram} · reads {own} "
                f"(its own /proc/{pid}/io, all its files) · CPU {cpu} (the model's work)",
                f"service {gib(memory.service_bytes)} of {gib(memory.total_bytes)} RAM · reads {own} · CPU {cpu}",
                f"service {gib(memory.service_bytes)} · reads {own} · CPU {cpu}",
            )  # fmt: skip
        self.query_one(DrivePanel).show(snapshot.drives, snapshot.drive_note,
                                        self.app.fresh_engine_rates(snapshot.taken_at))  # fmt: skip
        if service is not None:
            self.query_one(JobPanel).show(service.jobs.runs, service.jobs.cancelling, snapshot.taken_at)
            running = service.jobs.current
            self.query_one(HostsPanel).show(service.jobs.hosts, running.progress.drive_bytes if running and running.progress
                                            else {}, self.app.fresh_engine_rates(snapshot.taken_at))  # fmt: skip
            self.query_one("#strip", Fit).set(*queue_strip(service, snapshot.taken_at))

    def draw_ages(self, ages: Ages) -> None:
        self.query_one("#drives").border_subtitle = age_label(ages.drives)
        self.query_one("#job").border_subtitle = self.query_one(JobPanel).age(ages)

    def _last_report(self) -> str | None:
        service = self.app.service
        last = next((r for r in service.jobs.runs if r.state == "done"), None) if service is not None else None
        return last.report if last is not None else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return action != "open" or self._last_report() is not None

    def action_open(self) -> None:
        if report := self._last_report():
            self.app.open_report(Path(report))


class QueueScreen(DashboardScreen):
    """Scheduled reviews with their next run; queued, running and recent runs."""

    BINDINGS = [
        Binding("n", "run_now", "Run now"),
        Binding("p", "pause", "Pause/resume"),
        Binding("c", "cancel", "Cancel job"),
    ]

    def compose(self) -> ComposeResult:
        yield from self.compose_frame()
        with Vertical(id="queue"):
            yield Table("review", "next run", id="schedules")
            yield Table("run", "state", "review", "created", "took", "report / error", squeeze=5, id="runs")
            yield Line(id="queue-note", classes="note")
        yield from self.compose_keys()

    def draw(self, snapshot: Snapshot, service: ServiceState | None) -> None:
        if service is None:
            return
        self.query_one("#schedules", Table).fill([
            (name, (name, stamp(when) if when else ("paused" if service.running else "—")))
            for name, when in sorted(service.jobs.next_runs.items())
        ])  # fmt: skip
        reports = report_ids(service)
        created = "%H:%M" if self.narrow else "%m-%d %H:%M"
        self.query_one("#runs", Table).fill(
            [(str(run.id), (str(run.id), self._state(run, service), run.review, stamp(run.created, created),
                            duration(run, snapshot.taken_at, self.narrow), self._detail(run, reports)))
             for run in service.jobs.runs], self.size.width)  # fmt: skip
        note = self.query_one("#queue-note", Line)
        notices = service.jobs.notices()  # a schedule file skipped, the queue rebuilt, the worker's failure
        if notices:
            note.set("\n".join(notices))
        elif not service.jobs.next_runs:
            note.set(f"no reviews: put a schedule file in the schedules folder (see {doc('reviews.md')})")
        elif not service.jobs.runs:
            note.set("no runs yet: select a review above and press n to run it now")
        note.display = bool(notices) or not service.jobs.next_runs or not service.jobs.runs

    @staticmethod
    def _state(run: QueueRun, service: ServiceState) -> str:
        return "cancelling" if run.id == service.jobs.cancelling else run.state

    @staticmethod
    def _detail(run: QueueRun, reports: dict[int, int]) -> str:
        if run.error:
            return run.error
        if run.state == "running" and run.progress and run.progress.batch_line():
            return run.progress.batch_line()
        name = (run.report or "").rsplit("/", 1)[-1]
        return f"report {reports[run.id]}: {name}" if run.id in reports else name

    def _review(self) -> str | None:
        return self.query_one("#schedules", Table).selected()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """n and p need a service to ask and a review to ask about; c a running run."""
        service = self.app.service
        if action in ("run_now", "pause"):
            return service is not None and service.running and bool(service.jobs.next_runs)
        if action == "cancel":
            return service is not None and service.running and service.jobs.current is not None
        return True

    def action_run_now(self) -> None:
        if review := self._review():
            self.app.ask_service("run", f"queued a run of {review}", review=review)

    def action_pause(self) -> None:
        review = self._review()
        service = self.app.service
        if review and service is not None:
            paused = service.running and service.jobs.next_runs.get(review) is None
            verb = "resume" if paused else "pause"
            self.app.ask_service(verb, f"{review}: {verb}d", review=review)

    def action_cancel(self) -> None:
        service = self.app.service
        current = service.jobs.current if service is not None else None
        if current is None:
            self.notify("no job is running", severity="warning")
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.app.ask_service("cancel", f"cancelling run {current.id}: it stops at its next token "
                                     "(after the prompt, if it is being read)", id=current.id)  # fmt: skip

        self.app.push_screen(
            ConfirmScreen(f"Cancel run {current.id} ({current.review})? The text written so far is lost "
                          "and no report is written."), confirmed)  # fmt: skip


class ReportsScreen(DashboardScreen):
    """Reports newest first; the selected one's findings summary, and opening its PDF."""

    BINDINGS = [Binding("o", "open", "Open PDF")]

    def compose(self) -> ComposeResult:
        yield from self.compose_frame()
        yield Table("id", "run", "created", "review", "period", "findings", "status", squeeze=4, id="reports")
        yield Line(id="summary")
        yield from self.compose_keys()

    def _reports(self) -> list[IndexEntry]:
        service = self.app.service
        return list(reversed(service.reports)) if service is not None else []

    def draw(self, snapshot: Snapshot, service: ServiceState | None) -> None:
        if service is None:
            return
        self.query_one("#reports", Table).fill([
            (str(r.id), (str(r.id), str(r.run or "—"), stamp(r.created, "%m-%d" if self.narrow else "%m-%d %H:%M"),
                         r.review, r.period or "—", "—" if r.failed else str(r.findings),
                         "failed" if r.failed else "missing" if r.missing else "ok"))
            for r in self._reports()
        ], self.size.width)  # fmt: skip
        self._summarise()

    def _report(self) -> IndexEntry | None:
        key = self.query_one("#reports", Table).selected()
        return next((r for r in self._reports() if str(r.id) == key), None)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return action != "open" or bool(self._reports())

    def _summarise(self) -> None:
        report = self._report()
        summary = self.query_one("#summary", Line)
        if report is None:
            summary.set("no reports yet: on the Queue screen (2) select a review and press n to run it now")
            return
        if report.failed:
            summary.set(
                f"{report.name}, {report.period or 'as of ' + str(report.as_of)}: "
                f"run {report.run} FAILED at {stamp(report.created)}, no report\n{report.reason}"
            )
            return
        severity = ", ".join(f"{n} {level}" for level, n in report.by_severity.items())
        summary.set(
            f"report {report.id} (run {report.run or '—'}) {report.name}, {report.period}: "
            f"{report.findings} findings ({severity}); "
            f"{report.replaced_sentences} model sentence(s) replaced by plain ones; "
            f"written in {seconds(report.seconds)}\n{report.path}"
            + ("\n(the PDF is no longer there)" if report.missing else "")
        )  # fmt: skip

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._summarise()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_open(self) -> None:
        report = self._report()
        if report is not None and report.failed:
            self.notify(f"run {report.run} failed; there is no report: {report.reason}", severity="error")
        elif report is not None:
            self.app.open_report(Path(report.path))


class RunsScreen(DashboardScreen):
    """The benchmark catalogue (`nightshift runs`), filterable, with two marked runs side by side."""

    BINDINGS = [Binding("m", "mark", "Mark for compare"), Binding("slash", "filter", "Filter", key_display="/"),
                Binding("escape", "leave_filter", "Back to the list", show=False, key_display="esc")]  # fmt: skip
    AUTO_FOCUS = "#catalogue"

    def compose(self) -> ComposeResult:
        yield from self.compose_frame()
        yield Input(placeholder="/ filter: any text in a run's row (kind, verdict, model, ...)", id="filter")
        yield Table("run", "recorded", "kind", "verdict", "tok/s", "model", squeeze=5, id="catalogue")
        yield Line(id="compare")
        yield from self.compose_keys()

    def on_mount(self) -> None:
        self.marked: list[int] = []

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return action != "mark" or bool(self.app.catalogue and self.app.catalogue.runs)

    def draw(self, snapshot: Snapshot, service: ServiceState | None) -> None:
        catalogue = self.app.catalogue
        if catalogue is None:
            return
        wanted = self.query_one("#filter", Input).value.lower()
        rows = [(str(run.id), (str(run.id), stamp(run.recorded_at), run.kind, run.verdict,
                               _figure(run.figures.get("tokens_per_s")), Path(run.model).name))
                for run in catalogue.runs]  # fmt: skip
        self.query_one("#catalogue", Table).fill([row for row in rows if wanted in " ".join(row[1]).lower()],
                                                 self.size.width)  # fmt: skip
        by_id = {run.id: run for run in catalogue.runs}
        marked = [by_id[run_id] for run_id in self.marked if run_id in by_id]
        if len(marked) == 2:
            shown = side_by_side(*marked)
        elif not catalogue.runs:
            shown = catalogue.note or f"no benchmark runs recorded yet: `{RECORD_ONE}` records one"
        else:
            count = len(catalogue.runs)
            shown = f"{count} run{'s' * (count != 1)}; mark two with m to compare them" + (
                f" (run {marked[0].id} marked)" if marked else "")  # fmt: skip
        self.query_one("#compare", Line).set(shown)

    def on_input_changed(self) -> None:
        if self.app.snapshot is not None:
            self.draw(self.app.snapshot, self.app.service)

    def action_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_leave_filter(self) -> None:
        """Enter or Escape in the filter hands the keys back to the list (and to 1-4, q, ?)."""
        self.query_one("#catalogue", Table).focus()

    def on_input_submitted(self) -> None:
        self.action_leave_filter()

    def action_mark(self) -> None:
        key = self.query_one("#catalogue", Table).selected()
        if key is not None:
            self.marked = [*[k for k in self.marked if k != int(key)], int(key)][-2:]
            self.on_input_changed()


def _figure(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else "—"


def side_by_side(a: Run, b: Run) -> str:
    """Every figure of two runs with the ratio b/a, then the settings that differ."""
    lines = [f"{'figure':<24} {f'run {a.id} ({a.verdict})':>18} {f'run {b.id} ({b.verdict})':>18}  b/a"]
    for key, x, y, ratio in compare_runs(a, b):
        lines.append(f"{key[:24]:<24} {_figure(x) if x is not None else '—':>18} {_figure(y) if y is not None else '—':>18}"
                     f"  {'' if ratio is None else f'{ratio:.3f}'}")  # fmt: skip
    for key in sorted(k for k in set(a.config) | set(b.config) if a.config.get(k) != b.config.get(k)):
        lines.append(f"{'config ' + key:<24.24} {a.config.get(key)!s:>18.18} {b.config.get(key)!s:>18.18}")
    return "\n".join(lines)


class HelpScreen(ModalScreen):
    """Every key of the app, screen by screen, and where the figures come from."""

    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]

    def __init__(self, groups: list[tuple[str, list[Binding]]]):
        super().__init__()
        self.groups = groups

    def compose(self) -> ComposeResult:
        lines = []
        for title, bindings in self.groups:
            keys = [f"{b.key_display or b.key:>4} {b.description}" for b in bindings if b.description]
            lines.append(f"{title}: " + "   ".join(keys))
        with Vertical(id="help"):
            yield Static("nightshift dashboard: every key (mouse: click a row, a key, a button)", classes="title")
            yield Static("\n".join(lines), markup=False, id="keys")
            yield Static(HELP_NOTES, classes="note", markup=False)
            yield Button("Close", id="close")

    def on_button_pressed(self) -> None:
        self.dismiss()


HELP_NOTES = (
    "Drive MB/s: 'device' is the OS's read counters of the device (every process's reads), sampled every "
    "10 ms, averaged over 1 s; 'nightshift' is the engine's own reads of a streamed model there, from the "
    "run's progress. Without drives.toml the rows are the devices the models' experts are on. The service's "
    "reads: its own /proc/PID/io. Tokens/s, the prompt's progress and the text: the run's progress, stored "
    "by the service once a second. Times are in your time zone. In lists, j and k move like the arrows. "
    "A figure not refreshed for a few seconds is marked STALE with its age. The key bar offers only the keys "
    "that act now (s while no scheduler runs, c while a run runs, ...). Ctrl+C quits, as q does."
)


class ConfirmScreen(ModalScreen[bool]):
    """Yes/no before an action that loses work."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question: str):
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Static(self.question, markup=False)
            with Horizontal(id="answers"):
                yield Button("Yes (y)", id="yes", variant="error")
                yield Button("No (n)", id="no", variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
