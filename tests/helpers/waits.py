"""Waits on a condition with a deadline: a test never sleeps in the hope that something has happened."""

from __future__ import annotations

import time


def wait_for(condition, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.2)


async def until(pilot, condition, seconds: float = 120.0, what: str = "") -> None:
    """Let the app run until `condition()` holds."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        await pilot.pause(0.1)
