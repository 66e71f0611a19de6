"""Business days: Monday to Friday, or the working days of a holiday calendar (the `holidays` package).

A schedule's `calendar` names one: a country's ISO 3166 code, optionally with one of its
subdivisions after a hyphen (`GB-ENG`, `DE-BY`, `US-NY`), or a financial calendar (`XECB`, the
ECB's TARGET days; `XNYS`, `XLON`...). Its business days are those outside its weekend (Saturday and
Sunday in most countries, Friday and Saturday in some) that are not its holidays (observed days
included: Christmas on a Saturday moves the day off to the Monday after), plus the weekend days it
declares working days. Without one, business days are Monday to Friday, as they always were.

`BusinessDays` keeps only the calendar's name, so a trigger holding it pickles small into the
service's job store and reads its holidays again after a restart; each year's days off are built
once per process and shared (immutable, so threads may ask at once).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from typing import Any


@dataclass(frozen=True)
class BusinessDays:
    """Which days are business days: Monday to Friday (`calendar` None), or a holiday calendar's working days."""

    calendar: str | None = None

    def __contains__(self, day: date) -> bool:
        if self.calendar is None:
            return day.weekday() < 5
        weekend, off, working = _year(self.calendar, day.year)
        return (day.weekday() not in weekend or day in working) and day not in off

    def __str__(self) -> str:
        return f"{self.calendar} holidays" if self.calendar else "no holiday calendar"


MONDAY_TO_FRIDAY = BusinessDays()


def _entity(calendar: str, year: int) -> Any:
    """The `holidays` object for `calendar` and one year; ValueError, with the valid choices, for a name it lacks."""
    import holidays

    financial = holidays.list_supported_financial()
    if calendar in financial:
        return holidays.financial_holidays(calendar, years=year)
    countries = holidays.list_supported_countries()
    country, _, subdivision = calendar.partition("-")
    if country in countries and (not subdivision or subdivision in countries[country]):
        return holidays.country_holidays(country, subdiv=subdivision or None, years=year)
    if country in countries:
        raise ValueError(f"{country} has no subdivision {subdivision!r}; use {country} alone (its nationwide "
                         f"holidays) or one of {', '.join(f'{country}-{s}' for s in countries[country])}")  # fmt: skip
    codes = sorted(code for code in countries if len(code) == 2)
    nearest = difflib.get_close_matches(calendar, [*financial, *codes], n=3, cutoff=0.5)
    hint = f"the nearest are {', '.join(nearest)}; " if nearest else ""
    raise ValueError(f"{calendar!r} is not a holiday calendar; {hint}use a country code, optionally with a "
                     'subdivision ("GB-ENG", "DE-BY"), or a financial calendar ("XECB": the ECB\'s TARGET days). '
                     f"Financial: {', '.join(sorted(financial))}. Countries: {', '.join(codes)}")  # fmt: skip


@lru_cache(maxsize=256)
def _year(calendar: str, year: int) -> tuple[frozenset[int], frozenset[date], frozenset[date]]:
    """One year of `calendar`: its weekend (weekday numbers), its days off, and the weekend days it works."""
    entity = _entity(calendar, year)
    return frozenset(entity.weekend), frozenset(entity), frozenset(entity.weekend_workdays)


def business_days(calendar: str | None) -> BusinessDays:
    """The business days of a schedule's `calendar` (None: Monday to Friday); ValueError lists the valid names."""
    if calendar is None:
        return MONDAY_TO_FRIDAY
    _year(calendar, date.today().year)
    return BusinessDays(calendar)
