"""SWIFT MT940 customer statements, read by the `mt-940` library with all its fixes switched on.

`mt940.Options.all()` matters: by default the library keeps a reversal of a
credit (`RC`) positive and a lowercase mark unsigned; with it, C and RD are
credits and D and RC debits. The library is lenient where a statement must
not be: a `:61:` whose amount runs into garbage (`38.5X0`) parses as 38 with
the rest taken for the reference, and a tag without its colon is glued to the
text before it (a booking lost without a word). So a line that looks like a
tag without its colon is refused, the file's own tag lines are counted
against what was parsed, and every booking must have parsed with its
transaction type (`NTRF`, `NCHK`, ...) right after
the amount, and every statement must state its balances; anything else is
refused with the line.

What maps to what, per statement (`:20:` to `-`):

- entries: each `:61:`; amount signed by its mark, currency of the
  statement's balances, date the entry (booking) date where given, else the
  value date; account `:25:`; reference the customer reference unless
  NONREF; description the `:86:` text.
- balances: `:62F:` (or `:62M:`) at the end of its date; the first statement's
  `:60F:` (or `:60M:`) per account is the balance before its date's bookings
  (banks date it either the previous closing day or the statement day), so it
  is dated the day before.
"""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import ClassVar

from nightshift.app.review.formats.base import Entry, FormatError, Statement, StatementSource

_TAG = re.compile(r":(\d{2}[A-Z]?):")
_UNCOLONED = re.compile(r"(2[05]|28C|6[0-2][FM]?|64|65|86):")


class Mt940Source(StatementSource):
    kind: ClassVar[str] = "mt940"

    def read(self, data: bytes) -> Statement:
        import mt940

        text = self.decode(data, "MT940 is SWIFT's ASCII character set")
        tags = _tag_lines(text)
        for number, line in enumerate(text.splitlines(), start=1):
            if _UNCOLONED.match(line):  # the library would glue it to the text before it
                raise FormatError(f"{self.where(number)}: {line[:24]!r} looks like a tag without its leading colon")
        try:
            statements = mt940.parse_statements(text, options=mt940.Options.all())
        except (RuntimeError, ValueError) as exc:
            raise FormatError(f"{self.where()}: not readable as MT940: {exc.args[0] if exc.args else exc}") from None
        if len(statements) != len(tags):
            raise FormatError(f"{self.where()}: {len(tags)} statements (:20:) but {len(statements)} parsed")
        entries: list[Entry] = []
        balances: list[Entry] = []
        opened: set[str] = set()
        for statement, lines in zip(statements, tags):
            entries.extend(self._entries(statement, lines))
            account = str(statement.data.get("account_identification") or "")
            opening, closing = self._balances(statement, lines)
            if account not in opened:
                opened.add(account)
                balances.append(Entry(lines["60"][0], opening.date - timedelta(days=1), opening.amount.amount,
                                      opening.amount.currency, account, "", "opening balance"))  # fmt: skip
            balances.append(Entry(lines["62"][-1], closing.date, closing.amount.amount, closing.amount.currency,
                                  account, "", "closing balance"))  # fmt: skip
        return Statement(entries, balances)

    def _balances(self, statement, lines: dict[str, list[int]]):
        data = statement.data
        opening = data.get("final_opening_balance") or data.get("intermediate_opening_balance")
        closing = data.get("final_closing_balance") or data.get("intermediate_closing_balance")
        for balance, tag, what in ((opening, "60", "opening"), (closing, "62", "closing")):
            if balance is None or balance.date is None or not lines[tag]:
                raise FormatError(f"{self.where(lines['20'][0])}: statement {data.get('transaction_reference')!r} "
                                  f"has no {what} balance (:{tag}F: or :{tag}M:)")  # fmt: skip
        return opening, closing

    def _entries(self, statement, lines: dict[str, list[int]]):
        bookings = statement.transactions
        if len(bookings) != len(lines["61"]):
            raise FormatError(f"{self.where(lines['20'][0])}: {len(lines['61'])} :61: lines but {len(bookings)} "
                              "bookings parsed; a tag may have lost its colon")  # fmt: skip
        for booking, line in zip(bookings, lines["61"]):
            data = booking.data
            if not data.get("id"):
                raise FormatError(f"{self.where(line)}: :61: has no transaction type (like NTRF) right after the "
                                  f"amount {data['amount'].amount}: the amount is malformed or cut short")  # fmt: skip
            day = data.get("guessed_entry_date") or data["date"]
            reference = str(data.get("customer_reference") or "").strip()
            yield Entry(
                line, date(day.year, day.month, day.day), data["amount"].amount, data["amount"].currency or "",
                str(statement.data.get("account_identification") or ""), "" if reference == "NONREF" else reference,
                " ".join(str(data.get("transaction_details") or "").split()),
            )  # fmt: skip


def _tag_lines(text: str) -> list[dict[str, list[int]]]:
    """Per statement (each starts at `:20:`), the line numbers of its :20:, :60x:, :61: and :62x: tags."""
    statements: list[dict[str, list[int]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        found = _TAG.match(line)
        if found is None:
            continue
        tag = found.group(1)[:2]
        if tag == "20":
            statements.append({"20": [number], "60": [], "61": [], "62": []})
        elif tag in ("60", "61", "62") and statements:
            statements[-1][tag].append(number)
    return statements
