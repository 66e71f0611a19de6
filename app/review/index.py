"""The index of reports in the data dir: one JSON file, rewritten atomically under a lock.

An entry is a run's outcome: a report written (`state` "done", with its `path`) or a
run that failed (`state` "failed", with the one-line `reason`). Interrupted runs get
no entry: they are queued again and the retry's outcome is what the index records.
Entries written before `state` existed are reports.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, date, datetime, tzinfo
from pathlib import Path
from typing import Any

from nightshift.app.paths import private_file, reports_index
from nightshift.app.review.errors import ReviewError
from nightshift.app.review.window import Window

REASON_KEPT = 2000  # characters of a failure's reason stored and shown (a 10 MB exception text is not)


def clip(text: str | None, limit: int) -> str | None:
    """`text` cut to `limit` characters, saying how many were left out (a reason or error kept or shown)."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"


@contextmanager
def _locked() -> Iterator[None]:
    path = private_file(reports_index().with_suffix(".lock"))
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


_REPORT_FIELDS = ("path", "findings", "by_severity", "replaced_sentences", "seconds")  # a written report's only


@dataclass(frozen=True, kw_only=True)
class IndexEntry:
    """One run's outcome: a report written (`state` "done", with its `path`) or a failure (with its `reason`).

    Dates and times are ISO strings, as the index file stores them. `missing` is not stored: it is
    found when the index is read (the PDF was moved or deleted since).
    """

    id: int = 0  # given by `add_to_index`
    state: str = "done"  # done | failed
    run: int | None = None  # the run queue's id; None for a report written outside the queue
    review: str
    title: str = ""  # the schedule's title; the review's name when empty
    as_of: str | None = None
    period: str | None = None  # the reviewed window's label; None when a failure came before it was known
    start: str | None = None
    end: str | None = None
    created: str
    path: str | None = None
    findings: int = 0
    by_severity: dict[str, int] = field(default_factory=dict)
    replaced_sentences: int = 0  # the model's sentences the gate refused (each replaced by a plain one)
    seconds: float | None = None  # how long the run took
    reason: str | None = None
    missing: bool = False

    @property
    def failed(self) -> bool:
        return self.state == "failed"

    @property
    def name(self) -> str:
        """What the entry is called in lists: the schedule's title, else the review's name."""
        return self.title or self.review

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> IndexEntry:
        """Parse an entry as stored or as the control socket sends it (keys older versions did not write: defaults)."""
        entry = cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})
        return replace(entry, reason=clip(entry.reason, REASON_KEPT))  # one stored whole by an older version

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values: a report's fields, or a failure's reason, never both."""
        values = asdict(self)
        for name in ("reason",) if not self.failed else _REPORT_FIELDS:
            del values[name]
        return values


def _stored() -> list[dict[str, Any]]:
    """The index file's entries as written, oldest first."""
    try:
        return json.loads(reports_index().read_text())
    except FileNotFoundError:
        return []
    except ValueError:
        raise ReviewError(
            f"the report index {reports_index()} is damaged; move it aside (the PDFs stay where they are) "
            "and new reports will start a fresh index"
        ) from None


def read_index() -> list[IndexEntry]:
    """Entries, oldest first; reports whose PDF is gone are kept but marked `missing`."""
    entries = [IndexEntry.from_dict(values) for values in _stored()]
    return [replace(e, missing=not e.failed and not Path(e.path or "").is_file()) for e in entries]


def add_to_index(entry: IndexEntry) -> IndexEntry:
    """Append an entry (gets the next `id`) and return it as stored; earlier entries are kept as they were."""
    with _locked():
        stored = _stored()
        entry = replace(entry, id=max((values["id"] for values in stored), default=0) + 1, missing=False)
        values = entry.to_dict()
        del values["missing"]
        stored.append(values)
        temporary = reports_index().with_suffix(".json.part")
        temporary.write_text(json.dumps(stored, indent=1))
        temporary.chmod(0o600)  # like the reports themselves: the owner's numbers
        os.replace(temporary, reports_index())
    return entry


def add_failure(review: str, reason: str, run: int | None = None, title: str | None = None,
                as_of: date | None = None, window: Window | None = None,
                zone: tzinfo = UTC) -> IndexEntry:  # fmt: skip
    """Record a failed run: what was reviewed (as far as it got), when, and why, on one line."""
    return add_to_index(IndexEntry(
        state="failed", run=run, review=review, title=title or review,
        as_of=as_of.isoformat() if as_of else None, period=window.label if window else None,
        start=window.start.isoformat() if window else None, end=window.end.isoformat() if window else None,
        created=datetime.now(UTC).astimezone(zone).isoformat(timespec="seconds"),
        reason=clip(" ".join(reason.split()), REASON_KEPT),
    ))  # fmt: skip
