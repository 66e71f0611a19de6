"""Checks every number the model writes against the figures of what it is talking about.

Why checking, not placeholders: a small model asked to write `{F3.amount}`
instead of a figure still writes figures (it copies them from the prompt, and
sometimes invents them), so every figure it writes must be checked in any
case; once that check is bound to meaning, a placeholder scheme adds nothing
but a new way to fail (a malformed tag). So the model writes plain text, and
every number in it is read with its kind and bound to a scope:

- a line `F3: ...` speaks of finding 3: its numbers verify only against that
  finding's own figures;
- a summary clause that names findings (their tag, reference, or a word of
  their label only they have, like "charges" for BANK CHARGES) verifies
  against those findings' figures; a clause that names none inherits its
  sentence's findings, and a sentence that names none verifies against every
  finding and table and the period's dates.

Kinds never mix: an amount matches an amount of the scope (a written sign
must be the figure's sign; a number written without one is a size and
matches either sign; decimals are compared as values, so 1,480 is 1,480.00
but 1,918 is not 1,918.40), a whole number may also be a count, a
percentage matches a percentage (rounded to the decimals written), a date
matches only as a whole date, a month only as a month of the period, an
identifier (INV-5010, F3) only as one of the scope's. Everything else (a
number in words that is not a figure, digits glued to letters, a number in
another format) is highlighted and counted. Text is HTML-escaped here, since
the model's output is untrusted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation

from markupsafe import Markup, escape

from nightshift.app.review.checks import Figures, Finding, SummaryTable
from nightshift.app.review.window import Window

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
TAG_LINE = re.compile(r"^\s*\**F(\d+)\**\s*[:.)-]", re.IGNORECASE)
SENTENCE = re.compile(r"(?<=[.!?])\s+")
CLAUSE = re.compile(
    r";|,\s|(?<!hundred)(?<!thousand)(?<!million)\s(?:and|but|while|whereas|whilst)\s|\s[-\u2013\u2014]\s"
)
WORD = re.compile(r"[a-z]{4,}")
# Words that say nothing about which finding a clause is about.
COMMON = frozenset(
    [
        "bank",
        "ledger",
        "balance",
        "balances",
        "statement",
        "amount",
        "amounts",
        "total",
        "totals",
        "with",
        "from",
        "that",
        "this",
        "have",
        "been",
        "were",
        "which",
        "their",
        "there",
        "should",
        "check",
        "review",
        "period",
        "month",
        "week",
        "account",
        "accounts",
        "payment",
        "payments",
        "row",
        "rows",
        "entry",
        "entries",
        "booked",
        "posted",
        "posting",
        "found",
        "differ",
        "differs",
        "difference",
        "identical",
        "counted",
        "twice",
        "opening",
        "closing",
        "movements",
        "against",
        "change",
        "issue",
        "issues",
        "finding",
        "findings",
    ]
)


@dataclass
class Scope:
    """Figures a number may be checked against: a finding's, several findings', or the whole review's."""

    amounts: set[Decimal] = field(default_factory=set)  # signed, normalised
    counts: set[int] = field(default_factory=set)
    percents: set[Decimal] = field(default_factory=set)  # exact
    dates: set[date] = field(default_factory=set)
    months: set[tuple[int, int]] = field(default_factory=set)
    weeks: set[str] = field(default_factory=set)
    identifiers: set[str] = field(default_factory=set)  # lower case

    def add(self, figures: Figures) -> Scope:
        self.amounts.update(amount.normalize() for amount in figures.amounts)
        self.counts.update(figures.counts)
        self.percents.update(figures.percents)
        self.dates.update(figures.dates)
        self.counts.update(day.year for day in figures.dates)
        for label in figures.labels:
            self.identifiers.update(match.group().lower() for match in re.finditer(r"[\w\-/]*\d[\w\-/]*", label))
        return self

    def merge(self, other: Scope) -> Scope:
        for name in ("amounts", "counts", "percents", "dates", "months", "weeks", "identifiers"):
            getattr(self, name).update(getattr(other, name))
        return self

    def add_text(self, text: str) -> Scope:
        """The figures written in a text of ours (a table cell, a title), read like the model's."""
        for token in _tokens(text):
            kind, value = token.kind, token.value
            if kind == "amount":
                self.amounts.add(value)
                if token.whole:
                    self.counts.add(int(abs(value)))
            elif kind == "percent":
                self.percents.add(abs(value) if token.sign is None else value)
            elif kind == "date":
                self.dates.add(value)
            elif kind == "ident":
                self.identifiers.add(token.text.lower())
        return self


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


def verified(token: Token, scope: Scope) -> bool:
    """Whether `token` states a figure of `scope`, of the same kind (and sign, when one is written)."""
    if token.kind == "amount":
        value = token.value.normalize()
        if token.sign is None:
            sized = value in scope.amounts or -value in scope.amounts
            return sized or (token.whole and value == value.to_integral_value() and int(value) in scope.counts)
        return value in scope.amounts or (token.sign == 1 and token.whole and int(value) in scope.counts)
    if token.kind == "percent":
        return any(_percent_matches(token.value, token.decimals, token.sign, exact) for exact in scope.percents)
    if token.kind == "date":
        readings = token.value if isinstance(token.value, tuple) else (token.value,)
        return any(reading in scope.dates for reading in readings if reading is not None)
    if token.kind == "daymonth":
        return token.value in {(day.month, day.day) for day in scope.dates}
    if token.kind == "month":
        return token.value in scope.months or token.value in {(day.year, day.month) for day in scope.dates}
    if token.kind == "week":
        return token.text.upper() in scope.weeks
    if token.kind == "ident":
        return token.text.lower() in scope.identifiers
    return False


@dataclass
class Checked:
    """One number of the narrative, where it is, and whether it states a figure of what it talks about."""

    text: str
    start: int
    end: int
    verified: bool


class Verifier:
    """Binds each number of a narrative to the findings it talks about and checks it against their figures."""

    def __init__(self, findings: list[Finding], general: Scope, period: Scope):
        self.findings, self.period = findings, period
        # A finding's own figures, and those its title states (a could-not-run finding's date, say).
        self.scopes = [Scope(identifiers={f"f{n}"}).add(f.figures).add_text(f.title) for n, f in enumerate(findings, 1)]
        self.general = general
        common = _stems(" ".join(COMMON)) | set(MONTHS)
        words: dict[str, set[int]] = {}
        for n, finding in enumerate(findings):
            for label in finding.figures.labels:
                for word in _stems(label) - common:
                    words.setdefault(word, set()).add(n)
        # A word of one finding's labels only ("charges", "insurance"), or a finding's tag or identifiers.
        self.keys = [
            {word for word, owners in words.items() if owners == {n}} | self.scopes[n].identifiers
            for n in range(len(findings))
        ]

    def _bound(self, clause: str) -> set[int]:
        present = _stems(clause) | {m.group().lower() for m in re.finditer(r"[\w\-/]*\d[\w\-/]*", clause)}
        return {n for n, keys in enumerate(self.keys) if keys & present}

    def _scope(self, bound: set[int]) -> Scope:
        # The periods' months, weeks and years are about the review, whatever the line talks about;
        # their first and last days are not a finding's dates.
        scope = Scope(identifiers={f"f{n}" for n in range(1, len(self.findings) + 1)}).merge(self.period)
        scope.dates = set()
        for n in bound:
            scope.merge(self.scopes[n])
        return scope

    def check(self, text: str) -> list[Checked]:
        """Every number in `text`, in order, verified or not."""
        out: list[Checked] = []
        at = 0
        for line in text.splitlines(keepends=True):
            tag = TAG_LINE.match(line)
            if tag:
                number = int(tag.group(1))
                scope = self._scope({number - 1}) if 1 <= number <= len(self.findings) else self.period
                out.extend(self._checked(line[tag.end() :], at + tag.end(), scope))
            else:
                self._check_line(line, at, out)
            at += len(line)
        return out

    def _check_line(self, line: str, at: int, out: list[Checked]) -> None:
        for sentence, sentence_at in _pieces(line, SENTENCE, at):
            clauses = list(_pieces(sentence, CLAUSE, sentence_at))
            bound = [self._bound(clause) for clause, _ in clauses]
            everywhere = set().union(*bound)
            for (clause, clause_at), mine in zip(clauses, bound):
                findings = mine or everywhere
                scope = self._scope(findings) if findings else self.general
                out.extend(self._checked(clause, clause_at, scope))

    @staticmethod
    def _checked(text: str, at: int, scope: Scope) -> Iterator[Checked]:
        for token in _tokens(text):
            yield Checked(token.text, at + token.start, at + token.end, verified(token, scope))

    def comment(self, number: int, text: str) -> list[Checked]:
        """The numbers of the model's line on finding `number` (its text after the tag), against that finding."""
        scope = self._scope({number - 1}) if 1 <= number <= len(self.findings) else self.period
        return list(self._checked(text, 0, scope))


def _stems(text: str) -> set[str]:
    """The words of `text` (four letters or more), lower case, a plural's s dropped: "charge" finds "CHARGES"."""
    return {word[:-1] if word.endswith("s") and len(word) > 4 else word for word in WORD.findall(text.lower())}


def _pieces(text: str, separator: re.Pattern, at: int) -> Iterator[tuple[str, int]]:
    last = 0
    for match in separator.finditer(text):
        yield text[last : match.start()], at + last
        last = match.end()
    yield text[last:], at + last


def mark(text: str, numbers: Iterable[Checked]) -> Markup:
    """`text` escaped as HTML, each number wrapped in <span class="verified|unverified">."""
    pieces, last = [], 0
    for number in numbers:
        pieces.append(escape(text[last : number.start]))
        state = "verified" if number.verified else "unverified"
        title = "" if number.verified else ' title="not a figure of what it is about"'
        pieces.append(Markup(f'<span class="{state}"{title}>{escape(number.text)}</span>'))
        last = number.end
    pieces.append(escape(text[last:]))
    return Markup("").join(pieces)


def period_scope(window: Window, previous: Window) -> Scope:
    """The reviewed period's and the previous one's first and last days, years, months and labels."""
    scope = Scope()
    for period in (window, previous):
        scope.dates.update((period.start, period.end))
        scope.counts.update((period.start.year, period.end.year))
        scope.months.update(((period.start.year, period.start.month), (period.end.year, period.end.month)))
        scope.weeks.add(period.label.upper())
    return scope


def review_scope(
    findings: list[Finding], tables: list[SummaryTable], period: Scope, counts: Iterable[int] = ()
) -> Scope:
    """The whole review's figures: every finding's, every table cell's, the periods', and `counts`."""
    scope = Scope(counts=set(counts) | {len(findings)}).merge(period)
    for finding in findings:
        scope.add(finding.figures).add_text(finding.title)
    for table in tables:
        for row in table.rows:
            for cell in row:
                scope.add_text(cell)
    return scope


def verifier_for(findings: list[Finding], tables: list[SummaryTable], window: Window, previous: Window,
                 counts: Iterable[int] = ()) -> Verifier:  # fmt: skip
    """A review's verifier: findings' own figures for the lines about them, the review's for the rest."""
    period = period_scope(window, previous)
    return Verifier(findings, review_scope(findings, tables, period, counts), period)
