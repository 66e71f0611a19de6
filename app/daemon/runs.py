"""The run queue: every review run, waiting or done, in a SQLite file in the data dir.

It outlives the service: a killed service finds its queued runs on restart,
and a run it was in the middle of becomes `interrupted` and is queued again.
A scheduled run is recorded once per (review, due time), so two services, or a
restart, never queue the same run twice; claiming a run is one atomic update,
so it never starts twice.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import date, datetime
from pathlib import Path
from typing import Any

from nightshift.app.daemon import clock
from nightshift.app.paths import run_queue

STATES = ("queued", "running", "done", "failed", "interrupted")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    review TEXT NOT NULL,
    as_of TEXT,              -- the date whose period is reviewed; NULL: from the due time
    due TEXT,                -- the scheduled fire time (ISO, UTC); NULL for runs asked for by hand
    origin TEXT NOT NULL,    -- schedule | manual | retry
    state TEXT NOT NULL,
    created TEXT NOT NULL,
    started TEXT,
    finished TEXT,
    report TEXT,
    error TEXT,
    pid INTEGER,
    progress TEXT            -- JSON: live figures of the generation
);
CREATE UNIQUE INDEX IF NOT EXISTS one_run_per_due ON runs (review, due) WHERE due IS NOT NULL AND origin = 'schedule';
"""
_ENQUEUE = "INSERT OR IGNORE INTO runs (review, as_of, due, origin, state, created) VALUES (?, ?, ?, ?, 'queued', ?)"
_FINISH = "UPDATE runs SET state = ?, finished = ?, report = ?, error = ? WHERE id = ?"
INTERRUPTED_BY_STOP = "the service stopped during this run; queued again"


@dataclass(frozen=True)
class RunProgress:
    """Live figures of a run's generation, stored with the run at most once a second while it runs.

    `nightshift jobs`, `review run` (following a run in the service) and the dashboard show them.
    The stream figures are those of a streamed store; a model held in memory leaves them empty.
    All defaults: a run claimed whose model is still loading.
    """

    prompt_tokens: int = 0
    generated_tokens: int = 0
    time_to_first_token: float = 0.0
    elapsed: float = 0.0
    decode_tokens_per_s: float = 0.0
    max_tokens: int = 0  # 0: not known yet
    text: str = ""  # the end of the text written so far
    drive_bytes: dict[str, int] = field(default_factory=dict)  # bytes read per drive
    cache_hits: int | None = None  # experts served from the RAM cache
    prefetch_recall: float | None = None
    read_amplification: float | None = None  # bytes read while prefilling / unique expert bytes the prompt needed
    last_landed: str | None = None  # the drive whose read landed last (the barrier) most often in recent passes

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RunProgress:
        """Parse the queue's JSON column (rows written before a figure existed lack it: its default)."""
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


@dataclass(frozen=True)
class Run:
    """One run in the queue as stored (`created`, `started`, `finished`: ISO times); `progress` is set while it runs."""

    id: int
    review: str
    as_of: date | None
    due: datetime | None
    origin: str  # schedule | manual | retry
    state: str  # one of STATES
    created: str
    started: str | None
    finished: str | None
    report: str | None  # the PDF's path, once done
    error: str | None  # why it failed or was interrupted
    pid: int | None
    progress: RunProgress | None

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Run:
        """A run from `to_dict`'s form (the control socket's replies, or a queue row with its JSON parsed)."""
        return cls(**{
            **values,
            "as_of": date.fromisoformat(values["as_of"]) if values["as_of"] else None,
            "due": datetime.fromisoformat(values["due"]) if values["due"] else None,
            "progress": RunProgress.from_dict(values["progress"]) if values["progress"] else None,
        })  # fmt: skip

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Run:
        values = dict(row)
        return cls.from_dict({**values, "progress": json.loads(values["progress"]) if values["progress"] else None})

    def to_dict(self) -> dict[str, Any]:
        """The run as JSON-ready values, for the control socket."""
        values = asdict(self)
        values["as_of"] = self.as_of.isoformat() if self.as_of else None
        values["due"] = self.due.isoformat() if self.due else None
        return values


class RunQueue:
    """Runs in a SQLite file; every method opens its own connection, so threads and processes can share it."""

    def __init__(self, path: Path | None = None):
        self.path = path or run_queue()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as db, db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.row_factory = sqlite3.Row
        return db

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: everything in it is stored, or nothing (also when the process dies)."""
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _write(self, sql: str, parameters: tuple) -> sqlite3.Cursor:
        with self._transaction() as db:
            return db.execute(sql, parameters)

    def enqueue(self, review: str, as_of: date | None = None, due: datetime | None = None,
                origin: str = "manual") -> int | None:  # fmt: skip
        """Queue a run; None when that scheduled run (review, due) is already recorded."""
        cursor = self._write(_ENQUEUE, (review, as_of.isoformat() if as_of else None, due.isoformat() if due else None,
                                        origin, clock.now().isoformat(timespec="seconds")))  # fmt: skip
        return cursor.lastrowid if cursor.rowcount else None

    def claim_next(self, pid: int) -> Run | None:
        """The oldest queued run, now marked running by `pid`; None when nothing waits."""
        with closing(self._connect()) as db:
            row = db.execute("SELECT id FROM runs WHERE state = 'queued' ORDER BY id LIMIT 1").fetchone()
        if row is None:
            return None
        return self.claim(row["id"], pid) or self.claim_next(pid)

    def claim(self, run_id: int, pid: int) -> Run | None:
        """Mark a queued run as running by `pid`; None if it is not queued (someone else took it)."""
        cursor = self._write(
            "UPDATE runs SET state = 'running', started = ?, pid = ? WHERE id = ? AND state = 'queued'",
            (clock.now().isoformat(timespec="seconds"), pid, run_id),
        )
        return self.get(run_id) if cursor.rowcount else None

    def finish(self, run_id: int, state: str, report: str | None = None, error: str | None = None) -> None:
        self._write(_FINISH, (state, clock.now().isoformat(timespec="seconds"), report, error, run_id))

    def set_progress(self, run_id: int, progress: RunProgress) -> None:
        self._write("UPDATE runs SET progress = ? WHERE id = ?", (json.dumps(asdict(progress)), run_id))

    def recover(self) -> list[int]:
        """Runs left `running` by a service that died: marked interrupted and queued again. Returns the new ids.

        One transaction: a service that dies while recovering leaves each run either still `running`
        (recovered next time) or interrupted with its retry queued, never interrupted and not queued.
        """
        now = clock.now().isoformat(timespec="seconds")
        with self._transaction() as db:
            rows = db.execute("SELECT * FROM runs WHERE state = 'running'").fetchall()
            retried = []
            for row in rows:
                db.execute(_FINISH, ("interrupted", now, None, INTERRUPTED_BY_STOP, row["id"]))
                retried.append(db.execute(_ENQUEUE, (row["review"], row["as_of"], row["due"], "retry", now)).lastrowid)
        return retried

    def get(self, run_id: int) -> Run | None:
        with closing(self._connect()) as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return Run.from_row(row) if row else None

    def recent(self, limit: int = 30) -> list[Run]:
        """Waiting and running runs, then the latest finished ones, newest first."""
        with closing(self._connect()) as db:
            rows = db.execute(
                "SELECT * FROM runs ORDER BY state IN ('queued', 'running') DESC, id DESC LIMIT ?", (limit,)
            ).fetchall()
        return [Run.from_row(row) for row in rows]
