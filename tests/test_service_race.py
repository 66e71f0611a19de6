"""Processes sharing the run queue (issue [20]): a schedule firing in the service while a foreground `review run`
goes on loses no run, repeats none and leaves the databases whole. Each test here failed on the code before."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench.race import race
from nightshift.app.daemon.runs import RunQueue
from nightshift.app.daemon.service import Service, record_due_run

DUE = datetime(2026, 10, 30, 22, 0, tzinfo=UTC)
# Another process's connection to the queue: it opens the file, reads, and closes. Closing the last connection
# checkpoints the queue and deletes its -wal and -shm files, which SQLite does only when no other process holds a
# lock on the file.
READ_AND_CLOSE = (
    "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); db.execute('SELECT count(*) FROM runs'); db.close()"
)


def test_a_schedule_firing_in_the_service_keeps_its_hold_on_the_queue(home):
    """The fault behind the damaged queues: each fire opened and closed runs.sqlite outside SQLite in the service's
    process, which dropped its connections' locks; the next process to close a connection then took itself for
    the last one and deleted the -wal and -shm files from under the service."""
    service = Service({}, work=False)
    service.start()
    try:
        record_due_run("daily", DUE)  # what the scheduler's job does when a schedule fires
        subprocess.run([sys.executable, "-c", READ_AND_CLOSE, str(home / "runs.sqlite")], check=True, timeout=60)
        assert (home / "runs.sqlite-wal").exists() and (home / "runs.sqlite-shm").exists()
        record_due_run("weekly", DUE)
        assert [(run.review, run.due) for run in RunQueue().recent()] == [("weekly", DUE), ("daily", DUE)]
        assert RunQueue().damage() is None
    finally:
        service.stop()


def test_one_connection_per_file_per_process(home):
    assert RunQueue().db is RunQueue().db  # every queue of the process shares it: no second open, no close
    first = RunQueue()
    first.enqueue("daily")
    descriptors = os.listdir("/proc/self/fd") if Path("/proc/self/fd").is_dir() else None
    for _ in range(20):
        RunQueue().enqueue("daily")
    if descriptors is not None:
        assert len(os.listdir("/proc/self/fd")) <= len(descriptors)


@pytest.mark.slow
def test_a_schedule_firing_during_a_foreground_run_beside_a_starting_service_runs_each_once(home, tiny_model):
    result = race(home, tiny_model, max_tokens=8, timeout_s=300)
    assert result["problems"] == []
    assert result["fore"] == ["done"] and result["tick"] == ["done"]
