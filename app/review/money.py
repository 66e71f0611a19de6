"""Exact amounts: parsed strictly in their declared format and held as integers of minor units, never floats.

Parsing is strict because a wrong figure that looks right is the worst failure
a review can have: `1234,56` with decimal "." and thousands "," is an error, not
123,456.00. An amount must fit its source's `AmountFormat` (decimal and
thousands characters, digit grouping, sign forms, currency); anything else
(exponents, NaN, misplaced separators, another currency) is refused with the
value. The grammar is a regular expression built from the declared format.
Babel supplies the locale data behind it (a `locale`'s separators and grouping,
a currency's symbols and minor-unit digits); its own `parse_decimal(strict=True)`
is not the parser because it accepts `1e5`, `NaN` and `1.23457E+11`, knows no
parentheses, trailing minus or currency, and takes separators only from a locale.

Integers keep sums exact and let numpy do the arithmetic on a million rows. One
amount is below 10**18 units, but a sum of many can pass int64's 2**63 (ten
amounts near the limit do), and numpy wraps around without a word; `exact_sum`
and `exact_group_sums` return Python ints that are always right.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property
from typing import TYPE_CHECKING

from nightshift.app.review.errors import ReviewError

if TYPE_CHECKING:  # numpy is imported where arrays are summed: reading schedules (review list, jobs) needs none
    import numpy as np

MAX_TEXT = 200  # characters an amount's text may have, spaces and currency included
UNITS_LIMIT = 10**18  # an amount's units stay below this: 17 digits with the decimals, held in int64
INT64_LIMIT = 2**63
_LOW_BITS = 32
_CHUNK = 1 << 30  # rows per partial sum when split: 2**30 * 2**32 < 2**63

GROUPINGS = {"standard": (3, 3), "indian": (3, 2)}  # digits in the last group, then in each group before it
NEGATIVE_FORMS = ("leading", "trailing", "parentheses")  # -1.00, 1.00-, (1.00)
_MINUS = "-\u2212"  # hyphen-minus and the minus sign
_SPACES = " \u00a0\u202f\u2009"  # space, no-break, narrow no-break, thin: one thousands separator when spaces are
_CURRENCY_LOCALES = ("en", "en_IN", "de_CH")  # where a code's common symbols come from (€, $, £, ₹, ¥, CHF...)


def currency_digits(code: str) -> int:
    """The minor-unit digits of an ISO 4217 currency (EUR 2, JPY 0, BHD 3), from Babel's CLDR data."""
    from babel.numbers import get_currency_precision, is_currency

    if not is_currency(code):
        raise ReviewError(f"{code!r} is not an ISO 4217 currency code like EUR, USD, JPY")
    return get_currency_precision(code)


def locale_format(name: str) -> tuple[str, str, tuple[int, int]]:
    """A locale's (decimal, thousands, grouping) in its own numbering system, from Babel's CLDR data.

    en_IN -> ('.', ',', (3, 2)); ar_EG -> ('٫', '٬', (3, 3)), written with Arabic-Indic digits.
    """
    from babel import Locale, UnknownLocaleError
    from babel.numbers import get_decimal_symbol, get_group_symbol

    try:
        locale = Locale.parse(name)
    except (UnknownLocaleError, ValueError):
        raise ReviewError(f'unknown locale {name!r}; use a CLDR name like "de_DE", "fr_CH" or "en_IN"') from None
    pattern = locale.decimal_formats[None]
    native = {"numbering_system": "default"}  # the locale's own symbols, not those of its Latin digits
    symbols = get_decimal_symbol(locale, **native), get_group_symbol(locale, **native)
    return *symbols, (pattern.grouping[0], pattern.grouping[1])


def _currency_symbols(code: str) -> tuple[str, ...]:
    """Texts that mark an amount as `code`: the code and its symbols, longest first so "US$" goes before "$"."""
    from babel.core import UnknownLocaleError
    from babel.numbers import get_currency_symbol

    symbols = {code}
    for name in _CURRENCY_LOCALES:
        try:
            symbols.add(get_currency_symbol(code, name))
        except UnknownLocaleError:  # pragma: no cover - the listed locales ship with Babel
            continue
    return tuple(sorted(symbols, key=len, reverse=True))


@dataclass(frozen=True)
class AmountFormat:
    """How a source writes its amounts; anything that does not fit is an error, never a guess.

    `grouping` is (last group, earlier groups): (3, 3) for 1,234,567, (3, 2) for Indian 12,34,567.
    A number may also be written without any thousands character. `negative` lists the sign forms
    the source uses; `currency` (ISO code) lets its code and symbols stand before or after the number.
    """

    decimal: str = "."
    thousands: str = ""
    grouping: tuple[int, int] = (3, 3)
    negative: tuple[str, ...] = ("leading", "parentheses")
    currency: str | None = None
    symbols: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if len(self.decimal) != 1 or self.decimal.isdigit() or self.decimal in _MINUS + "+()":
            raise ReviewError(f"decimal {self.decimal!r} should be one character that is not a digit or a sign")
        if len(self.thousands) > 1 or self.thousands.isdigit() or (self.thousands and self.thousands in _MINUS + "+()"):
            raise ReviewError(f"thousands {self.thousands!r} should be one character (or none), not a digit or sign")
        if self.thousands == self.decimal or (self.thousands in _SPACES and self.decimal in _SPACES):
            raise ReviewError(f"decimal and thousands are both {self.decimal!r}; they must differ")
        if unknown := [form for form in self.negative if form not in NEGATIVE_FORMS]:
            raise ReviewError(f"negative forms {unknown} unknown; use some of {', '.join(NEGATIVE_FORMS)}")
        if self.currency is not None and not self.symbols:
            object.__setattr__(self, "symbols", _currency_symbols(self.currency))

    @cached_property
    def pattern(self) -> re.Pattern[str]:
        """The whole amount in one expression: parentheses, a sign, the currency, the number, a trailing sign.

        Which of the optional parts may appear together is decided in `parse_amount`; the number is
        digits, optionally grouped by `thousands` (a group of `last` digits, groups of `before` ahead of
        it), then `decimal` and the fraction.
        """
        last, before = self.grouping
        integer = r"\d+"
        if self.thousands:
            sep = f"[{re.escape(_SPACES)}]" if self.thousands in _SPACES else re.escape(self.thousands)
            integer = rf"(?:\d{{1,{before}}}(?:{sep}\d{{{before}}})*{sep}\d{{{last}}}|\d+)"
        currency = "|".join(map(re.escape, self.symbols)) or "(?!)"
        number = rf"(?P<integer>{integer})(?:{re.escape(self.decimal)}(?P<fraction>\d+))?"
        return re.compile(
            rf"\s*(?P<open>\()?\s*(?P<c1>{currency})?\s*(?P<lead>[+{re.escape(_MINUS)}])?\s*(?P<c2>{currency})?\s*{number}"
            rf"\s*(?P<trail>[{re.escape(_MINUS)}])?\s*(?P<c3>{currency})?\s*(?P<close>\))?\s*"
        )

    @cached_property
    def leading(self) -> bool:
        return "leading" in self.negative

    @cached_property
    def separators(self) -> dict[int, None]:
        """str.translate's table that drops thousands characters from the integer part."""
        return dict.fromkeys(map(ord, _SPACES if self.thousands in _SPACES else self.thousands))

    def describe(self) -> str:
        shown = f"decimal {self.decimal!r}, thousands {self.thousands!r}" if self.thousands else (
            f"decimal {self.decimal!r}, no thousands separator")  # fmt: skip
        if self.grouping != (3, 3):
            shown += f", groups of {self.grouping[1]} then {self.grouping[0]}"
        return shown


PLAIN = AmountFormat()


def _refuse(text: str, fmt: AmountFormat) -> ReviewError:
    """Why `text` is not an amount, as precisely as can be said."""
    rest = text.strip()
    if not rest:
        return ReviewError("empty amount")
    if re.fullmatch(r"[-+]?[\d.,]+[eE][-+]?\d+", rest):
        return ReviewError(f"{text!r} is in exponent notation, which has lost digits (Excel writes long numbers so); "
                           "export the column as numbers with every digit")  # fmt: skip
    if any(unicodedata.category(c) == "Sc" for c in rest) or re.search(r"[A-Z]{3}", rest):
        declared = f"the source's currency is {fmt.currency}" if fmt.currency else "declare the source's `currency`"
        return ReviewError(f"{text!r} carries a currency sign or code the source does not expect ({declared})")
    return ReviewError(f"{text!r} is not an amount in the source's format ({fmt.describe()})")


def parse_amount(text: str, scale: int, fmt: AmountFormat = PLAIN) -> int:
    """`text` ("1.234,56" with decimal="," thousands=".") as an integer of 10**-scale units.

    Raises ReviewError when the text does not fit `fmt` or has more decimals than `scale`.
    """
    if len(text) > MAX_TEXT:  # int() refuses over 4,300 digits with a ValueError; no amount is this long
        raise ReviewError(f"{text[:40]!r}... ({len(text):,} characters) is too long to be an amount")
    found = fmt.pattern.fullmatch(text)
    if found is None:
        raise _refuse(text, fmt)
    opened, c1, lead, c2, integer, fraction, trail, c3, closed = found.groups()
    plain_sign = lead is None or lead == "+" or fmt.leading  # the common case, decided without a call
    if (opened or trail or closed or c1 or c2 or c3 or not plain_sign) and not _signs_fit(
            fmt, opened, lead, trail, closed, (c1, c2, c3)):  # fmt: skip
        raise _refuse(text, fmt)
    digits = integer.translate(fmt.separators) if fmt.thousands else integer
    if fraction is None:
        fraction = ""
    elif len(fraction) > scale and int(fraction[scale:]):
        raise ReviewError(f"{text!r} has more than {scale} decimals; set `decimals` in the source to match the data")
    units = int(digits + fraction[:scale].ljust(scale, "0"))  # int() reads every script's digits (Arabic-Indic too)
    if units >= UNITS_LIMIT:
        raise ReviewError(f"{text!r} is too large an amount (at most 17 digits with the decimals)")
    return -units if opened or (lead or trail or "+") in _MINUS else units


def _signs_fit(fmt: AmountFormat, opened: str | None, lead: str | None, trail: str | None, closed: str | None,
               currencies: tuple[str | None, ...]) -> bool:  # fmt: skip
    """At most one sign and one currency, each in a form the source declared: (€5.00), -€5.00, 5,00- EUR."""
    if bool(opened) != bool(closed) or sum(map(bool, (opened, lead, trail))) > 1 or sum(map(bool, currencies)) > 1:
        return False
    return ((not opened or "parentheses" in fmt.negative) and (not trail or "trailing" in fmt.negative)
            and (lead in (None, "+") or "leading" in fmt.negative))  # fmt: skip


def check_units(units: int) -> int:
    """An amount already in minor units (an INTEGER column), refused like a parsed one when int64 cannot hold it."""
    if abs(units) >= UNITS_LIMIT:
        raise ReviewError(f"{units} is too large an amount (at most 18 digits of minor units)")
    return units


def _parts(units: np.ndarray) -> Iterator[tuple[slice, np.ndarray, int]]:
    """`units` as (rows, part, shift) whose int64 sums cannot overflow; the parts, shifted back, add up to it.

    When the largest amount times the rows fits in int64 that is `units` itself; otherwise each
    amount is split into its high and low 32 bits, which sum safely over 2**30 rows at a time.
    """
    if len(units) == 0:
        return
    peak = max(abs(int(units.max())), abs(int(units.min())))
    if peak * len(units) < INT64_LIMIT:
        yield slice(None), units, 0
        return
    for start in range(0, len(units), _CHUNK):
        rows = slice(start, start + _CHUNK)
        yield rows, units[rows] >> _LOW_BITS, _LOW_BITS  # arithmetic shift: floor, so negative amounts work
        yield rows, units[rows] & ((1 << _LOW_BITS) - 1), 0


def exact_sum(units: np.ndarray) -> int:
    """The sum of int64 minor units as a Python int, exact however many and however large."""
    return sum((int(part.sum()) << shift for _, part, shift in _parts(units)), 0)


def exact_group_sums(units: np.ndarray, groups: np.ndarray, count: int) -> list[int]:
    """Sums of `units` per group (`groups` holds each row's group number, 0 to count - 1), exact like `exact_sum`."""
    import numpy as np

    totals = [0] * count
    for rows, part, shift in _parts(units):
        sums = np.zeros(count, dtype=np.int64)
        np.add.at(sums, groups[rows], part)
        totals = [total + (int(s) << shift) for total, s in zip(totals, sums.tolist())]
    return totals


def to_decimal(units: int, scale: int) -> Decimal:
    return Decimal(int(units)).scaleb(-scale)


def format_amount(units: int, scale: int) -> str:
    """1234567 at scale 2 -> '12,345.67' (how reports and prompts show amounts)."""
    return f"{to_decimal(units, scale):,.{scale}f}"
