"""A finding's figures by role: how each is written, the words that name it, and placeholders filled in.

The narrative never carries a figure the model typed. A sentence names a figure by its role, as a
placeholder (`{difference}`, `[closing]`), and the template writes the value from the finding's own
named fields (checks.Figures.roles). The summary has roles of its own (how many findings, how many
high ones, the period). Cue words tie a role to how a sentence names it ("the bank shows {...}",
"the discrepancy is {...}"), so a placeholder or a number in another role's place is caught
(app/review/verify.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import date
from decimal import Decimal
from typing import Any

from markupsafe import Markup, escape

from nightshift.app.review.checks import Percent

# {role} or [role]: how a sentence names a figure.
PLACEHOLDER = re.compile(r"[{\[]\s*([A-Za-z][A-Za-z_]*)\s*[}\]]")
WORDS = re.compile(r"[^\W\d_]+(?:'s)?")

# Words that name a role whatever the finding (the source names are added per finding).
CUES: dict[str, tuple[str, ...]] = {
    "difference": ("difference", "differs", "differ", "discrepancy", "gap", "unexplained", "mismatch", "variance"),
    "opening": ("opening",),
    "closing": ("closing",),
    "movements": ("movement", "movements"),
    "expected": ("expected",),
    "threshold": ("threshold", "limit"),
    "extra": ("twice", "double", "doubled", "duplicated", "overstated"),
    "change": ("change", "changed"),
    "high": ("high",),
    "medium": ("medium",),
    "low": ("low",),
}
Roles = Mapping[str, Any]


def kind_of(value: Any) -> str:
    """What a role's value is: an amount, a percent, a count, a date, or a name (a reference, a source)."""
    if isinstance(value, Percent):
        return "percent"
    if isinstance(value, Decimal):
        return "amount"
    if isinstance(value, int) and not isinstance(value, bool):
        return "count"
    return "date" if isinstance(value, date) else "name"


def written(value: Any) -> str:
    """A role's value as the report writes it: amounts signed with thousands, percentages rounded, dates ISO."""
    if isinstance(value, Percent):
        return f"{value.quantize(Decimal('1')):,}%"
    if isinstance(value, Decimal | int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


def stem(word: str) -> str:
    """A word lower case, a possessive and a plural's s dropped: "bank's" and "banks" find "bank"."""
    word = word.lower().removesuffix("'s")
    return word[:-1] if word.endswith("s") and len(word) > 4 else word


def cues(roles: Roles) -> dict[str, str]:
    """Word stem -> the role it names, for this finding: the fixed cues and its sources' and groups' names.

    A source that holds an amount of the finding names that amount ("bank" the bank's amount); a source
    the finding says lacks the row (`other` of an unmatched row) names `missing`, an amount the finding
    does not have, so an amount after it is in the wrong place.
    """
    named = {stem(word): role for role, words in CUES.items() if role in roles for word in words}
    by_source = {"left": "left_amount", "right": "right_amount", "source": _source_figure(roles), "other": "missing"}
    if "other_total" in roles:
        by_source["other"] = "other_total"
    for role, target in by_source.items():
        if isinstance(roles.get(role), str) and target:
            named.update({stem(word): target for word in WORDS.findall(roles[role])})
    return named


def _source_figure(roles: Roles) -> str | None:
    return next((role for role in ("total", "amount") if role in roles), None)


def fill(text: str, roles: Roles) -> Markup:
    """`text` as HTML with every placeholder replaced by its role's value, marked as placed (figures underlined).

    Every placeholder must name a role (the gate has refused any other sentence)."""
    pieces, last = [], 0
    for match in PLACEHOLDER.finditer(text):
        role = match.group(1)
        shown = escape(written(roles[role]))
        marked = "verified" if kind_of(roles[role]) != "name" else "name"
        pieces += [escape(text[last : match.start()]),
                   Markup(f'<span class="{marked}" title="placed from the finding: {role}">{shown}</span>')]  # fmt: skip
        last = match.end()
    pieces.append(escape(text[last:]))
    return Markup("").join(pieces)


def filled(text: str, roles: Roles) -> str:
    """`text` with every placeholder replaced by its role's value, as plain text."""
    return PLACEHOLDER.sub(lambda match: written(roles[match.group(1)]), text)


def with_names(text: str, roles: Roles) -> str:
    """`text` with the placeholders of names without digits written out (a prompt: the model may copy
    "Northwind Insurance" but must name INV-5010 and every figure by role)."""

    def name(match: re.Match) -> str:
        value = roles.get(match.group(1))
        return value if isinstance(value, str) and not re.search(r"\d", value) else match.group()

    return PLACEHOLDER.sub(name, text)
