"""Time under test: a wall clock that moves only when the test moves it, and the user's zone the screens show."""

from __future__ import annotations

from datetime import datetime

ZONE = "Asia/Kolkata"  # no daylight saving time: the rendering does not change with the date


class Clock:
    """Wall time that moves only when a test says so; APScheduler and the service both read it."""

    def __init__(self, start: datetime):
        self.time = start

    def set(self, when: datetime) -> None:
        self.time = when
