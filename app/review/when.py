"""When a review runs: cron, or the plain forms people say, turned into APScheduler triggers.

Plain forms: "every day at 07:00", "every business day at 18:30", "Fridays",
"every Monday at 09:00", "last business day of the month at 22:00",
"first business day of the month", "last day of the month at 23:00". Without
"at", a review runs at 18:00, the end of a working day. Business days are
Monday to Friday (public holidays are not known).
"""

from __future__ import annotations

import calendar
import re
from datetime import date, datetime, time, timedelta, tzinfo

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger

DEFAULT_TIME = time(18, 0)
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")

_AT = r"(?:\s+at\s+(?P<hour>\d{1,2}):(?P<minute>\d{2}))?"
_FORMS = [
    ("daily", re.compile(rf"(?:every\s+day|daily){_AT}")),
    ("business", re.compile(rf"(?:every\s+business\s+day|business\s+days|weekdays){_AT}")),
    ("weekday", re.compile(rf"(?:every\s+)?(?P<day>{'|'.join(WEEKDAYS)})s?{_AT}")),
    ("month", re.compile(rf"(?P<which>first|last)\s+(?P<business>business\s+)?day\s+of\s+(?:the|every)\s+month{_AT}")),
]


class BusinessDayOfMonthTrigger(BaseTrigger):
    """Fires on the first or last Monday-to-Friday of every month, at a time of day."""

    def __init__(self, which: str, at: time, timezone: tzinfo):
        self.which, self.at, self.timezone = which, at, timezone

    def day_in(self, year: int, month: int) -> date:
        """The first or last business day of that month."""
        if self.which == "first":
            day = date(year, month, 1)
            while day.weekday() >= 5:
                day += timedelta(days=1)
        else:
            day = date(year, month, calendar.monthrange(year, month)[1])
            while day.weekday() >= 5:
                day -= timedelta(days=1)
        return day

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        earliest = max(now, previous_fire_time + timedelta(seconds=1)) if previous_fire_time else now
        local = earliest.astimezone(self.timezone)
        year, month = local.year, local.month
        while True:
            fire = datetime.combine(self.day_in(year, month), self.at, tzinfo=self.timezone)
            if fire >= earliest:
                return fire
            year, month = (year + 1, 1) if month == 12 else (year, month + 1)

    def __str__(self) -> str:
        return f"{self.which} business day of the month at {self.at:%H:%M}"

    def __repr__(self) -> str:
        return f"<BusinessDayOfMonthTrigger ({self}, timezone={self.timezone})>"


def parse_when(text: str, timezone: tzinfo) -> BaseTrigger:
    """A trigger for `text` (a plain form or a 5-field crontab line); ValueError says what is accepted."""
    spoken = " ".join(text.strip().lower().split())
    for kind, pattern in _FORMS:
        found = pattern.fullmatch(spoken)
        if found:
            return _trigger(kind, found, timezone)
    if len(spoken.split()) == 5:
        return CronTrigger.from_crontab(spoken, timezone=timezone)
    raise ValueError(
        f'{text!r} is not a schedule nightshift understands; write a crontab line such as "30 18 * * mon-fri" '
        'or a plain form: "every business day at 18:30", "Fridays at 17:00", '
        '"last business day of the month at 22:00"'
    )


def _trigger(kind: str, found: re.Match, timezone: tzinfo) -> BaseTrigger:
    at = DEFAULT_TIME
    if found.group("hour") is not None:
        at = time(int(found.group("hour")), int(found.group("minute")))  # ValueError for 25:00
    fields = {"hour": at.hour, "minute": at.minute, "timezone": timezone}
    if kind == "daily":
        return CronTrigger(**fields)
    if kind == "business":
        return CronTrigger(day_of_week="mon-fri", **fields)
    if kind == "weekday":
        return CronTrigger(day_of_week=found.group("day")[:3], **fields)
    if found.group("business"):
        return BusinessDayOfMonthTrigger(found.group("which"), at, timezone)
    return CronTrigger(day="1" if found.group("which") == "first" else "last", **fields)
