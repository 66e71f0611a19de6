"""Columns a CSV source does not map but whose header says what they hold: a currency, an account, a balance.

A column the schedule leaves out is not read, so what it says could be silently wrong for the
source: a `Currency` column holding USD and EUR rows while the source sums them as EUR, an
`Account` column holding two accounts whose rows are added up as one, a running `Saldo` that the
amounts as read do not add up to (a sign or a decimal misread). Each such column is watched while
the file is read, and the file is refused at the first row that disagrees, naming the column and
what to do:

- a currency column: every filled cell is the source's `currency` (its code or a symbol of it), or,
  with none declared, all filled cells are one currency;
- an account column: all filled cells are one account;
- a balance column: each filled cell follows from the one before it by the amounts of the rows in
  between, the file read oldest first or newest first, per account where an account column is mapped.

A header is recognised by its whole text (case, accents and punctuation aside) in `HEADERS`, so
"Gegenkonto" (the counterparty's account) or "Betrag (EUR)" are not watched.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field

from nightshift.app.review.errors import ReviewError
from nightshift.app.review.money import AmountFormat, format_amount, parse_amount

HEADERS = {
    "currency": frozenset({
        "currency", "currency code", "ccy", "cur", "curr", "waehrung", "wahrung", "wkz", "devise", "monnaie",
        "moneda", "divisa", "valuta", "valuta code", "waluta", "mena", "iso currency", "iso waehrung",
    }),
    "account": frozenset({
        "account", "account number", "account no", "account id", "acct", "iban", "konto", "kontonummer", "konto nr",
        "auftragskonto", "bankkonto", "compte", "numero de compte", "no de compte", "cuenta", "numero de cuenta",
        "conto", "numero conto", "rekening", "rekeningnummer", "eigen rekening",
    }),
    "balance": frozenset({
        "balance", "running balance", "balance after", "saldo", "saldo nach buchung", "kontostand", "solde",
        "solde apres operation", "saldo contable", "saldo disponible",
    }),
}  # fmt: skip
_NOT_WORD = re.compile(r"[\W_]+")

Where = Callable[[int], str]  # a line number -> "source 'bank', bank.csv line 7"


def _cell(record: list[str], at: int) -> str:
    """The cell at `at`, stripped; empty on a row shorter than the header (only mapped columns must be there)."""
    return record[at].strip() if at < len(record) else ""


def header_kind(header: str) -> str | None:
    """What a header names: "currency", "account" or "balance" ("Währung", "IBAN", "Saldo"), else None."""
    plain = "".join(c for c in unicodedata.normalize("NFKD", header) if not unicodedata.combining(c))
    words = " ".join(_NOT_WORD.sub(" ", plain.casefold()).split())
    return next((kind for kind, names in HEADERS.items() if words in names), None)


@dataclass
class OneValue:
    """An unmapped currency or account column: every filled cell one value (the source's currency, if declared)."""

    header: str
    at: int
    kind: str
    where: Where
    currency: str | None = None  # the source's declared currency
    symbols: tuple[str, ...] = ()  # its code and symbols (€, EUR)
    first: tuple[str, int] | None = None

    def see(self, record: list[str], units: int, line: int, account: str) -> None:
        value = _cell(record, self.at)
        if not value:
            return
        if self.currency is not None:
            if value.upper() != self.currency and value not in self.symbols:
                raise ReviewError(f"{self.where(line)}: column {self.header!r} (not mapped) says {value!r}, but the "
                                  f"source's currency is {self.currency}; amounts in two currencies are never added "
                                  "up. Give each currency its own file and source (with its `currency`, or "
                                  "`convert`)")  # fmt: skip
        elif self.first is None:
            self.first = (value, line)
        elif value != self.first[0]:
            raise ReviewError(f"{self.where(line)}: column {self.header!r} (not mapped) says {value!r} here and "
                              f"{self.first[0]!r} on line {self.first[1]}: {self.advice}")  # fmt: skip

    @property
    def advice(self) -> str:
        if self.kind == "currency":
            return ("amounts in two currencies are never added up. Give each currency its own file and source, "
                    "each with its `currency`")  # fmt: skip
        return (f"rows of more than one account. Map it (`columns.account = {self.header!r}`) so checks keep the "
                "accounts apart, or keep one account's rows in the file")  # fmt: skip

    def notes(self) -> tuple[str, ...]:
        return ()


@dataclass
class RunningBalance:
    """An unmapped balance column: each filled cell follows from the one before by the amounts in between.

    Both readings are followed at once, oldest row first (a cell is the balance after its row) and
    newest first (the balance before the row above it), per account; the file is refused once
    neither holds. A cell that is not an amount in the source's format stops the watch, and the
    source's notes say so.
    """

    header: str
    at: int
    where: Where
    decimals: int
    amounts: AmountFormat
    chains: dict[str, list[int]] = field(default_factory=dict)  # account -> [balance, line, its amount, since]
    holds: dict[str, bool] = field(default_factory=lambda: {"oldest first": True, "newest first": True})
    unread: tuple[int, str] | None = None  # the line and cell that stopped the watch

    def see(self, record: list[str], units: int, line: int, account: str) -> None:
        text = _cell(record, self.at)
        if self.unread is not None:
            return
        if not text:
            if (chain := self.chains.get(account)) is not None:
                chain[3] += units
            return
        try:
            balance = parse_amount(text, self.decimals, self.amounts)
        except ReviewError:
            self.unread = (line, text)
            return
        chain = self.chains.get(account)
        self.chains[account] = [balance, line, units, 0]
        if chain is None:
            return
        before, before_line, before_units, since = chain
        moves = {"oldest first": since + units, "newest first": -(before_units + since)}
        for reading, moved in moves.items():
            self.holds[reading] = self.holds[reading] and balance - before == moved
        if not any(self.holds.values()):
            raise ReviewError(
                f"{self.where(line)}: column {self.header!r} (not mapped) is a running balance the amounts as read "
                f"do not add up to: {self._shown(balance)} after {self._shown(before)} on line {before_line} is a "
                f"change of {self._shown(balance - before)}, but the amounts say {self._shown(moves['oldest first'])} "
                f"(oldest row first) or {self._shown(moves['newest first'])} (newest first). Check the source's "
                "`sign`, `decimal` and which columns are mapped to amount (or debit and credit)"
            )

    def _shown(self, units: int) -> str:
        return format_amount(units, self.decimals)

    def notes(self) -> tuple[str, ...]:
        if self.unread is None:
            return ()
        line, text = self.unread
        return (f"column {self.header!r} names a balance, but line {line}'s {text!r} is not an amount in the "
                "source's format, so it was not checked against the amounts",)  # fmt: skip


Watch = OneValue | RunningBalance


def watches(header: list[str], mapped: dict[str, int], where: Where, decimals: int, amounts: AmountFormat,
            currency: str | None) -> list[Watch]:  # fmt: skip
    """A watch for each column of `header` that `mapped` (our column -> its position) leaves out and whose header
    names a currency, an account or a balance; none for a currency or account when a column is mapped to it."""
    found: list[Watch] = []
    for at, name in enumerate(header):
        kind = header_kind(name) if at not in mapped.values() else None
        if kind in mapped:
            continue
        if kind == "balance":
            found.append(RunningBalance(name, at, where, decimals, amounts))
        elif kind is not None:
            declared = currency if kind == "currency" else None
            found.append(OneValue(name, at, kind, where, declared, amounts.symbols if declared else ()))
    return found
