"""The period a review looks at (day, week, month, quarter), relative to the run's as-of date."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta

from nightshift.app.review.errors import ReviewError

PERIODS = ("day", "week", "month", "quarter")


@dataclass(frozen=True)
class Window:
    period: str
    start: date
    end: date  # included

    @property
    def label(self) -> str:
        if self.period == "day":
            return self.start.isoformat()
        if self.period == "week":
            year, week, _ = self.start.isocalendar()
            return f"{year}-W{week:02d}"
        if self.period == "month":
            return self.start.strftime("%B %Y")
        return f"Q{(self.start.month - 1) // 3 + 1} {self.start.year}"

    def previous(self) -> Window:
        return window_containing(self.period, self.start - timedelta(days=1))


def window_containing(period: str, day: date) -> Window:
    """The `period` that contains `day` (weeks run Monday to Sunday)."""
    if not 1 < day.year < 9999:  # the period and the one before it must stay inside the calendar
        raise ReviewError(f"{day.isoformat()} is out of range for a review; use a date in the years 2 to 9998")
    if period == "day":
        return Window(period, day, day)
    if period == "week":
        start = day - timedelta(days=day.weekday())
        return Window(period, start, start + timedelta(days=6))
    if period in ("month", "quarter"):
        first_month = day.month if period == "month" else (day.month - 1) // 3 * 3 + 1
        start = date(day.year, first_month, 1)
        months = 1 if period == "month" else 3
        following = date(start.year + (start.month + months - 1) // 12, (start.month + months - 1) % 12 + 1, 1)
        return Window(period, start, following - timedelta(days=1))
    raise ReviewError(f"unknown period {period!r}; use one of {', '.join(PERIODS)}")
