"""Exact amounts: parsed as decimals and held as integers of minor units (cents), never floats.

Integers keep sums exact and let numpy do the arithmetic on a million rows. One
amount is below 10**18 units, but a sum of many can pass int64's 2**63 (ten
amounts near the limit do), and numpy wraps around without a word; `exact_sum`
and `exact_group_sums` return Python ints that are always right.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from nightshift.app.review.errors import ReviewError

if TYPE_CHECKING:  # numpy is imported where arrays are summed: reading schedules (review list, jobs) needs none
    import numpy as np

UNITS_LIMIT = 10**18  # an amount's units stay below this: 17 digits with the decimals, held in int64
INT64_LIMIT = 2**63
_LOW_BITS = 32
_CHUNK = 1 << 30  # rows per partial sum when split: 2**30 * 2**32 < 2**63


def parse_amount(text: str, scale: int, decimal: str = ".", thousands: str = "") -> int:
    """`text` ("1.234,56" with decimal="," thousands=".") as an integer of 10**-scale units.

    Raises ReviewError when the text is not a number or has more decimals than `scale`.
    """
    cleaned = text.strip().replace("\u00a0", "").replace(" ", "")
    if thousands:
        cleaned = cleaned.replace(thousands, "")
    if decimal != ".":
        cleaned = cleaned.replace(decimal, ".")
    if cleaned.startswith("(") and cleaned.endswith(")"):
        cleaned = "-" + cleaned[1:-1]
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        raise ReviewError(f"{text!r} is not an amount") from None
    if not value.is_finite():
        raise ReviewError(f"{text!r} is not a finite amount")
    if value.adjusted() + scale >= 18:  # held as int64 minor units
        raise ReviewError(f"{text!r} is too large an amount (at most 17 digits with the decimals)")
    units = value.scaleb(scale)
    if units != units.to_integral_value():
        raise ReviewError(f"{text!r} has more than {scale} decimals; set `decimals` in the source to match the data")
    return int(units)


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
