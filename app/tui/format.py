"""Short renderings of figures for tables and lines that must fit 60 columns; every time in the user's zone."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nightshift.app.daemon.runs import Run


def gib(n: int | None) -> str:
    return "—" if n is None else f"{n / (1 << 30):.1f} GiB"


def seconds(s: float | None) -> str:
    """12 s, 3 m 05 s, 2 h 10 m."""
    if s is None or s != s or s < 0:
        return "—"
    s = round(s)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} m {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} m"


def local(iso: str) -> datetime:
    """An ISO time in the user's zone (the queue stores UTC, the index the schedule's zone; naive: the user's)."""
    return datetime.fromisoformat(iso).astimezone()


def stamp(iso: str | None, form: str = "%m-%d %H:%M") -> str:
    """An ISO time as `MM-DD HH:MM` (or `form`) in the user's zone, so every screen agrees."""
    if not iso:
        return "—"
    try:
        return local(iso).strftime(form)
    except ValueError:
        return iso


def compact(s: float | None) -> str:
    """`seconds` without spaces, for narrow tables: 12s, 3m05s, 2h10m."""
    return seconds(s).replace(" ", "")


def zone() -> str:
    """The user's zone's abbreviation (CET, UTC, ...), said once in the banner."""
    return datetime.now().astimezone().strftime("%Z")


def took(run: Run, now: float) -> float | None:
    """Seconds a run took, or has taken by `now` (a Unix time) while it runs; None before it started."""
    if not run.started:
        return None
    end = local(run.finished).timestamp() if run.finished else now
    return end - local(run.started).timestamp()


def duration(run: Run, now: float, narrow: bool = False) -> str:
    return (compact if narrow else seconds)(took(run, now))
