"""The run catalogue: every timed run, in SQLite, losses kept.

A run carries its configuration (and a fingerprint of it, so runs of one
configuration group together), the model, the drives, the figures measured,
the counters that proved the configuration fired, a verdict ("win", "loss",
"baseline", "pass", "fail", ...), and the command that reproduces it.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nightshift.engine.errors import NightshiftError
from nightshift.engine.instruments.assertions import Proof, require
from nightshift.engine.instruments.database import open_database

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    recorded_at TEXT NOT NULL,
    kind TEXT NOT NULL,
    model TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    config TEXT NOT NULL,
    drives TEXT NOT NULL,
    figures TEXT NOT NULL,
    counters TEXT NOT NULL,
    verdict TEXT NOT NULL,
    command TEXT NOT NULL,
    note TEXT NOT NULL
)
"""
JSON_FIELDS = ("config", "drives", "figures", "counters")


class CatalogueError(NightshiftError):
    """A run asked for is not in the catalogue, or the catalogue file is unusable."""


def fingerprint(config: dict) -> str:
    """A short stable hash of a configuration (key order does not matter)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass
class Run:
    kind: str
    model: str
    config: dict
    figures: dict
    verdict: str
    drives: dict = field(default_factory=dict)
    counters: dict = field(default_factory=dict)
    command: str = ""
    note: str = ""
    id: int | None = None
    recorded_at: str = ""
    fingerprint: str = ""


class Catalogue:
    """The catalogue file at `path`, through the process's one connection to it (instruments/database.py)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = open_database(self.path, lambda db: db.execute(SCHEMA))
            with self.db.read() as db:
                db.execute("SELECT count(*) FROM runs").fetchone()  # a file that is not a catalogue says so now
        except (sqlite3.DatabaseError, OSError) as exc:
            raise CatalogueError(f"{self.path} is not a usable run catalogue ({exc}); move it aside") from exc

    def record(self, run: Run, proofs: list[Proof] = ()) -> int:
        """Store `run` if every proof holds on its counters (AssertionFailed otherwise); returns its id."""
        require(list(proofs), run.counters)
        run.recorded_at = run.recorded_at or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        run.fingerprint = fingerprint(run.config)
        values = asdict(run)
        values.pop("id")
        for key in JSON_FIELDS:
            values[key] = json.dumps(values[key], sort_keys=True, default=str)
        with self.db.transaction() as db:
            cursor = db.execute(
                f"INSERT INTO runs ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})", list(values.values())
            )
            run.id = cursor.lastrowid
        return run.id

    def runs(self, kind: str | None = None, limit: int | None = None) -> list[Run]:
        """Newest first."""
        query, params = "SELECT * FROM runs", []
        if kind:
            query, params = query + " WHERE kind = ?", [kind]
        query += " ORDER BY id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        with self.db.read() as db:
            return [self._run(row) for row in db.execute(query, params).fetchall()]

    def get(self, run_id: int) -> Run:
        with self.db.read() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", [run_id]).fetchone()
        if row is None:
            raise CatalogueError(f"no run {run_id} in {self.path}; `nightshift runs list` shows the runs recorded")
        return self._run(row)

    def export(self, fmt: str) -> str:
        """Every run as JSON (a list) or CSV (figures and counters as JSON columns)."""
        runs = [asdict(run) for run in reversed(self.runs())]
        if fmt == "json":
            return json.dumps(runs, indent=1, default=str) + "\n"
        if fmt != "csv":
            raise CatalogueError(f"export format {fmt!r}: choose json or csv")
        out = io.StringIO()
        columns = list(Run.__dataclass_fields__)
        writer = csv.DictWriter(out, fieldnames=columns)
        writer.writeheader()
        for run in runs:
            writer.writerow({k: json.dumps(v, sort_keys=True) if k in JSON_FIELDS else v for k, v in run.items()})
        return out.getvalue()

    @staticmethod
    def _run(row: sqlite3.Row) -> Run:
        data = dict(row)
        for key in JSON_FIELDS:
            data[key] = json.loads(data[key])
        return Run(**data)


def compare(a: Run, b: Run) -> list[tuple[str, object, object, float | None]]:
    """(figure, value in a, value in b, b / a) for every figure either run has; ratio None if not numeric."""
    rows = []
    for key in sorted(set(a.figures) | set(b.figures)):
        x, y = a.figures.get(key), b.figures.get(key)
        numeric = isinstance(x, (int, float)) and isinstance(y, (int, float)) and x
        rows.append((key, x, y, y / x if numeric else None))
    return rows
