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
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, tzinfo
from pathlib import Path
from typing import Any

from nightshift.app.paths import reports_index
from nightshift.app.review.errors import ReviewError
from nightshift.app.review.window import Window


@contextmanager
def _locked() -> Iterator[None]:
    path = reports_index().with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def is_failed(entry: dict[str, Any]) -> bool:
    """A failed run's entry: it has a reason and no report."""
    return entry.get("state") == "failed"


def read_index() -> list[dict[str, Any]]:
    """Entries, oldest first; reports whose PDF is gone are kept but marked `missing`."""
    try:
        entries = json.loads(reports_index().read_text())
    except FileNotFoundError:
        return []
    except ValueError:
        raise ReviewError(
            f"the report index {reports_index()} is damaged; move it aside (the PDFs stay where they are) "
            "and new reports will start a fresh index"
        ) from None
    for entry in entries:
        entry["missing"] = not is_failed(entry) and not Path(entry["path"]).is_file()
    return entries


def add_to_index(entry: dict[str, Any]) -> dict[str, Any]:
    """Append an entry (gets the next `id`) and return it as stored; earlier entries are kept as they were."""
    with _locked():
        entries = [{k: v for k, v in e.items() if k != "missing"} for e in read_index()]
        entry = {"id": max((e["id"] for e in entries), default=0) + 1, **entry}
        entries.append(entry)
        temporary = reports_index().with_suffix(".json.part")
        temporary.write_text(json.dumps(entries, indent=1))
        temporary.chmod(0o600)  # like the reports themselves: the owner's numbers
        os.replace(temporary, reports_index())
    return entry


def add_failure(review: str, reason: str, run: int | None = None, title: str | None = None,
                as_of: date | None = None, window: Window | None = None,
                zone: tzinfo = UTC) -> dict[str, Any]:  # fmt: skip
    """Record a failed run: what was reviewed (as far as it got), when, and why, on one line."""
    return add_to_index({
        "state": "failed", "run": run, "review": review, "title": title or review,
        "as_of": as_of.isoformat() if as_of else None, "period": window.label if window else None,
        "start": window.start.isoformat() if window else None, "end": window.end.isoformat() if window else None,
        "created": datetime.now(UTC).astimezone(zone).isoformat(timespec="seconds"),
        "reason": " ".join(reason.split()),
    })  # fmt: skip
