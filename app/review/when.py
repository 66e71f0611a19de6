"""When a review runs: cron, or the plain forms people say, turned into APScheduler triggers.

Plain forms: "every day at 07:00", "every business day at 18:30", "Fridays",
"every Monday at 09:00", "last business day of the month at 22:00",
"first business day of the month", "last day of the month at 23:00". Without
"at", a review runs at 18:00, the end of a working day. Business days are
Monday to Friday, or a holiday calendar's working days when the schedule names
one (`calendar`, app/review/calendars.py); only the business-day forms use it.

Times are wall-clock times in the schedule's time zone, and daylight saving
time is handled the way people expect: a time that occurs twice (02:30 on the
night clocks go back) fires once, at its first occurrence; a time that does not
exist (02:30 on the night clocks go forward) fires at the next valid time, the
moment the clocks jump (03:00). APScheduler's cron trigger alone fires twice in
the first case and at 03:30 in the second; `WallClock` wraps every trigger.
"""

from __future__ import annotations

import calendar
import re
from datetime import UTC, date, datetime, time, timedelta, tzinfo

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger

from nightshift.app.review.calendars import MONDAY_TO_FRIDAY, BusinessDays

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
    """Fires on the first or last business day of every month, at a time of day."""

    days = MONDAY_TO_FRIDAY  # a trigger stored before calendars existed unpickles without its own

    def __init__(self, which: str, at: time, timezone: tzinfo, days: BusinessDays = MONDAY_TO_FRIDAY):
        self.which, self.at, self.timezone, self.days = which, at, timezone, days

    def day_in(self, year: int, month: int) -> date | None:
        """The first or last business day of that month (None if it has none)."""
        last = calendar.monthrange(year, month)[1]
        numbers = range(1, last + 1) if self.which == "first" else range(last, 0, -1)
        return next((day for number in numbers if (day := date(year, month, number)) in self.days), None)

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        earliest = max(now, previous_fire_time + timedelta(seconds=1)) if previous_fire_time else now
        local = earliest.astimezone(self.timezone)
        year, month = local.year, local.month
        while True:
            day = self.day_in(year, month)
            if day is not None and (fire := datetime.combine(day, self.at, tzinfo=self.timezone)) >= earliest:
                return fire
            year, month = (year + 1, 1) if month == 12 else (year, month + 1)

    def __str__(self) -> str:
        shown = f"{self.which} business day of the month at {self.at:%H:%M}"
        return f"{shown} ({self.days})" if self.days.calendar else shown

    def __repr__(self) -> str:
        return f"<BusinessDayOfMonthTrigger ({self}, timezone={self.timezone})>"


class OnBusinessDays(BaseTrigger):
    """A daily trigger's fire times on a holiday calendar's business days only ("every business day")."""

    def __init__(self, trigger: BaseTrigger, days: BusinessDays):
        self.trigger, self.days = trigger, days

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        while (fire := self.trigger.get_next_fire_time(previous_fire_time, now)) is not None:
            if fire.date() in self.days:
                return fire
            previous_fire_time, now = fire, fire + timedelta(seconds=1)
        return None

    def __str__(self) -> str:
        return f"{self.trigger} on business days ({self.days})"

    def __repr__(self) -> str:
        return f"<OnBusinessDays {self.days.calendar} {self.trigger!r}>"


def _wall(moment: datetime, timezone: tzinfo) -> datetime:
    """The wall-clock time at `moment` in `timezone`, naive."""
    return moment.astimezone(UTC).astimezone(timezone).replace(tzinfo=None)  # via UTC: same-zone astimezone is a no-op


def _valid(fire: datetime, timezone: tzinfo) -> datetime | None:
    """`fire` (a wall-clock time a trigger meant) as the instant it runs: None for the second occurrence of a
    repeated time, the end of the gap for a time that does not exist, else itself."""
    meant = fire.replace(tzinfo=None)
    if _wall(fire, timezone) != meant:  # in a gap: no instant shows this wall time
        low = meant.replace(tzinfo=timezone, fold=1).astimezone(UTC)  # read with the offset after the change
        high = meant.replace(tzinfo=timezone, fold=0).astimezone(UTC)  # and with the one before
        low, high = min(low, high), max(low, high)
        while high - low > timedelta(seconds=1):  # the first instant whose wall time is past `meant`
            middle = low + (high - low) / 2
            low, high = (middle, high) if _wall(middle, timezone) < meant else (low, middle)
        return high.replace(microsecond=0).astimezone(timezone)
    first = meant.replace(tzinfo=timezone, fold=0)
    if first.astimezone(UTC) < fire.astimezone(UTC):  # the same wall time came earlier: it fired then
        return None
    return fire


class WallClock(BaseTrigger):
    """A trigger's fire times as wall-clock times across daylight saving changes (see the module's text)."""

    def __init__(self, trigger: BaseTrigger, timezone: tzinfo):
        self.trigger, self.timezone = trigger, timezone

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        # Arithmetic in UTC: adding to a local time is wall-clock arithmetic, which forgets which occurrence it was.
        step = timedelta(microseconds=1)
        start = min(now, previous_fire_time.astimezone(UTC) + step) if previous_fire_time else now
        while (fire := self.trigger.get_next_fire_time(None, start)) is not None:
            valid = _valid(fire, self.timezone)
            if valid is not None and (previous_fire_time is None or valid > previous_fire_time):
                return valid
            start = fire.astimezone(UTC) + step
        return None

    def __str__(self) -> str:
        return str(self.trigger)

    def __repr__(self) -> str:
        return f"<WallClock {self.trigger!r}>"


def parse_when(text: str, timezone: tzinfo, days: BusinessDays = MONDAY_TO_FRIDAY) -> BaseTrigger:
    """A trigger for `text` (a plain form or a 5-field crontab line) on `days`' business days; ValueError says what
    is accepted, and refuses a holiday calendar for a form that names no business days (it would change nothing)."""
    spoken = " ".join(text.strip().lower().split())
    for kind, pattern in _FORMS:
        found = pattern.fullmatch(spoken)
        if found:
            if days.calendar is not None and not (kind == "business" or (kind == "month" and found.group("business"))):
                raise _calendar_unused(text, days)
            return WallClock(_trigger(kind, found, timezone, days), timezone)
    if len(spoken.split()) == 5:
        cron = CronTrigger.from_crontab(spoken, timezone=timezone)
        if days.calendar is not None:
            raise _calendar_unused(text, days)
        return WallClock(cron, timezone)
    raise ValueError(
        f'{text!r} is not a schedule nightshift understands; write a crontab line such as "30 18 * * mon-fri" '
        'or a plain form: "every business day at 18:30", "Fridays at 17:00", '
        '"last business day of the month at 22:00"'
    )


def _calendar_unused(text: str, days: BusinessDays) -> ValueError:
    return ValueError(f"{text!r} names no business days, so the holiday calendar {days.calendar!r} would change "
                      'nothing; use a business-day form ("every business day at 18:30", "last business day of the '
                      'month at 22:00") or remove `calendar`')  # fmt: skip


def _trigger(kind: str, found: re.Match, timezone: tzinfo, days: BusinessDays) -> BaseTrigger:
    at = DEFAULT_TIME
    if found.group("hour") is not None:
        at = time(int(found.group("hour")), int(found.group("minute")))  # ValueError for 25:00
    fields = {"hour": at.hour, "minute": at.minute, "timezone": timezone}
    if kind == "daily":
        return CronTrigger(**fields)
    if kind == "business":  # Monday to Friday stays a plain cron trigger (a job stored before calendars is kept)
        return CronTrigger(day_of_week="mon-fri", **fields) if days.calendar is None else OnBusinessDays(
            CronTrigger(**fields), days)  # fmt: skip
    if kind == "weekday":
        return CronTrigger(day_of_week=found.group("day")[:3], **fields)
    if found.group("business"):
        return BusinessDayOfMonthTrigger(found.group("which"), at, timezone, days)
    return CronTrigger(day="1" if found.group("which") == "first" else "last", **fields)
