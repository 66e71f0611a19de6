"""Waits on a condition with a deadline: a test never sleeps in the hope that something has happened.

The only sleep is the pause between two looks at the condition; a test that needs time itself to pass (a slow
drive, a timer) sleeps where it says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], seconds: float = 120, what: str = "", every: float = 0.2) -> None:
    """Return once `condition()` is true; fail the test if it is not within `seconds` (looked at every `every` s)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {seconds} s waiting for {what or condition}"
        time.sleep(every)


async def until(pilot, condition: Callable[[], object], seconds: float = 120.0, what: str = "") -> None:
    """Let the app run until `condition()` holds; fail the test if it does not within `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        await pilot.pause(0.1)
