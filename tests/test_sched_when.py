"""Schedule files and the `when` forms: plain phrases and cron, last business day across a year, errors with file:line."""

from __future__ import annotations

import re
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from nightshift.app.review.errors import ScheduleError
from nightshift.app.review.schedule import BUNDLED_DIR, load_schedule, load_schedules
from nightshift.app.review.when import parse_when

LONDON = ZoneInfo("Europe/London")


def fire_times(when: str, start: datetime, count: int) -> list[datetime]:
    trigger, times, previous = parse_when(when, LONDON), [], None
    for _ in range(count):
        previous = trigger.get_next_fire_time(previous, previous + timedelta(seconds=1) if previous else start)
        times.append(previous)
    return times


def test_last_business_day_of_every_month_of_2027():
    times = fire_times("last business day of the month at 22:00", datetime(2027, 1, 1, tzinfo=LONDON), 12)
    assert [t.date().isoformat() for t in times] == [
        "2027-01-29", "2027-02-26", "2027-03-31", "2027-04-30", "2027-05-31", "2027-06-30",
        "2027-07-30", "2027-08-31", "2027-09-30", "2027-10-29", "2027-11-30", "2027-12-31",
    ]  # fmt: skip
    assert all(t.weekday() < 5 and (t.hour, t.minute) == (22, 0) for t in times)
    assert times[2].utcoffset() == timedelta(hours=1)  # 31 March 2027 is summer time in London


def test_first_business_day_and_plain_forms():
    assert [t.date().isoformat() for t in fire_times("first business day of the month", datetime(2026, 8, 1, tzinfo=LONDON), 3)] == [
        "2026-08-03", "2026-09-01", "2026-10-01"]  # fmt: skip
    fridays = fire_times("Fridays", datetime(2026, 10, 26, tzinfo=LONDON), 2)
    assert [(t.date().isoformat(), t.hour) for t in fridays] == [("2026-10-30", 18), ("2026-11-06", 18)]
    business = fire_times("every business day at 18:30", datetime(2026, 10, 30, 19, tzinfo=LONDON), 2)
    assert [t.date().isoformat() for t in business] == ["2026-11-02", "2026-11-03"]  # skips the weekend
    cron = fire_times("30 18 * * mon-fri", datetime(2026, 10, 30, 19, tzinfo=LONDON), 2)
    assert cron == business
    assert fire_times("last day of the month at 23:00", datetime(2026, 2, 1, tzinfo=LONDON), 1)[0].day == 28


def test_unknown_forms_say_what_is_accepted():
    with pytest.raises(ValueError, match="not a schedule nightshift understands; write a crontab line"):
        parse_when("every other tuesday", LONDON)
    with pytest.raises(ValueError):
        parse_when("every day at 25:00", LONDON)


def test_bundled_schedules_load():
    schedules, errors = load_schedules()
    assert errors == []
    assert {"daily", "weekly", "month-end"} <= set(schedules)
    assert schedules["month-end"].grace_seconds == 3 * 86400
    assert schedules["month-end"].sources["bank"].decimal == ","


def broken_copy(tmp_path: Path, old: str, new: str) -> Path:
    text = (BUNDLED_DIR / "month-end.toml").read_text().replace(old, new, 1)
    assert old in (BUNDLED_DIR / "month-end.toml").read_text()
    path = tmp_path / "broken.toml"
    path.write_text(text)
    shutil.copytree(BUNDLED_DIR / "sample-data", tmp_path / "sample-data", dirs_exist_ok=True)
    return path


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), start=1) if text in line)


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        ('when = "last business', 'when = "whenever, last business', "when", "not a schedule nightshift understands"),
        ('period = "month"', 'period = "fortnight"', "window.period", "'fortnight' is not a period"),
        ('type = "csv"', 'type = "excel"', "sources.bank.type", "'excel' is not a source type"),
        ('left = "bank"', 'left = "bnak"', "checks[0].left", "names source 'bnak'"),
        ('type = "duplicates"', 'type = "dupes"', "checks[1].type", "'dupes' is not a check"),
        ("max_tokens = 160", 'max_tokens = "lots"', "model.max_tokens", "should be int, not str 'lots'"),
        ('grace = "3d"', 'grace = "three days"', "grace", "is not a duration"),
        ('timezone = "Europe/London"', 'timezone = "Mars/Olympus"', "timezone", "unknown time zone"),
    ],
)
def test_errors_name_file_line_and_field(tmp_path, old, new, field, message):
    path = broken_copy(tmp_path, old, new)
    with pytest.raises(ScheduleError) as error:
        load_schedule(path)
    expected = f"{path}:{line_of(path, new)}"
    assert str(error.value).startswith(expected), str(error.value)
    assert f"field `{field}`" in str(error.value)
    assert message in str(error.value)


def test_invalid_toml_gives_the_line(tmp_path):
    path = broken_copy(tmp_path, 'grace = "3d"', 'grace = "3d')
    with pytest.raises(ScheduleError, match=re.escape(f"{path}:{line_of(path, 'grace =')}: not valid TOML")):
        load_schedule(path)


def test_a_broken_file_does_not_stop_the_others(tmp_path, home):
    (home / "schedules").mkdir(parents=True)
    (home / "schedules" / "mine.toml").write_text('name = "mine"\nwhen = "sometimes"\n[sources]\n')
    schedules, errors = load_schedules()
    assert {"daily", "weekly", "month-end"} <= set(schedules)
    assert len(errors) == 1 and str(errors[0]).startswith(f"{home / 'schedules' / 'mine.toml'}:2: field `when`")


def test_a_users_schedule_overrides_a_bundled_one(home):
    (home / "schedules").mkdir(parents=True)
    text = (BUNDLED_DIR / "daily.toml").read_text().replace('"sample-data/', f'"{BUNDLED_DIR}/sample-data/')
    (home / "schedules" / "daily.toml").write_text(text.replace('at 18:30"', 'at 07:15"'))
    schedules, errors = load_schedules()
    assert errors == [] and schedules["daily"].when == "every business day at 07:15"
    now = datetime(2026, 11, 2, tzinfo=UTC)
    assert schedules["daily"].trigger.get_next_fire_time(None, now).hour == 7


BERLIN = ZoneInfo("Europe/Berlin")


def utc_fires(when: str, zone: ZoneInfo, start: datetime, until: datetime) -> list[str]:
    """Every fire time from `start` to `until` as APScheduler asks for them (previous fire, now), in UTC."""
    trigger, fires, previous = parse_when(when, zone), [], None
    while (previous := trigger.get_next_fire_time(previous, previous or start)) and previous < until:
        fires.append(previous.astimezone(UTC).strftime("%m-%d %H:%M"))
    return fires


@pytest.mark.parametrize("when", ["every day at 02:30", "30 2 * * *"])
def test_a_time_that_occurs_twice_fires_once(when):
    # 25 October 2026, Berlin: 03:00 CEST becomes 02:00 CET, so 02:30 happens at 00:30 and again at 01:30 UTC.
    fires = utc_fires(when, BERLIN, datetime(2026, 10, 24, 12, tzinfo=UTC), datetime(2026, 10, 27, tzinfo=UTC))
    assert fires == ["10-25 00:30", "10-26 01:30"]  # the first occurrence only; then 02:30 CET


@pytest.mark.parametrize("when", ["every day at 02:30", "30 2 * * *", "every day at 02:00"])
def test_a_time_that_does_not_exist_fires_when_the_clocks_jump(when):
    # 29 March 2026, Berlin: 02:00 CET becomes 03:00 CEST; 02:00-02:59 do not exist. Next valid time: 03:00 CEST.
    fires = utc_fires(when, BERLIN, datetime(2026, 3, 28, 12, tzinfo=UTC), datetime(2026, 3, 31, tzinfo=UTC))
    minute = when.split(":")[-1] if ":" in when else "30"
    assert fires == ["03-29 01:00", f"03-30 00:{minute}"]


def test_a_half_hour_change_and_every_half_hour_through_the_repeated_hour():
    # Lord Howe Island moves its clocks by 30 minutes: 02:15 does not exist on 4 October 2026 (02:00 -> 02:30).
    fires = utc_fires("every day at 02:15", ZoneInfo("Australia/Lord_Howe"), datetime(2026, 10, 3, tzinfo=UTC),
                      datetime(2026, 10, 5, tzinfo=UTC))  # fmt: skip
    assert fires == ["10-03 15:30", "10-04 15:15"]  # 02:30 (+11:00) on the 4th, when the clocks jump; then 02:15
    # Every 30 minutes across Berlin's repeated hour: 02:00 and 02:30 once each, no hour counted twice.
    local = [
        datetime.strptime(f"2026-{fire}", "%Y-%m-%d %H:%M").replace(tzinfo=UTC).astimezone(BERLIN).strftime("%H:%M")
        for fire in utc_fires("*/30 * * * *", BERLIN, datetime(2026, 10, 24, 23, 0, tzinfo=UTC),
                              datetime(2026, 10, 25, 3, 0, tzinfo=UTC))
    ]  # fmt: skip
    assert local == ["01:00", "01:30", "02:00", "02:30", "03:00", "03:30"]
