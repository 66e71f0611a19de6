"""Exact amounts: parsed as decimals and held as integers of minor units (cents), never floats.

Integers keep sums exact and let numpy do the arithmetic on a million rows.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from app.review.errors import ReviewError


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


def to_decimal(units: int, scale: int) -> Decimal:
    return Decimal(int(units)).scaleb(-scale)


def format_amount(units: int, scale: int) -> str:
    """1234567 at scale 2 -> '12,345.67' (how reports and prompts show amounts)."""
    return f"{to_decimal(units, scale):,.{scale}f}"
