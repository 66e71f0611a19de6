"""The run queue: every review run, waiting or done, in a SQLite file in the data dir.

A run's life is one state machine in this one file: queued -> running -> done,
failed or interrupted. A running run has an owner: the pid and start time of the
process working on it (the `serve` worker or a foreground `review run`). Whoever
reads the queue checks the owner: a run whose process is gone is `interrupted`
and queued again exactly once (`recover`, one transaction); a live one is never
touched. A scheduled run is recorded once per (review, due time), so two
services, or a restart, never queue the same run twice; claiming a run is one
atomic update, so it never starts twice.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import date, datetime
from pathlib import Path
from typing import Any

import psutil

from nightshift.app.daemon import clock
from nightshift.app.paths import private_folder, run_queue
from nightshift.app.review.index import IndexEntry, clip, read_index
from nightshift.engine.errors import NightshiftError
from nightshift.engine.generation import AnswerFigures
from nightshift.engine.instruments.database import database_damaged, open_database

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
    pid INTEGER,             -- the owner of a running run: its process id
    progress TEXT,           -- JSON: live figures of the generation
    pid_start REAL           -- and that process's start time (a pid reused by another process is not the owner)
);
CREATE UNIQUE INDEX IF NOT EXISTS one_run_per_due ON runs (review, due) WHERE due IS NOT NULL AND origin = 'schedule';
"""
_ENQUEUE = "INSERT OR IGNORE INTO runs (review, as_of, due, origin, state, created) VALUES (?, ?, ?, ?, 'queued', ?)"
_FINISH = "UPDATE runs SET state = ?, finished = ?, report = ?, error = ? WHERE id = ? AND state = 'running'"
INTERRUPTED_BY_STOP = "the service stopped during this run; queued again"
ERROR_KEPT = 2000  # characters of a reason stored with a run (a 10 MB exception text is not kept whole)


def _prepare(db: sqlite3.Connection) -> None:
    """A new connection's file as the queue needs it: WAL, the table and index, a column added since."""
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(_SCHEMA)
    if "pid_start" not in {row["name"] for row in db.execute("PRAGMA table_info(runs)")}:
        db.execute("ALTER TABLE runs ADD COLUMN pid_start REAL")  # a queue from before owners


class QueueError(NightshiftError):
    """The run queue's file cannot be read or written (disk full, read-only, locked, no descriptors left), or is
    `damaged` (SQLite finds it corrupt or not a database: `nightshift serve` keeps it aside and rebuilds it)."""

    def __init__(self, message: str, damaged: bool = False):
        super().__init__(message)
        self.damaged = damaged


def process_start(pid: int) -> float | None:
    """When process `pid` started (the kernel's figure, so the same on every read); None when there is none."""
    try:
        return round(psutil.Process(pid).create_time(), 3)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def alive(pid: int | None, started: float | None) -> bool:
    """Whether the process that claimed a run (pid and start time) still runs: the same pid, started then."""
    return pid is not None and started is not None and process_start(pid) == started


def _outcomes_in_index() -> dict[int, IndexEntry]:
    """The report index's outcomes (a report written, a failure) by run id; none when the index cannot be read."""
    try:
        return {entry.run: entry for entry in read_index() if entry.run is not None}
    except NightshiftError:
        return {}


def gone_reason(pid: int | None) -> str:
    return f"its process (pid {pid}) ended without finishing it"


@dataclass(frozen=True)
class RunProgress:
    """Live figures of a run's generation, stored with the run at most once a second while it runs.

    `nightshift jobs`, `review run` (following a run in the service) and the dashboard show them.
    The stream figures are those of a streamed store; a model held in memory leaves them empty.
    All defaults: a run claimed whose model is still loading.
    """

    prompt_tokens: int = 0
    prompt_done: int = 0  # prompt tokens read so far (a chunk at a time)
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
    finish_reason: str | None = None  # stop (an end token), length (max_tokens) or cancelled, once it ended
    # Runs whose narratives generate together (the service's batching): their ids, this one's included; empty
    # when it generates alone. While the batch runs, the figures above are the batch's (every run's tokens and
    # prompts summed, `max_tokens` their bound); once it has ended, the run's own, beside the batch's rate.
    batch: list[int] = field(default_factory=list)
    batch_sequences: int = 0  # sequences decoded together: every run's answers (a split narrative has several)
    batch_tokens_per_s: float = 0.0  # the whole batch's decode rate, all runs together (once it has ended)
    # The batch's plan, answer by answer (a split narrative's summary and findings, every run's in a shared
    # batch): each one's prompt read, its tokens against its own limit and how it ended. Empty for one answer.
    answers: list[AnswerFigures] = field(default_factory=list)
    # The expert memory budget (a streamed store with a RAM cache): its size, what it holds now, this run's
    # share of expert lookups it served; and the process's peak memory during the run (MLX's count).
    cache_budget: int | None = None
    cache_used: int | None = None
    cache_hit_rate: float | None = None
    peak_memory_bytes: int = 0

    def batch_line(self) -> str:
        """Which runs share this run's batch and its rates, on one line; "" when it generated alone."""
        if len(self.batch) < 2:
            return ""
        runs = ", ".join(str(run_id) for run_id in self.batch)
        shared = f"batch of runs {runs} ({self.batch_sequences} sequences)"
        if not self.batch_tokens_per_s:
            return f"{shared}; figures for the whole batch"
        return f"{shared}: {self.batch_tokens_per_s:.1f} tok/s together, this run {self.decode_tokens_per_s:.1f}"

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prompt tokens read per second: all of them over the time to the first token, or so far while reading."""
        if self.time_to_first_token > 0:
            return self.prompt_tokens / self.time_to_first_token
        return self.prompt_done / self.elapsed if self.prompt_done and self.elapsed > 0 else 0.0

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RunProgress:
        """Parse the queue's JSON column (rows written before a figure existed lack it: its default)."""
        found = {f.name: values[f.name] for f in fields(cls) if f.name in values}
        found["answers"] = [AnswerFigures(**answer) for answer in found.get("answers", [])]
        return cls(**found)


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
    pid_start: float | None = None  # the owner's start time: with `pid`, who holds a running run

    @property
    def orphaned(self) -> bool:
        """Running, but its owner is gone (killed, power lost): it will be interrupted and queued again."""
        return self.state == "running" and not alive(self.pid, self.pid_start)

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
    """Runs in a SQLite file, through the process's one connection to it (engine `open_database`): every
    `RunQueue` of a process shares it, and its threads take turns.

    SQLite's own errors (disk full, read-only, locked, no descriptors, a damaged file) come out as `QueueError`.
    """

    busy_timeout_s = 30.0  # how long a statement waits for another process's write before it fails

    def __init__(self, path: Path | None = None):
        self.path = path or run_queue()
        with self._guard():
            self.db = open_database(private_folder(self.path), _prepare, self.busy_timeout_s)

    @contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            if database_damaged(exc):
                raise QueueError(
                    f"the run queue {self.path} is damaged ({clip(str(exc), 300)}); start `nightshift serve`: it "
                    "keeps the damaged file aside and rebuilds the queue from what it can read and the report index",
                    damaged=True,
                ) from exc
            raise QueueError(
                f"the run queue {self.path} cannot be read or written: {clip(str(exc), 300)}; check that the "
                f"data dir {self.path.parent} is yours, writable and has free space"
            ) from exc

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._guard(), self.db.read() as db:
            yield db

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: everything in it is stored, or nothing (also when the process dies)."""
        with self._guard(), self.db.transaction() as db:
            yield db

    def _write(self, sql: str, parameters: tuple) -> sqlite3.Cursor:
        with self._transaction() as db:
            return db.execute(sql, parameters)

    def damage(self) -> str | None:
        """What SQLite's quick check finds wrong with the file (None: sound); `serve` asks when it starts."""
        with self._guard():
            return self.db.damage()

    def enqueue(self, review: str, as_of: date | None = None, due: datetime | None = None,
                origin: str = "manual") -> int | None:  # fmt: skip
        """Queue a run; None when that scheduled run (review, due) is already recorded."""
        cursor = self._write(_ENQUEUE, (review, as_of.isoformat() if as_of else None, due.isoformat() if due else None,
                                        origin, clock.now().isoformat(timespec="seconds")))  # fmt: skip
        return cursor.lastrowid if cursor.rowcount else None

    def begin(self, review: str, as_of: date | None, pid: int) -> Run:
        """A run asked for by hand, queued and claimed by process `pid` in one step (a foreground `review run`):
        a service starting meanwhile cannot take it first."""
        now = clock.now().isoformat(timespec="seconds")
        cursor = self._write(
            "INSERT INTO runs (review, as_of, origin, state, created, started, pid, pid_start) "
            "VALUES (?, ?, 'manual', 'running', ?, ?, ?, ?)",
            (review, as_of.isoformat() if as_of else None, now, now, pid, process_start(pid)),
        )
        return self.get(cursor.lastrowid)

    def claim_next(self, pid: int) -> Run | None:
        """The oldest queued run, now marked running by `pid`; None when nothing waits."""
        with self._read() as db:
            row = db.execute("SELECT id FROM runs WHERE state = 'queued' ORDER BY id LIMIT 1").fetchone()
        if row is None:
            return None
        return self.claim(row["id"], pid) or self.claim_next(pid)

    def queued(self) -> list[Run]:
        """The runs waiting, oldest first (the service looks among them for runs to batch with the one it took)."""
        with self._read() as db:
            rows = db.execute("SELECT * FROM runs WHERE state = 'queued' ORDER BY id").fetchall()
        return [Run.from_row(row) for row in rows]

    def claim(self, run_id: int, pid: int) -> Run | None:
        """Mark a queued run as running by process `pid`; None if it is not queued (someone else took it)."""
        cursor = self._write(
            "UPDATE runs SET state = 'running', started = ?, pid = ?, pid_start = ? WHERE id = ? AND state = 'queued'",
            (clock.now().isoformat(timespec="seconds"), pid, process_start(pid), run_id),
        )
        return self.get(run_id) if cursor.rowcount else None

    def finish(self, run_id: int, state: str, report: str | None = None, error: str | None = None) -> bool:
        """End a running run (the reason clipped); False if it was not running any more."""
        now = clock.now().isoformat(timespec="seconds")
        return bool(self._write(_FINISH, (state, now, report, clip(error, ERROR_KEPT), run_id)).rowcount)

    def interrupt(self, run_id: int, reason: str, again: bool) -> int | None:
        """End a running run as interrupted and, if `again`, queue its retry in the same transaction.

        Returns the retry's id (None: not queued again, or the run was not running any more).
        """
        with self._transaction() as db:
            return self._interrupt(db, run_id, reason, again)

    @staticmethod
    def _interrupt(db: sqlite3.Connection, run_id: int, reason: str, again: bool) -> int | None:
        row = db.execute("SELECT * FROM runs WHERE id = ? AND state = 'running'", (run_id,)).fetchone()
        if row is None:
            return None
        now = clock.now().isoformat(timespec="seconds")
        db.execute(_FINISH, ("interrupted", now, None, clip(reason, ERROR_KEPT), run_id))
        if not again:
            return None
        return db.execute(_ENQUEUE, (row["review"], row["as_of"], row["due"], "retry", now)).lastrowid

    def set_progress(self, run_id: int, progress: RunProgress) -> None:
        self._write("UPDATE runs SET progress = ? WHERE id = ?", (json.dumps(asdict(progress)), run_id))

    def recover(self, lost_by: int | None = None) -> list[int]:
        """Running runs whose owner is gone: interrupted and queued again, once. Returns the retries' ids.

        `lost_by`: a live process whose runs are lost all the same (the service's worker thread died
        and was restarted). A run whose owner still runs (a foreground `review run`) is left alone.
        A lost run whose outcome the report index already has (its owner wrote the report, or its
        failure, then died or could not record it: a full disk) ends as the index says, never run twice.
        One transaction: a process that dies while recovering leaves each run either still `running`
        (recovered next time) or ended, or interrupted with its retry queued, never interrupted and not queued.
        """
        with self._read() as db:
            rows = db.execute("SELECT id, pid, pid_start FROM runs WHERE state = 'running'").fetchall()
        if not any(self._lost(row, lost_by) for row in rows):
            return []
        ended = _outcomes_in_index()
        retries = []
        with self._transaction() as db:
            for row in db.execute("SELECT id, pid, pid_start FROM runs WHERE state = 'running'").fetchall():
                if not self._lost(row, lost_by):
                    continue
                if (entry := ended.get(row["id"])) is not None:
                    db.execute(_FINISH, (entry.state, clock.now().isoformat(timespec="seconds"), entry.path,
                                         entry.reason, row["id"]))  # fmt: skip
                else:
                    retries.append(self._interrupt(db, row["id"], f"{gone_reason(row['pid'])}; queued again", True))
        return [retry for retry in retries if retry is not None]

    @staticmethod
    def _lost(row: sqlite3.Row, lost_by: int | None) -> bool:
        return row["pid"] == lost_by or not alive(row["pid"], row["pid_start"])

    def restore(self, rows: list[dict[str, Any]]) -> int:
        """Put runs back as they were stored, their ids kept (a damaged queue's rebuild); returns how many were
        added: a run whose id, or scheduled due time, is already there is left as it is."""
        columns = {f.name for f in fields(Run)}
        added = 0
        with self._transaction() as db:
            for row in rows:
                names = [name for name in row if name in columns]
                added += db.execute(f"INSERT OR IGNORE INTO runs ({', '.join(names)}) VALUES "
                                    f"({', '.join('?' * len(names))})", [row[name] for name in names]).rowcount  # fmt: skip
        return added

    def get(self, run_id: int) -> Run | None:
        with self._read() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return Run.from_row(row) if row else None

    def recent(self, limit: int = 30) -> list[Run]:
        """Waiting and running runs, then the latest finished ones, newest first."""
        with self._read() as db:
            rows = db.execute(
                "SELECT * FROM runs ORDER BY state IN ('queued', 'running') DESC, id DESC LIMIT ?", (limit,)
            ).fetchall()
        return [Run.from_row(row) for row in rows]
