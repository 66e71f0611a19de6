"""Where a report's own phrases may break across lines: never between a figure and its unit, never after a
short word, never before a short phrase that ends its clause ("has no counterpart / in ledger").

Applied to the text nightshift writes (findings, their rows, checks that could not run), not to the model's.
A no-break space (U+00A0) keeps two words on one line; WeasyPrint breaks only at the spaces left.
"""

from __future__ import annotations

import re

NBSP = "\u00a0"
SHORT = "a|an|the|in|of|on|at|to|by|per|for|from|no|not|within|with|and|or"
UNITS = r"%|days?|rows?|tokens?|s|ms|MB|GB|tok/s|tokens/s"
AFTER_SHORT = re.compile(rf"\b({SHORT}) (?=\S)", re.IGNORECASE)  # a short word keeps the next one
FIGURE_UNIT = re.compile(rf"(\d) (?=(?:{UNITS})(?![\w/]))")  # 3 days, 98.6 %, 141 MB
# "counterpart in ledger": a short word and the clause's last word stay with the word before them
CLAUSE_END = re.compile(rf"([^ ]+) ((?:{SHORT}){NBSP}[^ ,.;:(]+)(?= *(?:[(,.;:]|$))", re.IGNORECASE)


def tie(text: object) -> str:
    """`text` with no-break spaces where a line must not break (see the module's docstring)."""
    said = str(text)
    said = FIGURE_UNIT.sub(rf"\1{NBSP}", said)
    said = AFTER_SHORT.sub(rf"\1{NBSP}", said)
    return CLAUSE_END.sub(rf"\1{NBSP}\2", said)
