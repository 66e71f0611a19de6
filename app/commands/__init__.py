"""One module per command group; each exposes `register(commands)` to add its sub-parsers.

A command's `run(args) -> int` raises `NightshiftError` for anything a user can meet.
"""

from __future__ import annotations

import sys


def say(message: str) -> None:
    """A status line for the user, on stderr so stdout stays the command's output."""
    print(f"nightshift: {message}", file=sys.stderr, flush=True)
