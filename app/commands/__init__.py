"""One module per command group, listed in app/cli.py's COMMANDS and imported only when chosen.

Each exposes `register(parser)`, which fills in its group's parser (description, arguments,
sub-commands); it imports the engine and other heavy packages inside the functions that use them.
A command's `run(args) -> int` raises `NightshiftError` for anything a user can meet.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TypeVar

from nightshift.engine.errors import NightshiftError

T = TypeVar("T")


def say(message: str) -> None:
    """A status line for the user, on stderr so stdout stays the command's output."""
    print(f"nightshift: {message}", file=sys.stderr, flush=True)


def argument_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse `type` from a parser that refuses with NightshiftError: its message becomes argparse's
    (a usage error in words), not a traceback while the command line is read."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except NightshiftError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert
