"""Business days from a holiday calendar (`calendar` in a schedule): the plain forms, `review list`, the service."""

from __future__ import annotations

import pickle
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest

from nightshift.app.cli import main
from nightshift.app.review.calendars import BusinessDays, business_days
from nightshift.app.review.errors import ScheduleError
from nightshift.app.review.schedule import load_schedule
from nightshift.app.review.when import BusinessDayOfMonthTrigger, parse_when
from tests.helpers.service import queued, start, step

LONDON = ZoneInfo("Europe/London")


def days(when: str, calendar: str | None, start: datetime, count: int) -> list[str]:
    """The first `count` dates `when` fires on from `start` with `calendar`'s business days."""
    trigger, fired, previous = parse_when(when, LONDON, business_days(calendar)), [], None
    for _ in range(count):
        previous = trigger.get_next_fire_time(previous, previous + timedelta(seconds=1) if previous else start)
        fired.append(previous.date().isoformat())
    return fired


def test_last_business_day_of_august_2026_in_england_is_the_28th():
    start = datetime(2026, 8, 1, tzinfo=LONDON)
    assert days("last business day of the month at 22:00", "GB-ENG", start, 1) == ["2026-08-28"]  # 31st: bank holiday
    assert days("last business day of the month at 22:00", None, start, 1) == ["2026-08-31"]  # Monday to Friday


@pytest.mark.parametrize("calendar", ["GB-ENG", "DE", "DE-BY", "US-NY", "XECB", "FR"])
def test_first_business_day_of_january_2027_is_the_4th_with_new_years_day(calendar):
    start = datetime(2026, 12, 15, tzinfo=LONDON)
    assert days("first business day of the month", calendar, start, 1) == ["2027-01-04"]  # 1 Jan is a Friday


def test_without_a_calendar_business_days_are_monday_to_friday_as_before():
    start = datetime(2026, 12, 15, tzinfo=LONDON)
    assert days("first business day of the month", None, start, 1) == ["2027-01-01"]
    # The triggers are those of before calendars, so a job the service stored then is kept (same repr).
    assert repr(parse_when("last business day of the month at 22:00", LONDON)) == (
        "<WallClock <BusinessDayOfMonthTrigger (last business day of the month at 22:00, timezone=Europe/London)>>"
    )
    assert "CronTrigger" in repr(parse_when("every business day at 18:30", LONDON))


def test_every_business_day_skips_the_target_holidays_of_easter():
    start = datetime(2027, 3, 25, 19, tzinfo=LONDON)  # Good Friday 26 March, Easter Monday 29 March 2027
    assert days("every business day at 18:30", "XECB", start, 2) == ["2027-03-30", "2027-03-31"]
    assert days("every business day at 18:30", None, start, 2) == ["2027-03-26", "2027-03-29"]


def test_a_calendar_brings_its_own_weekend():
    # Israel's weekend is Friday and Saturday: its business days run Sunday to Thursday.
    assert days("every business day at 09:00", "IL", datetime(2026, 11, 5, 10, tzinfo=LONDON), 2) == [
        "2026-11-08", "2026-11-09"]  # fmt: skip
    assert date(2026, 11, 8) in BusinessDays("IL") and date(2026, 11, 8) not in BusinessDays()


def test_a_trigger_with_a_calendar_survives_the_job_store():
    trigger = parse_when("last business day of the month at 22:00", LONDON, business_days("GB-ENG"))
    again = pickle.loads(pickle.dumps(trigger))
    assert repr(again) == repr(trigger) and "GB-ENG" in repr(trigger)
    now = datetime(2026, 8, 1, tzinfo=LONDON)
    assert again.get_next_fire_time(None, now) == datetime(2026, 8, 28, 22, tzinfo=LONDON)
    # One stored before calendars has no `days` of its own: it reads as Monday to Friday.
    old = BusinessDayOfMonthTrigger("last", time(22), LONDON)
    del old.days
    assert pickle.loads(pickle.dumps(old)).day_in(2026, 8) == date(2026, 8, 31)


SCHEDULE = 'when = "{when}"\ncalendar = "{calendar}"\ntimezone = "Europe/London"\n[sources]\n'


@pytest.mark.parametrize(
    ("when", "calendar", "field", "message"),
    [
        ("last business day of the month", "EN-GB", "calendar", "'EN-GB' is not a holiday calendar; "),
        ("last business day of the month", "GB-XYZ", "calendar", "GB has no subdivision 'XYZ'; use GB alone "
                                                                 "(its nationwide holidays) or one of GB-ENG, GB-NIR"),
        ("Fridays at 17:00", "GB-ENG", "when", "'Fridays at 17:00' names no business days, so the holiday calendar "
                                               "'GB-ENG' would change nothing"),
        ("30 18 * * mon-fri", "DE", "when", "names no business days"),
        ("last day of the month", "DE", "when", "names no business days"),
    ],
)  # fmt: skip
def test_a_bad_calendar_is_one_line_naming_the_file_and_the_choices(tmp_path, when, calendar, field, message):
    path = tmp_path / "x.toml"
    path.write_text(SCHEDULE.format(when=when, calendar=calendar), encoding="utf-8")
    with pytest.raises(ScheduleError) as caught:
        load_schedule(path)
    error = str(caught.value)
    assert error.startswith(f"{path}:{1 if field == 'when' else 2}: field `{field}`: ") and message in error
    assert "\n" not in error
    if calendar == "EN-GB":  # every valid name is listed
        assert "Financial: " in error and "XECB" in error and "Countries: AD, AE" in error and ", GB, " in error


def test_review_list_shows_each_calendar_or_none(home, capsys):
    (home / "schedules").mkdir(parents=True)
    (home / "schedules" / "target.toml").write_text(SCHEDULE.format(when="every business day", calendar="XECB"))
    assert main(["review", "list"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "(GB-ENG holidays)" in lines["month-end"]  # the bundled month-end uses England's calendar
    assert "(XECB holidays)" in lines["target"]
    assert "(no holiday calendar)" in lines["daily"]


def test_the_service_fires_on_the_calendars_last_business_day(home, wall, bundled):
    """The bundled month-end (GB-ENG): stored in July, restarted after 31 July's run, the trigger read back from the
    job store fires on 28 August, not on the bank holiday of the 31st."""
    assert bundled["month-end"].business_days == BusinessDays("GB-ENG")
    wall.set(datetime(2026, 7, 20, 12, tzinfo=UTC))
    start(bundled, ["month-end"]).stop()
    wall.set(datetime(2026, 8, 1, 9, tzinfo=UTC))  # 31 July's run was missed while off; within its grace
    service = start(bundled, ["month-end"])
    try:
        step(service, wall, datetime(2026, 9, 2, tzinfo=UTC), timedelta(hours=6))
    finally:
        service.stop()
    assert queued("month-end") == ["2026-07-31 21:00", "2026-08-28 21:00"]  # 22:00 in London (summer time)


def test_the_service_skips_holidays_every_business_day(home, wall):
    (home / "schedules").mkdir(parents=True)
    (home / "schedules" / "target.toml").write_text(
        SCHEDULE.format(when="every business day at 18:30", calendar="XECB")
    )
    schedules = {"target": load_schedule(home / "schedules" / "target.toml")}
    wall.set(datetime(2027, 3, 24, 12, tzinfo=UTC))
    service = start(schedules, ["target"])
    try:
        step(service, wall, datetime(2027, 3, 31, 12, tzinfo=UTC), timedelta(hours=1))
    finally:
        service.stop()
    # London is on summer time from 28 March: 18:30 is 17:30 UTC from then.
    assert queued("target") == ["2027-03-24 18:30", "2027-03-25 18:30", "2027-03-30 17:30"]
