"""Short, fixed-width renderings of figures for tables that must fit 80 columns."""

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


def stamp(iso: str | None) -> str:
    """An ISO time as `MM-DD HH:MM` in its own zone (the queue and the index store local or UTC times)."""
    if not iso:
        return "—"
    try:
        return datetime.fromisoformat(iso).strftime("%m-%d %H:%M")
    except ValueError:
        return iso


def duration(run: Run) -> str:
    """How long a run took, or has taken so far (from its progress) when still running."""
    if run.started and run.finished:
        return seconds((datetime.fromisoformat(run.finished) - datetime.fromisoformat(run.started)).total_seconds())
    if run.state == "running" and run.progress:
        return seconds(run.progress.elapsed)
    return "—"
