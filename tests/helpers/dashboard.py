"""The dashboard under test: reading its screens, moving its cursor, and a frozen app fed fixed service states."""

from __future__ import annotations

import io
import math
from dataclasses import replace
from datetime import datetime

from rich.console import Console

from nightshift.app.daemon.control import Jobs
from nightshift.app.daemon.runs import Run as QueueRun
from nightshift.app.review.index import IndexEntry
from nightshift.app.tui.app import Dashboard
from nightshift.app.tui.feed import CatalogueView, DriveRow, Memory, ServiceState, Snapshot
from nightshift.app.tui.widgets.text import Table
from nightshift.engine.instruments.catalogue import Run
from tests.helpers.waits import until


def text(app: Dashboard, selector: str) -> str:
    return app.screen.query_one(selector).text  # a Line, or a Fit (the rendering that fits)


def cells(app: Dashboard, selector: str) -> list[list[str]]:
    table = app.screen.query_one(selector, Table)
    return [list(map(str, cells)) for _, cells in table.shown]


async def select(pilot, selector: str, key: str) -> None:
    """Put the cursor of table `selector` on the row `key` and focus it."""
    table = pilot.app.screen.query_one(selector, Table)
    table.focus()
    await until(pilot, lambda: key in [k for k, _ in table.shown], 30, f"row {key} in {selector}")
    table.move_cursor(row=[k for k, _ in table.shown].index(key), animate=False)
    await pilot.pause()


GiB = 1 << 30


NOW = datetime.fromisoformat("2026-11-30T22:02:10+00:00").timestamp()


TEXT = ("The month closed with two unmatched bank lines and one posting entered twice. "
        "F1: the card settlement of 4 812.50 has no ledger entry yet; F2: rent was posted twice on the 3rd.")  # fmt: skip


REPORT_DIR = "/home/u/.local/share/nightshift/reports"


def queue_run(**values) -> QueueRun:
    base = {"as_of": None, "due": None, "pid": None, "origin": "manual", "started": None, "finished": None,
            "report": None, "error": None, "progress": None}  # fmt: skip
    return QueueRun.from_dict({**base, **values})


WRITING = {"prompt_tokens": 812, "prompt_done": 812, "generated_tokens": 96, "time_to_first_token": 84.2,
           "elapsed": 101.9, "decode_tokens_per_s": 5.65, "max_tokens": 160, "text": TEXT,
           "drive_bytes": {"d0": 1_880_000_000, "d1": 240_000_000}, "cache_hits": 1830, "prefetch_recall": 0.874,
           "read_amplification": 1.03, "last_landed": "d1", "cache_budget": 2_000_000_000, "cache_used": 1_520_000_000,
           "cache_hit_rate": 0.62, "peak_memory_bytes": 3_310_000_000}  # fmt: skip


EARLIER = queue_run(id=5, review="month-end", origin="schedule", state="done", created="2026-11-30T18:30:00+00:00",
                    started="2026-11-30T18:30:01+00:00", finished="2026-11-30T18:32:05+00:00",
                    report=f"{REPORT_DIR}/month-end/month-end-2026-10-01-20261130T183205.pdf",
                    progress={**WRITING, "generated_tokens": 131, "elapsed": 118.0, "finish_reason": "stop"})  # fmt: skip


FAILED = queue_run(id=4, review="daily", origin="retry", state="failed", created="2026-11-29T18:30:00+00:00",
                   started="2026-11-29T18:30:01+00:00", finished="2026-11-29T18:30:02+00:00",
                   error="bank-statement.csv: no such file")  # fmt: skip


RUNNING = queue_run(id=7, review="month-end", state="running", created="2026-11-30T22:00:00+00:00",
                    started="2026-11-30T22:00:01+00:00", progress=WRITING)  # fmt: skip


QUEUED = queue_run(id=8, review="weekly", origin="schedule", state="queued", created="2026-11-30T22:01:00+00:00")


READING = replace(RUNNING, progress=replace(RUNNING.progress, prompt_done=512, generated_tokens=0, text="",
                                            decode_tokens_per_s=0.0, time_to_first_token=0.0, elapsed=61.3,
                                            drive_bytes={"d0": 1_210_000_000, "d1": 150_000_000}, cache_hits=0,
                                            prefetch_recall=0.0, read_amplification=0.0, last_landed=None))  # fmt: skip


DONE = replace(RUNNING, state="done", finished="2026-11-30T22:02:05+00:00",
               report=f"{REPORT_DIR}/month-end/month-end-2026-11-01-20261130T220205.pdf",
               progress=replace(RUNNING.progress, generated_tokens=131, finish_reason="stop"))  # fmt: skip


JUST_FAILED = replace(RUNNING, state="failed", finished="2026-11-30T22:00:03+00:00", progress=None,
                      error="bank-statement.csv: the column 'amount' is missing; see the schedule's [sources]")  # fmt: skip


REPORTS = [
    IndexEntry(id=n, run=run, review=review, title=title, period=period, created=created, findings=findings,
               by_severity={"high": high, "medium": findings - high, "low": 0}, replaced_sentences=0, seconds=secs,
               path=f"{REPORT_DIR}/{review}/{review}-{n}.pdf", missing=missing)
    for n, run, review, title, period, created, findings, high, secs, missing in [
        (1, 2, "weekly", "Weekly review", "week 44, 2026", "2026-11-06T17:02:40+01:00", 3, 0, 98.0, True),
        (2, 5, "month-end", "Month-end review", "October 2026", "2026-11-30T18:32:05+00:00", 6, 2, 124.4, False),
    ]
]  # fmt: skip


BENCH_RUNS = [
    Run("decode", "/models/kimi-tiny", {"prefetch": prefetch, "split_reads": split}, {"tokens_per_s": tok_s},
        verdict, id=n, recorded_at=f"2026-11-29T{hour}:00:00Z", fingerprint=f"f{n:011d}")
    for n, prefetch, split, tok_s, verdict, hour in [
        (3, True, True, 1.21, "win", "19"), (2, True, False, 1.09, "loss", "18"), (1, False, False, 0.97, "baseline", "17"),
    ]
]  # fmt: skip


NEXT = {
    "month-end": "2026-12-31T22:00:00+00:00",
    "weekly": None,
    "daily": "2026-12-01T18:30:00+00:00",
    "beancount": "2026-12-31T21:00:00+00:00",
    "camt053": "2026-12-31T21:00:00+00:00",
    "mt940": "2026-12-31T21:00:00+00:00",
    "ofx": "2026-12-31T21:00:00+00:00",
}  # the 7 bundled reviews


def service(runs: list[QueueRun], running: bool = True, cancelling: int | None = None) -> ServiceState:
    return ServiceState(running, 4242 if running else None, Jobs(runs, NEXT, cancelling), REPORTS)


STATES: dict[str, tuple[ServiceState, int | None]] = {  # the state's queue, and the run seen running before it
    "idle": (ServiceState(True, 4242, Jobs([], NEXT), []), None),
    "reading": (service([READING, QUEUED, EARLIER, FAILED]), 7),
    "writing": (service([RUNNING, QUEUED, EARLIER, FAILED]), 7),
    "cancelling": (service([RUNNING, QUEUED, EARLIER, FAILED], cancelling=7), 7),
    "finished": (service([QUEUED, DONE, EARLIER, FAILED]), 7),
    "failed": (service([QUEUED, JUST_FAILED, EARLIER, FAILED]), 7),
    "no-service": (service([QUEUED, EARLIER, FAILED], running=False), None),
}


class FrozenFeed:
    """Stands in for `Feed`: the same snapshot every time, no threads, nothing read from the machine."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot

    def collect(self, with_service: bool, service_pid: int | None) -> Snapshot:
        return self.snapshot

    def close(self) -> None:
        pass


def frozen_app(state: str) -> Dashboard:
    queue, seen_running = STATES[state]
    idle = state == "idle"
    snapshot = Snapshot(
        drives=[DriveRow("nvme0n1", "nvme0n1", 1412.6, 2890.0, "experts of kimi-k2-store", ("d0",)),
                DriveRow("sdb", "sdb", 187.3, None, "experts of kimi-k2-store", ("d1",))],
        memory=Memory(service_bytes=None if not queue.running else int(3.4 * GiB), total_bytes=24 * GiB,
                      available_bytes=int(17.9 * GiB)),
        cpu_fraction=0.031, refresh_hz=9.8, service=queue, service_cpu_fraction=None if idle else 0.97,
        catalogue=CatalogueView([] if idle else BENCH_RUNS), service_read_mb_per_s=None if idle else 1521.0,
        taken_at=NOW, drives_at=NOW,
    )  # fmt: skip
    app = Dashboard(feed=FrozenFeed(snapshot), tick_s=3600.0, clock=lambda: NOW)
    for name, scale in (("nvme0n1", 2400.0), ("sdb", 190.0)):
        for i in range(200):
            app.drive_histories.setdefault(name, type(app.tokens_history)()).append(
                scale * (0.55 + 0.45 * math.sin(i / 7))
            )
    if state in ("writing", "cancelling", "finished"):
        for i in range(60):
            app.tokens_history.append(5.5 + math.sin(i / 5))
    app._watched_run = seen_running  # the run as the dashboard last saw it: a run that ended is announced
    if state in ("writing", "cancelling"):
        app._last_progress = (7, WRITING["elapsed"])
        app.engine_rates, app.engine_rates_at = {"d0": 1391.2, "d1": 129.8}, NOW
    return app


def screen_text(app: Dashboard) -> str:
    """The screen as plain text (what `export_screenshot` draws, without colours)."""
    console = Console(width=app.size.width, height=app.size.height, file=io.StringIO(), record=True,
                      force_terminal=True, color_system="truecolor", legacy_windows=False, safe_box=False)  # fmt: skip
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return "\n".join(line.rstrip() for line in console.export_text().splitlines())


async def settled(pilot) -> str:
    """The screen's text once a new screen has been laid out and drawn (a mode switch takes a few frames)."""
    for _ in range(100):
        await pilot.pause()
        if text := screen_text(pilot.app):
            return text
    raise AssertionError(f"{pilot.app.screen} was never drawn")
