"""The scheduler service under a controllable clock: month boundary, weekend, missed runs, restarts, two services."""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing
from datetime import UTC, date, datetime, timedelta

import pytest

from nightshift.app.daemon import control
from nightshift.app.daemon.lock import ServiceRunningError
from nightshift.app.daemon.runs import RunProgress, RunQueue
from nightshift.app.daemon.service import Service
from nightshift.app.review.index import IndexEntry, add_failure, add_to_index, read_index
from nightshift.app.review.schedule import BUNDLED_DIR
from tests.helpers.service import dead_pid, queued, start, step
from tests.helpers.waits import wait_for

UTC = UTC


def test_month_end_across_a_month_boundary(home, wall, bundled):
    service = start(bundled, ["month-end"])
    try:
        step(service, wall, datetime(2026, 12, 2, tzinfo=UTC), timedelta(hours=6))
    finally:
        service.stop()
    # 30 Oct 2026 is a Friday (31st a Saturday); 30 Nov a Monday. London is on GMT then.
    assert queued("month-end") == ["2026-10-30 22:00", "2026-11-30 22:00"]


def test_business_days_skip_the_weekend(home, wall, bundled):
    wall.set(datetime(2026, 10, 29, 12, 0, tzinfo=UTC))
    service = start(bundled, ["daily", "weekly"])
    try:
        step(service, wall, datetime(2026, 11, 3, 12, 0, tzinfo=UTC), timedelta(hours=1))
    finally:
        service.stop()
    assert queued("daily") == ["2026-10-29 18:30", "2026-10-30 18:30", "2026-11-02 18:30"]
    assert queued("weekly") == ["2026-10-30 17:00"]


def test_a_run_missed_while_off_runs_once_within_its_grace(home, wall, bundled):
    wall.set(datetime(2026, 10, 30, 12, 0, tzinfo=UTC))
    start(bundled, ["month-end", "daily"]).stop()  # the machine goes off before 18:30 and 22:00
    wall.set(datetime(2026, 11, 1, 9, 0, tzinfo=UTC))  # back on Sunday morning
    service = start(bundled, ["month-end", "daily"])
    service.scheduler.check_now()
    service.stop()
    # month-end (grace 3 days) catches up once; daily's 18:30 run is beyond its 6 h grace and is skipped
    assert queued() == ["2026-10-30 22:00"]
    service = start(bundled, ["month-end", "daily"])  # a restart does not queue it again
    service.stop()
    assert queued() == ["2026-10-30 22:00"]


def test_a_clock_jump_is_noticed_without_being_told(home, wall, bundled, monkeypatch):
    monkeypatch.setattr(Service, "watchdog_s", 0.05)
    wall.set(datetime(2026, 10, 30, 12, 0, tzinfo=UTC))
    service = start(bundled, ["month-end"])
    try:
        wall.set(datetime(2026, 10, 30, 22, 0, 30, tzinfo=UTC))  # as after a suspend: nobody wakes the scheduler
        wait_for(queued, 10, "the run the jump made due", 0.05)
    finally:
        service.stop()
    assert queued() == ["2026-10-30 22:00"]


def test_two_services_on_one_data_dir(home, wall, bundled):
    service = start(bundled, ["daily"])
    try:
        with pytest.raises(ServiceRunningError, match=r"already running .* stop it before starting another"):
            Service(bundled, work=False).start()
    finally:
        service.stop()


def test_the_queue_claims_each_run_once(home):
    queue = RunQueue()
    due = datetime(2026, 10, 30, 22, 0, tzinfo=UTC)
    first = queue.enqueue("month-end", due=due, origin="schedule")
    assert queue.enqueue("month-end", due=due, origin="schedule") is None  # the same due run, recorded once
    second = RunQueue().enqueue("daily")
    assert queue.claim_next(pid=1).id == first
    assert RunQueue().claim(first, pid=2) is None  # taken already
    assert queue.claim_next(pid=2).id == second
    assert queue.claim_next(pid=2) is None


def test_runs_left_running_are_interrupted_and_queued_again(home):
    queue = RunQueue()
    due = datetime(2026, 10, 30, 22, 0, tzinfo=UTC)
    run_id = queue.enqueue("month-end", due=due, origin="schedule")
    waiting = queue.enqueue("daily")
    queue.claim(run_id, pid=dead_pid())  # the service that held it was killed
    (retry,) = RunQueue().recover()
    assert queue.get(run_id).state == "interrupted"
    assert (queue.get(retry).state, queue.get(retry).due, queue.get(retry).origin) == ("queued", due, "retry")
    assert queue.get(waiting).state == "queued"


def test_a_schedule_added_while_serving_is_read_when_it_is_asked_for(home, wall):
    service = Service(work=False)  # reads the schedule folders
    service.start()
    try:
        assert "mine" not in service.next_runs()
        (home / "schedules").mkdir(parents=True)
        text = (BUNDLED_DIR / "daily.toml").read_text().replace('name = "daily"', 'name = "mine"')
        (home / "schedules" / "mine.toml").write_text(text.replace('"sample-data/', f'"{BUNDLED_DIR}/sample-data/'))
        reply = service.handle({"command": "run", "review": "mine"})
        assert reply["ok"] and RunQueue().get(reply["id"]).review == "mine"
        assert service.next_runs()["mine"] == "2026-10-28T18:30:00+00:00"
        assert service.handle({"command": "run", "review": "nope"}) == {
            "ok": False, "error": "no review named 'nope' in this service"}  # fmt: skip
    finally:
        service.stop()


def test_runs_and_reports_cross_the_control_socket_as_they_are_stored(home, wall, bundled):
    add_to_index(IndexEntry(run=9, review="daily", title="Daily review", created="2026-10-27T18:31:05+00:00",
                            path=str(home / "gone.pdf"), findings=2, by_severity={"high": 1}))  # fmt: skip
    add_failure("weekly", "source 'bank': no file", 10)
    assert control.jobs() is None and control.reports() is None and control.service_pid() is None
    service = start(bundled, ["daily"])  # it does not work on runs: the one claimed below stays running
    try:
        queue = RunQueue()
        streamed = queue.claim(queue.enqueue("daily", as_of=date(2026, 10, 27)), pid=1).id
        progress = RunProgress(prompt_tokens=812, generated_tokens=96, time_to_first_token=4.21, elapsed=17.9,
                               decode_tokens_per_s=6.87, max_tokens=160, text="The month closed",
                               drive_bytes={"nvme0": 9_400_000}, cache_hits=1830, prefetch_recall=0.874,
                               read_amplification=1.03, last_landed="nvme0")  # fmt: skip
        queue.set_progress(streamed, progress)
        # A row as the first versions stored a dense model's progress: no stream figures at all.
        first_format = {"prompt_tokens": 700, "generated_tokens": 40, "time_to_first_token": 2.5, "elapsed": 7.4,
                        "decode_tokens_per_s": 8.0, "max_tokens": 160, "text": "Rent"}  # fmt: skip
        dense = queue.enqueue("weekly", due=datetime(2026, 10, 23, 17, 0, tzinfo=UTC), origin="schedule")
        with closing(sqlite3.connect(queue.path)) as db, db:
            db.execute("UPDATE runs SET progress = ? WHERE id = ?", (json.dumps(first_format), dense))
        assert queue.get(streamed).progress == progress
        assert queue.get(dense).progress == RunProgress(**first_format) and queue.get(dense).progress.cache_hits is None

        assert control.service_pid() == os.getpid()
        jobs = control.jobs()
        assert jobs.runs == queue.recent() and jobs.current.id == streamed and jobs.current.progress == progress
        assert jobs.next_runs == {"daily": "2026-10-28T18:30:00+00:00"}
        assert control.run_status(dense) == queue.get(dense) and control.run_status(dense).due.tzinfo is not None
        assert control.reports() == read_index() and [e.failed for e in read_index()] == [False, True]
        queued_id = control.queue_run("daily", date(2026, 10, 30))
        assert queue.get(queued_id).as_of == date(2026, 10, 30) and queue.get(queued_id).origin == "manual"
    finally:
        service.stop()
