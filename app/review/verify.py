"""Checks every number the model writes against the numbers the review knows.

The narrative is split into plain text and numbers; a number that matches no
figure of the review (amounts, counts, percentages, dates) is marked as
unverified so the reader sees it was not taken from the data. Text is
HTML-escaped here, since the model's output is untrusted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from markupsafe import Markup, escape

# 1,234.56  -45.00  12%  2026. Not numbers: labels and references glued to letters (F3, INV-5010),
# and the month and day of an ISO date (only its year is read).
_START = r"(?<![\w.\-/])[-+−]?"
NUMBER = re.compile(rf"{_START}\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?(?!\w)|{_START}\d+(?:\.\d+)?(?!\w)")


@dataclass
class CheckedNumber:
    text: str
    verified: bool


def _value(text: str) -> Decimal | None:
    try:
        return abs(Decimal(text.replace(",", "").replace("−", "-")))
    except InvalidOperation:
        return None


def known_values(numbers: Iterable[Decimal | int | str]) -> set[Decimal]:
    """The review's figures in the forms a narrative may use: exact, and rounded to whole units."""
    known: set[Decimal] = set()
    for number in numbers:
        value = _value(str(number))
        if value is None:
            continue
        known.add(value.normalize())
        known.add(value.quantize(Decimal("1")).normalize())
    return known


def numbers_in(text: str, known: set[Decimal]) -> list[CheckedNumber]:
    found = []
    for match in NUMBER.finditer(text):
        value = _value(match.group())
        found.append(CheckedNumber(match.group(), value is not None and value.normalize() in known))
    return found


def mark_numbers(text: str, known: set[Decimal]) -> Markup:
    """`text` escaped as HTML, each number wrapped in <span class="verified|unverified">."""
    pieces, last = [], 0
    for match in NUMBER.finditer(text):
        pieces.append(escape(text[last : match.start()]))
        value = _value(match.group())
        state = "verified" if value is not None and value.normalize() in known else "unverified"
        title = "" if state == "verified" else ' title="not found in the data"'
        pieces.append(Markup(f'<span class="{state}"{title}>{escape(match.group())}</span>'))
        last = match.end()
    pieces.append(escape(text[last:]))
    return Markup("").join(pieces)
