"""The index of reports in the data dir: one JSON file, rewritten atomically under a lock."""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from app.paths import data_dir
from app.review.errors import ReviewError


def index_path() -> Path:
    return data_dir() / "reports" / "index.json"


@contextmanager
def _locked() -> Iterator[None]:
    path = index_path().with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_index() -> list[dict[str, Any]]:
    """Reports, oldest first; entries whose PDF is gone are kept but marked `missing`."""
    try:
        entries = json.loads(index_path().read_text())
    except FileNotFoundError:
        return []
    except ValueError:
        raise ReviewError(
            f"the report index {index_path()} is damaged; move it aside (the PDFs stay where they are) "
            "and new reports will start a fresh index"
        ) from None
    for entry in entries:
        entry["missing"] = not Path(entry["path"]).is_file()
    return entries


def add_to_index(entry: dict[str, Any]) -> dict[str, Any]:
    """Append a report (gets the next `id`) and return it as stored."""
    with _locked():
        entries = [{k: v for k, v in e.items() if k != "missing"} for e in read_index()]
        entry = {"id": max((e["id"] for e in entries), default=0) + 1, **entry}
        entries.append(entry)
        temporary = index_path().with_suffix(".json.part")
        temporary.write_text(json.dumps(entries, indent=1))
        temporary.chmod(0o600)  # like the reports themselves: the owner's numbers
        os.replace(temporary, index_path())
    return entry
