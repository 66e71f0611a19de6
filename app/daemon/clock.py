"""The service's wall clock, in one place so tests can move time (APScheduler reads `datetime.now` too)."""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> datetime:
    return datetime.now(UTC)
