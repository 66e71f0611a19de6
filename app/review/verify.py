"""Every figure in a sentence, bound to the role the sentence gives it, and the sentence rebuilt with placeholders.

"Verified" means the right figure in the right role, not a number that occurs somewhere in the data:
"the bank shows -1,853.55" is wrong when -1,853.55 is the ledger's amount, however true the number.
A sentence is read clause by clause (split at `;`, `:`, `, `, `and`, `but`, a dash). A cue word
(app/review/roles.py: "bank", "ledger", "opening", "discrepancy", "threshold"...) names the role of the
next figure after it in its clause. Each figure is then

- a placeholder (`{difference}`): it must name a role of the sentence's finding, and when a cue names
  another figure's role ("the bank shows {right_amount}") the sentence is refused as misattributed;
- a number the model typed (where digits were not blocked while decoding): read with its kind (an
  amount, a percentage, a count, a date, an identifier such as INV-5010), it must equal the value of the
  role its cue names, or, without a cue, of one role of the finding; it is then replaced by that
  role's placeholder, so the template writes the figure and the model's digits never reach the report.

Kinds never mix: an amount matches an amount (a written sign must be the figure's sign; a number
written without one is a size; 1,480 is 1,480.00 but 1,918 is not 1,918.40), a whole number may be a
count, a percentage matches a percentage rounded to the decimals written (261% for 260.9375), a date
only a whole date (or a day and month of one), an identifier only a name of the finding. Anything else
with digits (10k, 1st, a figure of another finding) refuses the sentence.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import date
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from nightshift.app.review.checks import Percent
from nightshift.app.review.roles import PLACEHOLDER, WORDS, kind_of, stem, written

MONTH_NAMES = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
               "november", "december")  # fmt: skip
MONTHS = {name: n for n, full in enumerate(MONTH_NAMES, start=1) for name in {full, full[:3], full[:4]}}
_MONTH = "|".join(sorted(MONTHS, key=len, reverse=True))
UNITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]  # fmt: skip
TENS = {
    word: 10 * n
    for n, word in enumerate(["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"])
    if n > 1
}
SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}
_WORD = "|".join(sorted([*UNITS, *TENS, *SCALES], key=len, reverse=True))
_ORDINAL = r"(?:st|nd|rd|th)?"
TOKEN = re.compile(
    rf"""
    (?P<iso>\b\d{{4}}-\d{{2}}-\d{{2}}\b)
   |(?P<week>\b\d{{4}}-W\d{{2}}\b)
   |(?P<dmy>\b\d{{1,2}}[./]\d{{1,2}}[./]\d{{4}}\b)
   |(?P<daymonth>\b\d{{1,2}}{_ORDINAL}\s+(?:of\s+)?(?:{_MONTH})\b(?:\.?,?\s+\d{{4}}\b(?!-))?)
   |(?P<monthyear>\b(?:{_MONTH})\b\.?\s+\d{{4}}\b)
   |(?P<monthday>\b(?:{_MONTH})\b\.?\s+\d{{1,2}}{_ORDINAL}\b(?:,?\s+\d{{4}}\b(?!-))?)
   |(?P<ident>\b[A-Za-z]+[-_/]?\d[\w\-/]*)
   |(?P<number>(?<![\w.,])(?P<sign>[-+\u2212]\s?)?(?P<currency>(?:[€$£]|\b(?:EUR|USD|GBP|CHF)\s?))?
        (?P<sign2>[-+\u2212])?(?P<open>\()?
        (?P<digits>\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?|\d{{1,3}}(?:\.\d{{3}})+,\d+|\d+(?:\.\d+)?)
        (?P<close>(?(open)\)|))(?P<percent>\s?%|\s?per\s?cent\b|\s?percent\b)?(?![\w])(?!\.\d))
   |(?P<words>\b(?:{_WORD})(?:(?:\s+and\s+|\s+|-)(?:{_WORD}))*\b)
   |(?P<other>\d[\w.,/\-]*)
    """,
    re.IGNORECASE | re.VERBOSE,
)
TAG = re.compile(r"^F(\d+)$", re.IGNORECASE)
CLAUSE = re.compile(
    r";|:\s|,\s|(?<!hundred)(?<!thousand)(?<!million)\s(?:and|but|while|whereas|whilst)\s|\s[-\u2013\u2014]\s"
)


@dataclass
class Token:
    text: str
    start: int
    end: int
    kind: str  # amount, percent, date, daymonth, month, week, ident, words, other
    value: object = None
    sign: int | None = None  # -1, +1 when written; None for a bare number
    decimals: int = 0
    whole: bool = False  # written without decimals (may be a count)


def _decimal(digits: str) -> Decimal | None:
    if re.fullmatch(r"\d{1,3}(?:\.\d{3})+,\d+", digits):
        digits = digits.replace(".", "").replace(",", ".")
    try:
        return Decimal(digits.replace(",", ""))
    except InvalidOperation:
        return None


def _words_value(text: str) -> int | None:
    """'one thousand four hundred and eighty' -> 1480; None when the words do not form a number."""
    total, current = 0, 0
    for word in re.split(r"[\s\-]+", text.lower()):
        if word == "and":
            continue
        if word in UNITS:
            current += UNITS.index(word)
        elif word in TENS:
            current += TENS[word]
        elif word == "hundred":
            current = (current or 1) * 100
        elif word in SCALES:
            total, current = total + (current or 1) * SCALES[word], 0
        else:
            return None
    return total + current


def _date(year: int, month: int, day: int) -> date | None:
    try:
        return date(year, month, day)
    except ValueError:
        return None


def _tokens(text: str) -> Iterator[Token]:
    for match in TOKEN.finditer(text):
        kind, raw, start, end = match.lastgroup, match.group(), match.start(), match.end()
        if match.group("number"):
            yield _number(match)
            continue
        token = Token(raw, start, end, kind or "other")
        digits = [int(part) for part in re.findall(r"\d+", raw)]
        month = next((MONTHS[word.lower()] for word in re.findall(r"[A-Za-z]+", raw) if word.lower() in MONTHS), None)
        if kind == "iso":
            token.kind, token.value = "date", _date(*digits)
        elif kind == "dmy":  # day first (as the sample's bank writes dates); month first is tried too
            token.kind, token.value = "date", (_date(digits[2], digits[1], digits[0]), _date(digits[2], *digits[:2]))
        elif kind in ("daymonth", "monthday"):
            year = next((n for n in digits if n > 31), None)
            day = next(n for n in digits if n <= 31)
            token.kind = "date" if year else "daymonth"
            token.value = _date(year, month, day) if year else (month, day)
        elif kind == "monthyear":
            token.kind, token.value = "month", (digits[0], month)
        elif kind == "words":
            if raw.lower() == "one":  # "one" alone is mostly a pronoun ("only one is genuine")
                continue
            value = _words_value(raw)
            token.kind, token.value, token.whole = (
                ("amount", Decimal(value), True) if value is not None else ("other", None, False)
            )
        yield token


def _number(match: re.Match) -> Token:
    value = _decimal(match.group("digits"))
    signs = (match.group("sign") or "").strip() + (match.group("sign2") or "")
    negative = "-" in signs or "\u2212" in signs or bool(match.group("open") and match.group("close"))
    sign = -1 if negative else (1 if "+" in signs else None)
    decimals = len(match.group("digits").rsplit(".", 1)[1]) if "." in match.group("digits") and "," not in (
        match.group("digits").rsplit(".", 1)[1]) else 0  # fmt: skip
    kind = "percent" if match.group("percent") else "amount"
    if value is None:
        kind = "other"
    elif sign == -1:
        value = -value
    whole = "." not in match.group("digits") and not re.search(r",\d{1,2}$", match.group("digits"))
    return Token(match.group(), match.start(), match.end(), kind, value, sign, decimals, whole)


def _percent_matches(written: Decimal, decimals: int, sign: int | None, exact: Decimal) -> bool:
    if sign is not None and (written < 0) != (exact < 0):
        return False
    step = Decimal(1).scaleb(-decimals)
    return any(
        abs(exact).quantize(step, rounding=rounding) == abs(written) for rounding in (ROUND_HALF_UP, ROUND_HALF_EVEN)
    )


def matches(token: Token, value: Any) -> bool:
    """Whether the number `token` states `value`, of the same kind (and sign, where one is written)."""
    if isinstance(value, Percent):
        return token.kind == "percent" and _percent_matches(token.value, token.decimals, token.sign, value)
    if isinstance(value, str):  # a name: INV-5010, the period's label (October 2026, 2026-W44, 2026-10-30)
        return " ".join(token.text.split()).lower() == value.lower()
    if isinstance(value, bool) or token.kind not in ("amount", "date", "daymonth"):
        return False
    if isinstance(value, int):
        return token.kind == "amount" and token.whole and token.value == value
    if isinstance(value, Decimal):
        return token.kind == "amount" and (
            abs(token.value) == abs(value) if token.sign is None else token.value == value
        )
    if isinstance(value, date):
        if token.kind == "daymonth":
            return token.value == (value.month, value.day)
        readings = token.value if isinstance(token.value, tuple) else (token.value,)
        return token.kind == "date" and value in readings
    return False


@dataclass(frozen=True)
class Problem:
    """Why a sentence cannot stand: `reason` a key of gate.REASONS, `detail` what was wrong in it."""

    reason: str
    detail: str


def placed(
    sentence: str, roles: Mapping[str, Any], cues: Mapping[str, str], tags: int = 0
) -> tuple[str, Problem | None]:
    """`sentence` with every figure as its role's placeholder, or the first figure that is not its role's.

    `roles` are the figures the sentence may state (its finding's, or the summary's), `cues` the words that
    name them (roles.cues), `tags` how many findings there are (F1..F`tags` may be named as such).
    """
    sentence = re.sub(
        r"[$€£]\s?(?=[{\[])", "", _names_as_placeholders(sentence, roles)
    )  # the template writes amounts bare
    out, last = [], 0
    for clause, start in _clauses(sentence):
        rebuilt, problem = _placed_clause(clause, roles, cues, tags)
        if problem is not None:
            return sentence, problem
        out.append(sentence[last:start] + rebuilt)
        last = start + len(clause)
    text = "".join(out) + sentence[last:]
    stray = re.search(r"\d", PLACEHOLDER.sub("", _without_tags(text, tags)))
    if stray:
        return text, Problem("unplaced", f"a digit the template did not place ({text[stray.start() :][:12]!r})")
    return text, None


def _names_as_placeholders(sentence: str, roles: Mapping[str, Any]) -> str:
    """Names with digits that are not one token (a description "Invoice 4711 ACME") written out as their
    placeholders, the longest first; INV-5010 or October 2026 are read as tokens (`matches`)."""
    names = sorted(((role, value) for role, value in roles.items() if isinstance(value, str)
                    and re.search(r"\d", value) and [t.text for t in _tokens(value)] != [value]),
                   key=lambda item: -len(item[1]))  # fmt: skip
    for role, value in names:
        sentence = re.sub(rf"(?<![\w-]){re.escape(value)}(?![\w-])", "{" + role + "}", sentence, flags=re.IGNORECASE)
    return sentence


def _clauses(sentence: str) -> Iterator[tuple[str, int]]:
    last = 0
    for match in CLAUSE.finditer(sentence):
        yield sentence[last : match.start()], last
        last = match.end()
    yield sentence[last:], last


def _placed_clause(
    clause: str, roles: Mapping[str, Any], cues: Mapping[str, str], tags: int
) -> tuple[str, Problem | None]:
    """One clause rebuilt: each figure bound to the role of the last cue before it, else by its value.

    A cue binds the next figure of its role's kind ("the closing balance on {closing_date} is {closing}":
    `closing` passes the date by and binds the amount); a figure of that kind in another role is misattributed.
    """
    holders = [(m.start(), m.end(), "holder", m) for m in PLACEHOLDER.finditer(clause)]
    taken = [(start, end) for start, end, _, _ in holders]
    numbers = [(t.start, t.end, "number", t) for t in _tokens(clause)
               if t.kind != "other" or re.search(r"\d", t.text)]  # fmt: skip
    numbers = [n for n in numbers if not any(s < n[1] and n[0] < e for s, e in taken)]
    words = [
        (m.start(), m.end(), "cue", cues[stem(m.group())]) for m in WORDS.finditer(clause) if stem(m.group()) in cues
    ]
    words = [w for w in words if not any(s < w[1] and w[0] < e for s, e, _, _ in holders + numbers)]
    pending: str | None = None
    replaced: list[tuple[int, int, str]] = []
    for start, end, kind, item in sorted(holders + numbers + words, key=lambda event: event[0]):
        if kind == "cue":
            pending = item
            continue
        if kind == "holder":
            role = item.group(1)
            if role not in roles:
                return clause, Problem("placeholder", f"{item.group()} names no figure of what it is about")
            candidates, shown = [role], item.group()
        elif item.kind == "ident" and TAG.match(item.text) and 1 <= int(TAG.match(item.text).group(1)) <= tags:
            continue
        else:
            candidates = sorted((role for role, value in roles.items() if matches(item, value)),
                                key=lambda role: written(roles[role]) != item.text.lstrip("+"))  # fmt: skip
            if not candidates:
                return clause, Problem("unplaced", f"{item.text} is no figure of what it is about")
            shown = item.text
        figure_kind = kind_of(roles[candidates[0]])
        if pending is not None and figure_kind != "name" and kind_of(roles.get(pending, Decimal(0))) == figure_kind:
            if pending not in candidates:
                return clause, Problem("misattributed", f"{shown} where the sentence names {pending}")
            candidates, pending = [pending], None
        if kind == "number":
            replaced.append((start, end, candidates[0]))
    for start, end, role in reversed(replaced):
        clause = clause[:start] + "{" + role + "}" + clause[end:]
    return clause, None


def _without_tags(text: str, tags: int) -> str:
    return re.sub(r"\bF(\d+)\b", lambda m: "" if 1 <= int(m.group(1)) <= tags else m.group(), text)
