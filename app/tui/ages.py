"""How old what the dashboard shows is, and how that is said: every live figure carries its age.

The feed refreshes drives ten times a second and the queue twice; a figure older than
`STALE_AFTER_S` is marked stale, whatever stopped it (a stuck poll, a drive monitor that died, a
service that stopped answering), so a frozen number is never read as a live one.
"""

from __future__ import annotations

from dataclasses import dataclass

STALE_AFTER_S = 3.0
RECORD_EVERY_S = 1.0  # a writing run's progress record comes once a second


@dataclass(frozen=True)
class Ages:
    """Seconds since each part of the screen was fresh; None: that part has no figures yet."""

    snapshot: float  # the latest snapshot the feed delivered
    drives: float | None  # the drive monitor's newest sample
    service: float | None  # the latest read of the queue and reports
    record: float | None  # the running run's latest progress record, since the dashboard first saw it
    polling: float  # the poll in flight (0 when none is)

    @property
    def stale(self) -> bool:
        """The feed itself has delivered nothing fresh for a while."""
        return max(self.snapshot, self.service or 0.0) > STALE_AFTER_S


def age_label(age: float | None) -> str:
    """`live`, `4 s old`, or `STALE: 12 s old` (for a border's subtitle); "" when there is nothing to age."""
    if age is None:
        return ""
    if age > STALE_AFTER_S:
        return f"STALE: {age:.0f} s old"
    return "live" if age < 1.0 else f"{age:.0f} s old"


def stale_line(ages: Ages) -> str:
    """What the banner says while the feed is stale: how long, and whether a poll is stuck."""
    oldest = max(ages.snapshot, ages.service or 0.0)
    stuck = f"; the poll in flight has run {ages.polling:.0f} s" if ages.polling > STALE_AFTER_S else ""
    return f"STALE: nothing fresh for {oldest:.0f} s, the figures below are old{stuck}"
