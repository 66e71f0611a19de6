"""Errors a user meets while defining or running a review, each saying what to fix."""

from __future__ import annotations

from nightshift.engine.errors import NightshiftError


class ReviewError(NightshiftError):
    """A review cannot run as configured (bad source, bad data, missing template...)."""


class ScheduleError(ReviewError):
    """A schedule file is invalid; the message names the file, line and field."""


class ReviewInterrupted(ReviewError):
    """A run was stopped (the service shut down) before its report was written."""
