"""Errors a user can meet, each with a message that says what to do.

Anything else that escapes the engine is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`; did you mean 'review'?` when one of `choices` is close to a mistyped `word`, else ""."""
    close = difflib.get_close_matches(word, [str(choice) for choice in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class NightshiftError(Exception):
    """Base of every error a user can meet; the CLI prints the message and exits non-zero."""


class ModelFormatError(NightshiftError):
    """A model file is missing, truncated, corrupt or not what it claims to be."""


class UnsupportedModelError(NightshiftError):
    """A model uses an architecture or tensor type nightshift cannot convert exactly."""


class NoSpaceError(NightshiftError):
    """A target drive lacks the room for what is about to be written."""


class ModelNotFoundError(NightshiftError):
    """A model was asked for that has not been prepared or imported."""


class MemoryFitError(NightshiftError):
    """What must stay resident in RAM would not fit in the RAM available."""


class SettingError(NightshiftError):
    """An environment variable or setting holds a value nightshift cannot use."""
