"""One module per command group, listed in app/cli.py's COMMANDS and imported only when chosen.

Each exposes `register(parser)`, which fills in its group's parser (description, arguments,
sub-commands); it imports the engine and other heavy packages inside the functions that use them.
A command's `run(args) -> int` raises `NightshiftError` for anything a user can meet.
"""

from __future__ import annotations

import sys


def say(message: str) -> None:
    """A status line for the user, on stderr so stdout stays the command's output."""
    print(f"nightshift: {message}", file=sys.stderr, flush=True)
