"""Data sources a review reads: CSV files and SQLite queries, loaded into a `Table`.

Every source yields the same columns (date, amount, reference, account,
description) so checks do not care where rows came from. Amounts are exact
integers of minor units; each row remembers where it came from (file line or
query row) so findings can point back at it.
"""

from __future__ import annotations

import csv
import sqlite3
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nightshift.app.review.errors import ReviewError
from nightshift.app.review.money import check_units, format_amount, parse_amount, to_decimal

if TYPE_CHECKING:  # numpy is imported where tables are built and cut: reading schedules (review list, jobs) needs none
    import numpy as np

TEXT_COLUMNS = ("reference", "account", "description")
COLUMNS = ("date", "amount", *TEXT_COLUMNS)
EPOCH_ORDINAL = date(1970, 1, 1).toordinal()  # day 0 of datetime64[D]
SHARED_TEXTS = 4096  # distinct values per text column that are kept as one shared string each


@dataclass
class Table:
    """Rows of one source as columns; `lines` are the rows' positions in the source (1 = first data row)."""

    name: str
    origin: Path
    scale: int
    dates: np.ndarray  # datetime64[D]
    amounts: np.ndarray  # int64, units of 10**-scale
    text: dict[str, np.ndarray]  # object arrays of str
    lines: np.ndarray

    def __len__(self) -> int:
        return len(self.amounts)

    def where(self, mask: np.ndarray) -> Table:
        """The rows where `mask` holds (a boolean mask or index array), same source."""
        return Table(
            self.name, self.origin, self.scale, self.dates[mask], self.amounts[mask],
            {key: values[mask] for key, values in self.text.items()}, self.lines[mask],
        )  # fmt: skip

    def between(self, start: date, end: date) -> Table:
        """Rows dated from `start` to `end`, both included."""
        import numpy as np

        return self.where((self.dates >= np.datetime64(start, "D")) & (self.dates <= np.datetime64(end, "D")))

    def column(self, name: str) -> np.ndarray:
        if name == "date":
            return self.dates
        if name == "amount":
            return self.amounts
        if name not in self.text:
            raise ReviewError(f"source {self.name!r} has no column {name!r}; map it in the schedule's `columns`")
        return self.text[name]

    def amount(self, row: int) -> Decimal:
        return to_decimal(self.amounts[row], self.scale)

    def format(self, units: int) -> str:
        return format_amount(units, self.scale)

    def row(self, i: int) -> dict[str, Any]:
        """Row `i` as plain values, for findings and reports."""
        values = {"source": self.name, "line": int(self.lines[i]), "date": str(self.dates[i]), "amount": self.amount(i)}
        values.update({key: str(column[i]) for key, column in self.text.items()})
        return values


def build_table(name: str, origin: Path, scale: int, rows: Iterable[tuple[int, date, int, dict[str, str]]]) -> Table:
    """A Table from (line, date, amount units, text columns) tuples.

    Numbers are gathered in typed arrays (8 bytes a value; a list holds a 36-byte int object each),
    and a column's repeated text (accounts, categories) shares one string, so 10**7 rows fit in a few GB.
    """
    import numpy as np

    lines, days, amounts = array("q"), array("q"), array("q")
    texts: dict[str, list[str]] = {key: [] for key in TEXT_COLUMNS}
    shared: dict[str, dict[str, str]] = {key: {} for key in TEXT_COLUMNS}
    for line, day, units, text in rows:
        lines.append(line)
        days.append(day.toordinal() - EPOCH_ORDINAL)
        amounts.append(units)
        for key in TEXT_COLUMNS:
            value, seen = text.get(key, ""), shared[key]
            if (same := seen.get(value)) is not None:
                value = same
            elif len(seen) < SHARED_TEXTS:
                seen[value] = value
            texts[key].append(value)
    return Table(
        name, origin, scale,
        np.array(days, dtype=np.int64).view("datetime64[D]"), np.array(amounts, dtype=np.int64),
        {key: np.array(values, dtype=object) for key, values in texts.items()},
        np.array(lines, dtype=np.int64),
    )  # fmt: skip


@dataclass
class CsvSource:
    """A CSV file: delimiter, date format, decimal and thousands separators, column mapping."""

    name: str
    path: Path
    columns: dict[str, str]
    delimiter: str = ","
    date_format: str = "%Y-%m-%d"
    decimal: str = "."
    thousands: str = ""
    decimals: int = 2
    encoding: str = "utf-8-sig"

    def load(self, start: date, end: date) -> Table:
        """Every row of the file (the window only narrows SQL queries; checks pick their rows)."""
        if not self.path.is_file():
            raise ReviewError(f"source {self.name!r}: no file at {self.path}; fix `path` in the schedule")
        with self.path.open(newline="", encoding=self.encoding) as handle:
            reader = csv.reader(handle, delimiter=self.delimiter)
            try:
                header = next(reader, None)
                if header is None:
                    raise ReviewError(f"source {self.name!r}: {self.path} is empty (a header row is needed)")
                positions = self._positions(header)
                return build_table(self.name, self.path, self.decimals, self._rows(reader, positions))
            except UnicodeDecodeError as exc:
                raise ReviewError(f"source {self.name!r}: {self.path} is not UTF-8 text ({exc.reason}); "
                                  "save it as UTF-8 CSV") from None  # fmt: skip
            except csv.Error as exc:
                raise ReviewError(f"{self._at(reader.line_num)}: not readable as CSV: {exc}") from None

    def _positions(self, header: list[str]) -> dict[str, int]:
        missing = [column for column in self.columns.values() if column not in header]
        if missing:
            raise ReviewError(
                f"source {self.name!r}: {self.path} has no column(s) {missing}; its header is {header}. "
                "Fix `columns` in the schedule (or `delimiter` if the header was not split)"
            )
        return {ours: header.index(theirs) for ours, theirs in self.columns.items()}

    def _at(self, line: int) -> str:
        return f"source {self.name!r}, {self.path} line {line}"

    def _rows(self, reader, positions: dict[str, int]):
        text_positions = {key: at for key, at in positions.items() if key in TEXT_COLUMNS}
        days: dict[str, date] = {}  # a file has few distinct dates; strptime is the slow part of a row
        for number, record in enumerate(reader, start=2):
            if not any(cell.strip() for cell in record):
                continue
            try:
                text = record[positions["date"]].strip()
                day = days.get(text) or days.setdefault(text, datetime.strptime(text, self.date_format).date())
                units = parse_amount(record[positions["amount"]], self.decimals, self.decimal, self.thousands)
            except IndexError:
                raise ReviewError(f"{self._at(number)}: {len(record)} fields, fewer than the header's") from None
            except ValueError as exc:
                raise ReviewError(f"{self._at(number)}: {exc} (date_format is {self.date_format!r})") from None
            except ReviewError as exc:
                raise ReviewError(f"{self._at(number)}: {exc}") from None
            yield number, day, units, {key: record[at].strip() for key, at in text_positions.items()}


@dataclass
class SqliteSource:
    """A query on a SQLite file, opened read-only; it may use :start and :end (ISO dates).

    Result columns are named like ours (date, amount, reference, account,
    description); amounts should be TEXT or INTEGER minor units to stay exact.
    """

    name: str
    path: Path
    query: str
    decimals: int = 2
    amount_in_minor_units: bool = False

    def load(self, start: date, end: date) -> Table:
        if not self.path.is_file():
            raise ReviewError(f"source {self.name!r}: no SQLite file at {self.path}; fix `path` in the schedule")
        try:
            with sqlite3.connect(f"file:{self.path}?mode=ro", uri=True) as db:
                cursor = db.execute(self.query, {"start": start.isoformat(), "end": end.isoformat()})
                names = [column[0] for column in cursor.description]
                records = cursor.fetchall()
        except sqlite3.Error as exc:
            raise ReviewError(f"source {self.name!r}: the query on {self.path} failed: {exc}; fix `query`") from None
        for needed in ("date", "amount"):
            if needed not in names:
                raise ReviewError(
                    f"source {self.name!r}: the query returns {names}, no {needed!r}; alias a column AS {needed}"
                )
        return build_table(self.name, self.path, self.decimals, self._rows(records, names))

    def _rows(self, records: list[tuple], names: list[str]):
        at = {name: i for i, name in enumerate(names)}
        for number, record in enumerate(records, start=1):
            where = f"source {self.name!r}, query row {number}"
            try:
                day = date.fromisoformat(str(record[at["date"]])[:10])
            except ValueError:
                raise ReviewError(f"{where}: date {record[at['date']]!r} is not an ISO date (YYYY-MM-DD)") from None
            yield (
                number,
                day,
                self._units(record[at["amount"]], where),
                {key: "" if record[at[key]] is None else str(record[at[key]]) for key in TEXT_COLUMNS if key in at},
            )

    def _units(self, value: Any, where: str) -> int:
        try:
            if isinstance(value, int) and self.amount_in_minor_units:
                return check_units(value)
            if isinstance(value, float):
                # repr of a float is its shortest exact decimal form: 12.3 -> "12.3"
                value = repr(value)
            return parse_amount(str(value), self.decimals)
        except ReviewError as exc:
            raise ReviewError(f"{where}: {exc}") from None


Source = CsvSource | SqliteSource
