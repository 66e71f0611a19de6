"""A damaged run queue, rebuilt from what is known: `nightshift serve` checks its SQLite files when it starts.

The damaged file (with its -wal and -shm) is kept beside the new one as runs.sqlite.damaged-TIME, for whoever
wants to look. The new queue gets every run still readable in it (read in rowid order from both ends, past a
damaged page), then an entry for every outcome in the report index whose run is missing (a report written, a
failure); once its schedules are read, the service queues again each schedule's latest due run within its
grace that neither the queue nor the index has (`missed_due_runs`). A damaged scheduler store is kept aside the
same way and made anew from the schedule files (`set_aside_if_damaged`).
"""

from __future__ import annotations

import logging
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from nightshift.app.daemon import clock
from nightshift.app.daemon.runs import RunQueue
from nightshift.app.review.index import IndexEntry, read_index
from nightshift.app.review.runner import last_due
from nightshift.app.review.schedule import Schedule
from nightshift.engine.errors import NightshiftError
from nightshift.engine.instruments.database import database_damaged, open_database, set_aside_database

log = logging.getLogger("nightshift.serve")


def rebuild_queue(path: Path, damage: str) -> str:
    """Keep the damaged queue at `path` aside and make a new one from it and the report index; says what it did.

    This process must hold no connection to `path`.
    """
    kept = set_aside_database(path, _damaged_suffix())
    readable = _salvage(kept)
    known = {row["id"] for row in readable}
    indexed = [_from_index(entry) for entry in _index() if entry.run is not None and entry.run not in known]
    queue = RunQueue(path)
    added = queue.restore(readable), queue.restore(indexed)
    return (f"the run queue {path} was damaged ({damage}); it is kept as {kept}, and a new queue holds the "
            f"{added[0]} run(s) still readable in it and {added[1]} more from the report index")  # fmt: skip


def set_aside_if_damaged(path: Path, what: str) -> str | None:
    """Keep the SQLite file at `path` aside if SQLite's quick check finds it damaged (its user makes a new one);
    says what was done, or None when it is sound or not there. This process must hold no other connection to it."""
    if not path.exists():
        return None
    damaged = None
    try:
        damaged = open_database(path)
        damage = damaged.damage()
    except sqlite3.Error as exc:
        if not database_damaged(exc):
            raise
        damage = str(exc)
    finally:
        if damaged is not None:
            damaged.close()
    if damage is None:
        return None
    kept = set_aside_database(path, _damaged_suffix())
    return f"{what} {path} was damaged ({damage}); it is kept as {kept} and a new one is made"


def _damaged_suffix() -> str:
    return f".damaged-{clock.now():%Y%m%dT%H%M%S}"


def missed_due_runs(queue: RunQueue, schedules: dict[str, Schedule]) -> list[int]:
    """Queue each schedule's latest due run within its grace that is neither in the queue nor done or failed
    in the report index since it fell due (a run lost with the damaged queue); returns the new runs' ids."""
    now = clock.now()
    entries = _index()
    queued = []
    for name, schedule in schedules.items():
        due = last_due(schedule, now, timedelta(seconds=schedule.grace_seconds))
        if due is None or any(e.review == name and datetime.fromisoformat(e.created) >= due for e in entries):
            continue
        if (run_id := queue.enqueue(name, due=due, origin="schedule")) is not None:
            queued.append(run_id)
    return queued


def _salvage(path: Path) -> list[dict[str, Any]]:
    """The rows of the damaged queue that SQLite can still read, by id."""
    rows: dict[int, dict[str, Any]] = {}
    try:
        damaged = open_database(path)
    except sqlite3.Error:
        return []
    try:
        for order in ("ASC", "DESC"):  # from both ends: a damaged page stops one pass, not the rows behind it
            try:
                with damaged.read() as db:
                    for row in db.execute(f"SELECT * FROM runs ORDER BY rowid {order}"):
                        rows.setdefault(row["id"], dict(row))
            except sqlite3.Error as exc:
                log.warning("reading the damaged run queue %s stopped at a damaged page: %s", path, exc)
    finally:
        damaged.close()
    return [rows[run_id] for run_id in sorted(rows)]


def _index() -> list[IndexEntry]:
    try:
        return read_index()
    except NightshiftError as exc:
        log.error("the report index could not be read to rebuild the run queue: %s", exc)
        return []


def _from_index(entry: IndexEntry) -> dict[str, Any]:
    """A run as the report index knows it: its id, review, period and outcome."""
    return {"id": entry.run, "review": entry.review, "as_of": entry.as_of, "origin": "manual", "state": entry.state,
            "created": entry.created, "finished": entry.created, "report": entry.path,
            "error": entry.reason}  # fmt: skip
