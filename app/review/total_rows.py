"""Total rows in a CSV: a row that sums the rows before it and says so is a total, never a transaction.

Spreadsheets and some bank exports close a day, a month or the file with a row such as
`Summe;;12.345,67` or `31.10.2026;Total Oktober;12.345,67`. Read as a transaction it doubles the
file's total and becomes a finding of its own. A row is a total when both hold:

- its amount equals the sum of a block of transaction rows that ends just before it, is at least
  two rows long, and starts at the file's first row, at the first row after the latest total row,
  or at the first row of the latest day or month (in file order: the rows since the date or the
  month last changed). Total rows are never part of a block, so a grand total over daily subtotals
  is found too. Four starts at most, so a row that merely equals some run of rows is rare;
- one of its cells reads as a total: its first or second word is one of `TOTAL_WORDS` (Total,
  Summe, Gesamt, Saldo, Totaal, Somme, Suma... in the languages books come in), or a German
  compound ending in "summe" (Tagessumme, Monatssumme).

Both are needed: "TOTAL ENERGIES 45,00" reads as a total but sums nothing, and a row that happens
to equal the rows before it says nothing of totals. A total of a single row is not recognised (it
stays a transaction, and a finding shows it). Total rows are left out of the table, and the
source's notes (in the report's data files) say which they were.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from datetime import date

from nightshift.app.review.money import format_amount

TOTAL_WORDS = frozenset({
    "total", "totals", "subtotal", "sum", "summe", "gesamt", "gesamtbetrag", "endbetrag", "saldo", "totaal",
    "subtotaal", "somme", "suma", "totale", "subtotale", "totalt", "summa", "yhteensa",
    "razem", "celkem", "osszesen", "toplam", "итого", "всего", "合计", "合計", "小计", "小計", "総計",
})  # fmt: skip
LISTED = 5  # total rows named in the source's notes; the rest are counted
_WORDS = re.compile(r"\w+")


def _words(cell: str) -> list[str]:
    """The cell's first two words, case and accents dropped ("Total général" -> ["total", "general"])."""
    plain = "".join(c for c in unicodedata.normalize("NFKD", cell) if not unicodedata.combining(c))
    return _WORDS.findall(plain.casefold())[:2]


def says_total(cell: str) -> bool:
    """Whether a cell reads as a total ("Summe", "Total général", "Grand total", "Monatssumme")."""
    return any(word in TOTAL_WORDS or word.endswith("summe") for word in _words(cell))


FILE, AFTER_TOTAL, DAY, MONTH = range(4)  # where a block may start: the file's first row, after the latest total,
# the latest day's and the latest month's first row


@dataclass
class TotalRows:
    """Finds total rows while a CSV is read in file order: ask `is_total` of each row, then `add` the others."""

    running: int = 0  # the sum of the transaction rows so far (units at the source's decimals)
    rows: int = 0  # their count
    starts: list[tuple[int, int, int] | None] = field(default_factory=lambda: [None] * 4)  # (running, rows, line)
    sums: list[int | None] = field(default_factory=lambda: [None] * 4)  # the starts' running sums, looked up per row
    last_day: date | None = None
    after_total: bool = False
    found: list[tuple[int, str, int, int]] = field(default_factory=list)  # line, its total text, units, first line

    def is_total(self, record: list[str], units: int, line: int) -> bool:
        """True (and remembered) when the row totals a block before it and one of its cells says so."""
        before = self.running - units  # the running sum where a block this row totals would start
        if before not in self.sums:  # nearly every row: one look, since this runs for every row of the file
            return False
        for start in self.starts:
            if start is not None and start[0] == before and self.rows - start[1] >= 2:
                said = next((cell.strip() for cell in record if says_total(cell)), None)
                if said is None:
                    return False
                self.found.append((line, said, units, start[2]))
                self.after_total = True
                return True
        return False

    def add(self, units: int, day: date, line: int) -> None:
        """A transaction row: it may start blocks (the file's, after a total, a new day or month), then counts."""
        if day != self.last_day or self.after_total:
            last = self.last_day
            if last is None:
                self._start(FILE, line)
            if self.after_total:
                self._start(AFTER_TOTAL, line)
                self.after_total = False
            if day != last:  # inline: in a file not sorted by date, every row
                self.starts[DAY], self.sums[DAY] = (self.running, self.rows, line), self.running
                if last is None or (day.year, day.month) != (last.year, last.month):
                    self._start(MONTH, line)
            self.last_day = day
        self.running += units
        self.rows += 1

    def _start(self, where: int, line: int) -> None:
        self.starts[where], self.sums[where] = (self.running, self.rows, line), self.running

    def notes(self, decimals: int) -> tuple[str, ...]:
        """What the report says of the total rows left out (amounts at the source's `decimals`)."""
        if not self.found:
            return ()
        listed = "; ".join(f"line {line} ({said!r}, {format_amount(units, decimals)}: the sum of the rows from line "
                           f"{first})" for line, said, units, first in self.found[:LISTED])  # fmt: skip
        more = f"; and {len(self.found) - LISTED:,} more" if len(self.found) > LISTED else ""
        count = "1 total row" if len(self.found) == 1 else f"{len(self.found):,} total rows"
        return (f"{count} left out, not read as transactions: {listed}{more}",)
