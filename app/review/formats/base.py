"""What every statement and ledger format shares: entries and balances read from one file, then one Table.

A format's reader turns its file into `Entry` rows (movements) and `Entry`
rows of balances, amounts as exact Decimals with their currency and the line
they came from. `StatementSource` picks one side (`rows = "entries"` or
`"balances"`), keeps the account asked for, checks that one currency remains,
and converts the amounts to integer minor units at the source's scale:
an amount with more digits than that is an error, never rounded.
"""

from __future__ import annotations

import hashlib
from dataclasses import KW_ONLY, dataclass
from datetime import date
from decimal import Decimal
from typing import ClassVar

from nightshift.app.review.errors import ReviewError
from nightshift.app.review.money import check_units
from nightshift.app.review.sources import Cancel, OptionError, Source, Table

ROWS = ("entries", "balances")


class FormatError(ReviewError):
    """A statement or ledger file that cannot be read exactly; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Entry:
    """One movement or one balance as the file states it: signed, exact, in its currency, at its line."""

    line: int
    day: date
    amount: Decimal
    currency: str
    account: str
    reference: str = ""
    description: str = ""


@dataclass
class Statement:
    """A file's contents: every booked movement and every stated balance, in file order."""

    entries: list[Entry]
    balances: list[Entry]


def to_units(amount: Decimal, scale: int, where: str) -> int:
    """`amount` as an integer of 10**-scale units; more decimals than `scale` is an error naming `where`."""
    units = amount.scaleb(scale)
    if not units.is_finite() or units != units.to_integral_value():
        raise FormatError(f"{where}: {amount} has more than {scale} decimals; set `decimals` in the source to match")
    try:
        return check_units(int(units))
    except ReviewError as exc:
        raise FormatError(f"{where}: {exc}") from None


@dataclass
class StatementSource(Source):
    """A statement or ledger file of one format, read as its movements or as its balances.

    `account` keeps the rows of one account (an IBAN, an account number, a
    Beancount account); `currency` (a Source field) declares the one currency
    the rows must be in. Without it they must all share one, or the source is
    refused: amounts in two currencies are never added up.
    """

    _: KW_ONLY
    rows: str = "entries"  # or "balances": the statement's stated balances, for the balance check
    account: str | None = None

    kind: ClassVar[str] = "statement"  # the schedule's `type`, set by each format

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rows not in ROWS:
            raise OptionError("rows", f'{self.rows!r}; use "entries" (movements) or "balances"')

    def read(self, data: bytes) -> Statement:
        """The whole file (its bytes as read); each format implements it with its library."""
        raise NotImplementedError

    def decode(self, data: bytes, what: str) -> str:
        """The file as UTF-8 text (a BOM dropped); `what` says what the format expects when it is not."""
        try:
            return data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise FormatError(f"{self.where()}: byte {exc.start} is not UTF-8 text; {what}") from None

    def where(self, line: int | None = None) -> str:
        return f"source {self.name!r} ({self.kind}), {self.path}" + (f" line {line}" if line else "")

    def load(self, start: date, end: date, cancel: Cancel | None = None) -> Table:
        """Every row of the chosen side (checks pick the period's rows, like a CSV source's)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            raise self._missing() from None
        except IsADirectoryError:
            raise FormatError(f"source {self.name!r}: {self.path} is a folder; `path` names one file") from None
        statement = self.read(data)
        mine = self.select(statement)
        if not mine and self.account is not None:
            known = ", ".join(sorted({row.account for row in statement.balances})) or "none"
            raise FormatError(f"{self.where()}: no {self.rows} for account {self.account!r}; "
                              f"the accounts with balances are: {known}")  # fmt: skip
        currency = self._currency(mine)
        table = self._table(((row.line, row.day, to_units(row.amount, self.decimals, self.where(row.line)),
                              {"reference": row.reference, "account": row.account, "description": row.description})
                             for row in mine), sha256=hashlib.sha256(data).hexdigest(), rows_read=len(mine))  # fmt: skip
        table.currency = self.conversion.target if self.conversion else currency  # converted: the checks see `to`
        return table

    def select(self, statement: Statement) -> list[Entry]:
        """The chosen side's rows of `account` (all of them without one)."""
        chosen = statement.entries if self.rows == "entries" else statement.balances
        return [row for row in chosen if self.account is None or row.account == self.account]

    def _currency(self, rows: list[Entry]) -> str | None:
        """The rows' one currency: the declared one (every row must be in it), or the one they share."""
        if self.currency is not None:
            other = next((row for row in rows if row.currency != self.currency), None)
            if other is not None:
                raise FormatError(f"{self.where(other.line)}: an amount in {other.currency}, but the source's "
                                  f"`currency` is {self.currency}; set `account` to keep one account's rows")  # fmt: skip
            return self.currency
        found = sorted({row.currency for row in rows})
        if len(found) > 1:
            raise FormatError(f"{self.where()}: {self.rows} in {', '.join(found)}; amounts in different currencies "
                              "are never added up: set `account` (or `currency`) to keep rows of one")  # fmt: skip
        return found[0] if found else None
