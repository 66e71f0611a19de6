"""The service's own faults, in one process (issues [12], [20]): owners of running runs, a worker that meets a locked
queue or dies, the control socket's limits, clients that give up cleanly, long errors, owner-only files, a damaged
queue rebuilt, a log that cannot be written."""

from __future__ import annotations

import io
import json
import logging
import os
import select
import socket
import sqlite3
import stat
import threading
from contextlib import closing, suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bench.soak import START, stepped_clock
from nightshift.app.cli import main
from nightshift.app.commands.serve import LogFile
from nightshift.app.daemon import clock, control
from nightshift.app.daemon import service as service_module
from nightshift.app.daemon.runs import ERROR_KEPT, QueueError, RunQueue, process_start
from nightshift.app.daemon.service import Service
from nightshift.app.review.index import REASON_KEPT, IndexEntry, add_failure, add_to_index, read_index
from nightshift.app.review.schedule import BUNDLED_DIR, find_schedule
from tests.helpers.service import dead_pid
from tests.helpers.waits import wait_for


class Watched(threading.Event):
    """An event that says when a thread waits on it: the worker waits on its wake event once it found nothing to do."""

    def __init__(self):
        super().__init__()
        self.waited = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waited.set()
        return super().wait(timeout)


def test_recovery_queues_a_dead_owners_run_again_once_and_never_touches_a_live_one(home):
    queue = RunQueue()
    live = queue.claim(queue.enqueue("daily"), os.getpid())  # a foreground `review run` in this process
    dead = queue.claim(queue.enqueue("weekly"), dead_pid())  # a killed one
    (retry,) = RunQueue().recover()
    assert queue.get(live.id).state == "running" and queue.get(live.id).pid_start == process_start(os.getpid())
    assert queue.get(dead.id).state == "interrupted" and "ended without finishing it" in queue.get(dead.id).error
    assert (queue.get(retry).review, queue.get(retry).origin, queue.get(retry).state) == ("weekly", "retry", "queued")
    assert RunQueue().recover() == []  # exactly once
    # The same pid, but another process (the pid was reused): not the owner.
    with queue._transaction() as db:
        db.execute("UPDATE runs SET pid_start = 1.0 WHERE id = ?", (live.id,))
    assert queue.get(live.id).orphaned and len(RunQueue().recover()) == 1


def test_a_dead_owners_run_whose_outcome_is_in_the_report_index_ends_so_and_is_not_run_again(home):
    """Its process wrote the report (or the failure) and died, or could not record it (a full disk)."""
    queue = RunQueue()
    done = queue.claim(queue.enqueue("daily"), dead_pid())
    add_to_index(IndexEntry(run=done.id, review="daily", created="2026-10-30T19:00:00+00:00", path="/r/daily.pdf"))
    failed = queue.claim(queue.enqueue("weekly"), dead_pid())
    add_failure("weekly", "source 'bank': no file", failed.id)
    lost = queue.claim(queue.enqueue("month-end"), dead_pid())  # nothing in the index: run again
    (retry,) = RunQueue().recover()
    assert (queue.get(done.id).state, queue.get(done.id).report) == ("done", "/r/daily.pdf")
    assert (queue.get(failed.id).state, queue.get(failed.id).error) == ("failed", "source 'bank': no file")
    assert queue.get(lost.id).state == "interrupted" and queue.get(retry).review == "month-end"
    assert RunQueue().recover() == []


def test_jobs_without_the_service_shows_a_dead_run_as_interrupted(home, capsys):
    queue = RunQueue()
    pid = dead_pid()
    run = queue.claim(queue.enqueue("daily"), pid)
    assert main(["jobs"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith(str(run.id))]
    assert "interrupted" in line and "running" not in line and f"pid {pid}" in line


def test_a_10_mb_error_is_stored_and_shown_shortened(home, capsys):
    huge = "column," * 1_560_000  # 10.9 MB, like a million-column header in the message
    queue = RunQueue()
    run = queue.claim(queue.enqueue("daily"), os.getpid())
    queue.finish(run.id, "failed", error=f"source 'bank': header {huge}")
    add_failure("daily", f"source 'bank': header {huge}", run.id)
    assert len(queue.get(run.id).error) < ERROR_KEPT + 100 and "more characters)" in queue.get(run.id).error
    assert os.path.getsize(home / "reports" / "index.json") < REASON_KEPT + 2000
    assert main(["jobs"]) == 0
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) < 500
    assert main(["reports", "list"]) == 0
    assert len(capsys.readouterr().out) < REASON_KEPT + 500
    # An entry stored whole by an earlier version is shortened when read.
    entries = json.loads((home / "reports" / "index.json").read_text())
    entries[0]["reason"] = huge
    (home / "reports" / "index.json").write_text(json.dumps(entries))
    assert len(read_index()[0].reason) < REASON_KEPT + 100


@pytest.fixture
def service(home):
    """A real service (worker, watchdog, socket) with no schedules of its own, stopped afterwards."""
    started: list[Service] = []

    def start(**attributes) -> Service:
        service = Service({}, work=True)
        for name, value in attributes.items():
            setattr(service, name, value)
        service.start()
        started.append(service)
        return service

    yield start
    for running in started:
        running.stop()


def test_a_locked_queue_fails_nothing_silently_and_the_worker_goes_on(home, service, monkeypatch, caplog):
    monkeypatch.setattr(RunQueue, "busy_timeout_s", 0.2)
    monkeypatch.setattr(service_module, "IDLE_S", 60)  # the worker looks at the queue when woken below
    running = service(wake_worker=Watched())
    assert running.wake_worker.waited.wait(30)  # its first look: nothing queued, so it waits to be woken
    waiting = RunQueue().enqueue("vanished")  # no such review: fails at once, with its reason
    blocker = sqlite3.connect(home / "runs.sqlite", isolation_level=None)  # as another process's would
    blocker.execute("BEGIN EXCLUSIVE")  # another process holds the queue: every write fails
    with caplog.at_level(logging.ERROR, "nightshift.serve"):
        running.wake_worker.set()
        wait_for(lambda: running.worker_error is not None)
    assert "cannot be read or written" in running.worker_error and "locked" in running.worker_error
    assert "the worker failed" in caplog.text and running.worker.is_alive()
    assert "locked" in control.jobs().worker_error  # what `jobs` and the dashboard show
    assert RunQueue().get(waiting).state == "queued"
    blocker.execute("ROLLBACK")
    blocker.close()
    wait_for(lambda: RunQueue().get(waiting).state == "failed", 30)  # once the cause clears
    assert "no review named 'vanished'" in RunQueue().get(waiting).error


def test_the_watchdog_restarts_a_dead_worker_and_says_so(home, service, monkeypatch, caplog):
    running = service(watchdog_s=0.1)
    original = Service._work_one
    calls = []

    def dies_once(self) -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise SystemExit("a fault no handler expects")
        return original(self)

    monkeypatch.setattr(Service, "_work_one", dies_once)
    with caplog.at_level(logging.ERROR):
        running.wake_worker.set()
        wait_for(lambda: running.worker_restarts == 1)
    assert "the worker thread had died" in caplog.text and "a fault no handler expects" in caplog.text
    assert control.request("ping")["worker_restarts"] == 1 and control.jobs().worker_restarts == 1
    run_id = RunQueue().enqueue("vanished")
    running.wake_worker.set()
    wait_for(lambda: RunQueue().get(run_id).state == "failed", 30)  # the new worker works


def test_the_socket_closes_idle_connections_caps_them_and_bounds_requests(home, service, monkeypatch):
    monkeypatch.setattr(control._Connection, "timeout", 0.5)
    running = service()
    threads = threading.active_count()
    idle = []
    for _ in range(60):  # a flood of connections that never send a request
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(home / "nightshift.sock"))
        idle.append(client)
    most = threading.active_count()

    def dealt_with() -> bool:
        """Every idle connection closed at its timeout or answered busy (readable), the threads counted meanwhile."""
        nonlocal most
        most = max(most, threading.active_count())
        return len(select.select(idle, [], [], 0)[0]) == len(idle)

    wait_for(dealt_with, 30, "the idle connections to be closed or refused", 0.01)
    assert most <= threads + control.MAX_CONNECTIONS  # not one thread each
    assert control.service_pid() == os.getpid()  # answered once the idle ones time out
    for client in idle:
        client.settimeout(5)
        assert client.recv(1000) in (b"", b'{"ok": false, "error": "busy: too many connections at once; try again"}\n')
        client.close()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(str(home / "nightshift.sock"))
        client.sendall(b"{" * 100_000)
        client.settimeout(5)
        assert b"at most 65536 bytes" in client.recv(1000)
    assert running.worker.is_alive()


def test_a_silent_or_full_service_gives_a_clear_message_not_a_traceback(home):
    home.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stopped:  # accepts nothing, answers nothing
        stopped.bind(str(home / "nightshift.sock"))
        stopped.listen(1)
        with pytest.raises(control.ServiceUnreachable, match=r"did not answer within 1 s: it may be stopped"):
            control.request("ping", timeout=1)
        held = []
        with suppress(BlockingIOError):  # fill the backlog until the kernel refuses
            while len(held) < 100:
                held.append(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
                held[-1].setblocking(False)
                held[-1].connect(str(home / "nightshift.sock"))
        with pytest.raises(control.ServiceUnreachable, match=r"not taking connections \(its backlog is full"):
            control.request("ping", timeout=1)
        for client in held:
            client.close()


def test_the_data_dir_and_its_files_are_owner_only_from_the_first_command(home, capsys):
    assert main(["review", "list"]) == 0
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    queue = RunQueue()  # as a foreground `review run` creates it; while it is open, SQLite keeps its -wal and -shm
    queue.enqueue("daily")
    for name in ("runs.sqlite", "runs.sqlite-wal", "runs.sqlite-shm"):
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name


def test_a_shared_data_dir_keeps_its_mode_with_a_warning(home, service, caplog):
    home.mkdir(parents=True)
    home.chmod(0o2775)
    with caplog.at_level(logging.WARNING, "nightshift.paths"):
        service()
    assert stat.S_IMODE(home.stat().st_mode) == 0o2775  # not changed behind the user's back
    assert f"the data dir {home} is mode 2775" in caplog.text
    for name in ("runs.sqlite", "serve.lock", "scheduler.sqlite", "nightshift.sock"):
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name


def test_a_broken_schedule_on_reload_keeps_its_last_good_job(home, caplog):
    (home / "schedules").mkdir(parents=True)
    text = (BUNDLED_DIR / "daily.toml").read_text().replace('name = "daily"', 'name = "mine"')
    mine = home / "schedules" / "mine.toml"
    mine.write_text(text.replace('"sample-data/', f'"{BUNDLED_DIR}/sample-data/'))
    running = Service(work=False)
    running.start()
    try:
        before = running.next_runs()["mine"]
        mine.write_text(text.replace('when = "', 'when = "every blue moon ').replace("[sources]", "[sources"))
        with caplog.at_level(logging.ERROR):
            running.reload()  # what SIGHUP does
        assert running.next_runs()["mine"] == before and "mine" in running.schedules
        assert "its last good version stays scheduled" in caplog.text
        assert any(str(mine) in error for error in control.jobs().schedule_errors)
    finally:
        running.stop()


def test_error_texts_from_a_read_only_queue_are_messages(home, capsys):
    if os.geteuid() == 0:
        pytest.skip("root writes to read-only files; tests/test_reliability_kills.py mounts a read-only data dir")
    RunQueue()
    home.chmod(0o500)
    (home / "runs.sqlite").chmod(0o400)
    try:
        assert main(["review", "run", "daily", "--as-of", "2026-10-30"]) == 1
        assert "cannot be read or written" in capsys.readouterr().err
    finally:
        home.chmod(0o700)


def test_a_cancel_between_checks_stops_the_review_there(home):
    from nightshift.app.review.errors import ReviewInterrupted
    from nightshift.app.review.runner import run_checks_for
    from nightshift.app.review.schedule import find_schedule

    schedule = find_schedule("month-end")
    seen: list[str] = []
    with pytest.raises(ReviewInterrupted, match=r"stopped after check 1 \w+ \(the run was cancelled\)"):
        run_checks_for(schedule, schedule.as_of, lambda name, seconds: seen.append(name),
                       lambda: any(name.startswith("check") for name in seen))  # fmt: skip
    assert [name for name in seen if name.startswith("check")] == [seen[-1]]  # one check ran, no more


DUE = datetime(2026, 10, 30, 22, 0, tzinfo=UTC)


def damage_index_page(path: Path) -> None:
    """Overwrite the page of the queue's unique index with garbage: its rows stay readable, the file is damaged."""
    with closing(sqlite3.connect(path)) as db:
        page = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'one_run_per_due'").fetchone()[0]
        size = db.execute("PRAGMA page_size").fetchone()[0]
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with open(path, "r+b") as raw:  # the test breaks the file on purpose, with no connection open
        raw.seek((page - 1) * size)
        raw.write(b"\xa5" * size)


def test_a_damaged_queue_is_kept_aside_and_rebuilt_from_what_is_known(home, monkeypatch, caplog):
    daily = find_schedule("daily")
    earlier = Service({"daily": daily}, work=False)  # a service ran before: its job is in the scheduler's store
    earlier.start()
    earlier.stop()
    queue = RunQueue()
    done = queue.claim(queue.enqueue("weekly", due=DUE, origin="schedule"), os.getpid())
    queue.finish(done.id, "done", report=str(home / "weekly.pdf"))
    waiting = queue.enqueue("month-end")
    add_failure("month-end", "source 'bank': not readable", run=41)  # its queue row was lost with the damage
    queue.db.close()
    del queue
    damage_index_page(home / "runs.sqlite")
    # 19:30 in London on Friday 30 October 2026: the daily review fell due an hour ago and its run is nowhere.
    monkeypatch.setattr(clock, "now", lambda: datetime(2026, 10, 30, 19, 30, tzinfo=UTC))
    service = Service({"daily": daily}, work=False)
    with caplog.at_level(logging.WARNING, "nightshift.serve"):
        service.start()
    try:
        (kept,) = [path for path in home.glob("runs.sqlite.damaged-*") if not path.name.endswith(("-wal", "-shm"))]
        assert "run queue" in caplog.text and "was damaged" in caplog.text and str(kept) in caplog.text
        assert RunQueue().damage() is None
        runs = {run.id: run for run in RunQueue().recent()}
        assert (runs[done.id].state, runs[waiting].state, runs[41].state) == ("done", "queued", "failed")
        assert runs[41].error == "source 'bank': not readable"  # from the report index
        (missed,) = [run for run in runs.values() if run.review == "daily"]
        assert (missed.origin, missed.due) == ("schedule", datetime(2026, 10, 30, 18, 30, tzinfo=UTC))
        assert "was damaged" in control.jobs().notices()[0]  # for `nightshift jobs` and the dashboard
        assert len(read_index()) == 1
    finally:
        service.stop()


def test_a_damaged_queue_without_the_service_says_to_start_it(home, capsys):
    home.mkdir(parents=True)
    (home / "runs.sqlite").write_bytes(b"this is not a database" * 300)
    with pytest.raises(QueueError, match=r"is damaged .*start `nightshift serve`"):
        RunQueue().recent()
    assert main(["jobs"]) == 1
    err = capsys.readouterr().err
    assert "is damaged" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_log_that_cannot_be_written_is_said_once_not_a_traceback_per_line(capsys):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here (a device every write to fails with 'no space left')")
    handler = LogFile("/dev/full")
    logger = logging.getLogger("nightshift.tests.full")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for number in range(5):
            logger.error("line %d", number)
        err = capsys.readouterr().err
        assert err.count("cannot write the log /dev/full") == 1 and "No space left" in err
        assert "Logging error" not in err and "Traceback" not in err
        handler.stream = io.StringIO()  # room again
        logger.error("after")
        assert "the log /dev/full is written again" in capsys.readouterr().err
    finally:
        logger.removeHandler(handler)


def test_a_due_run_the_queue_cannot_take_fires_again_until_it_is_queued(home, monkeypatch, caplog):
    monkeypatch.setattr(RunQueue, "busy_timeout_s", 0.2)
    monkeypatch.setattr(service_module, "RETRY_S", 0.5)
    with stepped_clock(START) as now:
        running = Service({"daily": find_schedule("daily")}, work=False)
        running.start()
        try:
            blocker = sqlite3.connect(home / "runs.sqlite", isolation_level=None)  # as another process's would
            blocker.execute("BEGIN EXCLUSIVE")  # every write to the queue fails meanwhile
            due = running.scheduler.get_job("daily").next_run_time
            now[0] = due + timedelta(seconds=1)
            with caplog.at_level(logging.ERROR, "nightshift.serve"):
                running.scheduler.check_now()
                wait_for(lambda: "its run due at 2026-10-28T18:30:00+00:00 is not queued yet" in caplog.text)
            assert running.scheduler.get_job("daily").next_run_time == due  # in the store: a restart fires it too
            blocker.execute("ROLLBACK")
            blocker.close()
            wait_for(lambda: [run.due for run in RunQueue().recent()] == [due], 30)
            wait_for(lambda: running.scheduler.get_job("daily").next_run_time > due)
        finally:
            running.stop()
