"""Data sources a review reads (CSV files, SQLite queries, and the kinds in `SOURCE_KINDS`), loaded into a `Table`.

Every source yields the same columns (date, amount, reference, account,
description) so checks do not care where rows came from. Amounts are exact
integers of minor units at the review's one scale (`Source.scale`, set by the
schedule to the most decimals any source declares), so bank 125.00 and ledger
12.500 are 1250000 and 12500 thousandths, never equal. Each row remembers where
it came from (file line or query row) so findings can point back at it, and a
table carries the SHA-256 and count of the bytes and rows actually read.

A source is read strictly: an amount, date or cell that does not fit what the
schedule declares is an error naming the file, line, column and value, and the
run fails with it. A load keeps to its time budget (`timeout_seconds`) and stops
when the caller's `cancel` callable returns True.
"""

from __future__ import annotations

import calendar
import codecs
import csv
import hashlib
import importlib
import io
import re
import sqlite3
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation, localcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar

from nightshift.app.review.errors import ReviewError, ReviewInterrupted
from nightshift.app.review.money import (
    PLAIN,
    AmountFormat,
    check_units,
    currency_digits,
    format_amount,
    parse_amount,
    to_decimal,
)  # fmt: skip
from nightshift.app.review.total_rows import TotalRows
from nightshift.app.review.unmapped import Watch, watches

if TYPE_CHECKING:  # numpy is imported where tables are built and cut: reading schedules (review list, jobs) needs none
    import numpy as np

TEXT_COLUMNS = ("reference", "account", "description")
COLUMNS = ("date", "amount", *TEXT_COLUMNS)
EPOCH_ORDINAL = date(1970, 1, 1).toordinal()  # day 0 of datetime64[D]
SHARED_TEXTS = 4096  # distinct values per text column that are kept as one shared string each
_UNDECODABLE = re.compile("[\udc80-\udcff]")
CHECK_EVERY = 4096  # rows between looks at the time budget and the cancel callable
DETECT_BYTES = 1 << 20  # how much of a file `encoding = "auto"` looks at
_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))  # fmt: skip

Cancel = Callable[[], bool]  # True once the run should stop (e.g. the service's cancel Event's `is_set`)


@dataclass
class Table:
    """Rows of one source as columns; `lines` are the rows' positions in the source (1 = first data row).

    `sha256` and `rows_read` describe what was read (every data row, also those outside the period);
    `notes` say how it was read where that was not declared (a detected encoding).
    """

    name: str
    origin: Path
    scale: int
    dates: np.ndarray  # datetime64[D]
    amounts: np.ndarray  # int64, units of 10**-scale
    text: dict[str, np.ndarray]  # object arrays of str
    lines: np.ndarray
    currency: str | None = None
    sha256: str = ""
    rows_read: int = 0
    notes: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.amounts)

    def where(self, mask: np.ndarray) -> Table:
        """The rows where `mask` holds (a boolean mask or index array), same source."""
        return replace(self, dates=self.dates[mask], amounts=self.amounts[mask], lines=self.lines[mask],
                       text={key: values[mask] for key, values in self.text.items()})  # fmt: skip

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


Row = tuple[int, date, int, dict[str, str]]  # line, date, amount units (at the source's decimals), text columns
_DIRECTIVE = re.compile(r"%[-#_^0]?([A-Za-z%])")
_NAMES = {"day": frozenset("dajAuwcx"), "quarter": frozenset("q"), "month": frozenset("mbB"), "year": frozenset("Yy")}


def date_period(date_format: str) -> str:
    """What one date in `date_format` names: a "day", or a whole "month", "quarter" (`%q`, 1 to 4) or "year".

    A format without a day (`%m.%Y`, `%Y-%m`, `Q%q %Y`, `%Y`) names a period; ValueError for a quarter
    beside a month or day.
    """
    found = set(_DIRECTIVE.findall(date_format))
    if "q" in found and found & (_NAMES["day"] | _NAMES["month"]):
        raise ValueError(f"{date_format!r} has a quarter (%q) and a month or day; use one of them")
    return next((period for period, names in _NAMES.items() if found & names), "day")


def parse_day(text: str, date_format: str, dated: str) -> date:
    """The date `text` names in `date_format` (see `date_period`): a period's last day when it names a period.

    A balance dated 10.2026 (`%m.%Y`) is October's closing balance, so it is dated 2026-10-31, never the 1st.
    """
    day = datetime.strptime(text, date_format.replace("%q", "%m")).date()
    if dated == "day":
        return day
    if dated == "year":
        return date(day.year, 12, 31)
    month = day.month
    if dated == "quarter":
        if month > 4:
            raise ValueError(f"quarter {month} is not 1 to 4")
        month *= 3
    return date(day.year, month, calendar.monthrange(day.year, month)[1])


def build_table(name: str, origin: Path, scale: int, rows: Iterable[Row], factor: int = 1, **about: Any) -> Table:
    """A Table from (line, date, amount units, text columns) tuples; amounts times `factor` (to the review's scale).

    Numbers are gathered in typed arrays (8 bytes a value; a list holds a 36-byte int object each),
    and a column's repeated text (accounts, categories) shares one string, so 10**7 rows fit in a few GB.
    `about` fills the Table's provenance fields (currency, sha256, rows_read, notes).
    """
    import numpy as np

    lines, days, amounts = array("q"), array("q"), array("q")
    texts: dict[str, list[str]] = {key: [] for key in TEXT_COLUMNS}
    shared: dict[str, dict[str, str]] = {key: {} for key in TEXT_COLUMNS}
    for line, day, units, text in rows:
        lines.append(line)
        days.append(day.toordinal() - EPOCH_ORDINAL)
        amounts.append(units if factor == 1 else check_units(units * factor))
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
        np.array(lines, dtype=np.int64), **about,
    )  # fmt: skip


class OptionError(ReviewError):
    """A source option has a value that cannot work; the schedule reports it at that option's line."""

    def __init__(self, option: str, message: str):
        super().__init__(f"`{option}`: {message}")
        self.option, self.message = option, message


class Budget:
    """A load's time budget and its caller's cancel callable, looked at as rows are read."""

    def __init__(self, source: str, seconds: float, cancel: Cancel | None):
        self.source, self.seconds, self.cancel = source, seconds, cancel
        self.deadline = time.monotonic() + seconds

    def exceeded(self) -> bool:
        """True once the caller cancelled or the time is up (also SQLite's progress handler: nonzero stops it)."""
        return bool(self.cancel and self.cancel()) or time.monotonic() > self.deadline

    def check(self) -> None:
        """Raise if the load must stop: ReviewInterrupted when cancelled, ReviewError when out of time."""
        if self.cancel and self.cancel():
            raise ReviewInterrupted(f"source {self.source!r}: stopped while loading (the run was cancelled)")
        if time.monotonic() > self.deadline:
            raise ReviewError(f"source {self.source!r}: loading took longer than its {self.seconds:g} s budget; "
                              "raise its `timeout_seconds` or read fewer rows")  # fmt: skip


ROUNDINGS = {"half-even": ROUND_HALF_EVEN, "half-up": ROUND_HALF_UP}


@dataclass(frozen=True)
class Conversion:
    """A source's amounts in another currency at a fixed rate, each rounded as declared; the report says so."""

    source: str
    target: str
    rate: Decimal
    rounding: str
    digits: int  # the target currency's minor-unit digits

    def units(self, units: int, decimals: int) -> int:
        """`units` (10**-decimals of the source currency) in 10**-digits of the target, rounded."""
        with localcontext() as context:
            context.prec = 60  # 18-digit amounts times any rate stay exact before the one rounding
            exact = Decimal(units).scaleb(-decimals) * self.rate
            return int(exact.quantize(Decimal(1).scaleb(-self.digits), ROUNDINGS[self.rounding]).scaleb(self.digits))

    @property
    def note(self) -> str:
        return (f"amounts converted from {self.source} to {self.target} at {self.rate}, each rounded "
                f"{self.rounding} to {self.digits} decimals")  # fmt: skip


def _conversion(config: dict[str, Any], currency: str | None) -> Conversion:
    """A `convert = { to, rate, rounding }` table checked: a declared source currency, a positive decimal rate."""
    if currency is None:
        raise OptionError("convert", "needs the source's `currency` (the one converted from)")
    if set(config) != {"to", "rate", "rounding"} or not all(isinstance(value, str) for value in config.values()):
        raise OptionError("convert", 'should be { to = "EUR", rate = "0.9231", rounding = "half-even" } (strings), '
                                     f"not {config}")  # fmt: skip
    try:
        rate = Decimal(config["rate"])
    except InvalidOperation:
        rate = Decimal(0)
    if not rate.is_finite() or rate <= 0:
        raise OptionError("convert", f"rate {config['rate']!r} is not a positive decimal number")
    if config["rounding"] not in ROUNDINGS:
        raise OptionError("convert", f"rounding {config['rounding']!r}; use one of {', '.join(ROUNDINGS)}")
    try:
        digits = currency_digits(config["to"])
    except ReviewError as exc:
        raise OptionError("convert", str(exc)) from None
    return Conversion(currency, config["to"], rate, config["rounding"], digits)


@dataclass
class Source:
    """What every source kind has: a name and path, its amounts' decimals and currency, and the review's scale.

    Every field is a schedule key of the same name (schedule.py reads them and refuses any other
    key) except those in `SET_BY_REVIEW`, which come from the rest of the schedule: `scale` (the
    review's one scale), `margin_days` (the largest match tolerance over checks using this source)
    and `whole` (a balance check's balances).
    """

    SET_BY_REVIEW: ClassVar[tuple[str, ...]] = ("name", "scale", "margin_days", "whole")

    name: str
    path: Path
    _: KW_ONLY
    decimals: int | None = None  # None: the currency's minor-unit digits, else 2
    currency: str | None = None  # ISO 4217 code; sources of one check must agree
    convert: dict[str, str] | None = None  # { to, rate, rounding }: compared in `to`, each amount rounded
    timeout_seconds: float = 300.0
    scale: int | None = None
    margin_days: int = 0
    whole: bool = False  # keep rows outside the widened window too (a balance check's balances: openings may be old)
    conversion: Conversion | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.currency is not None:
            try:
                digits = currency_digits(self.currency)
            except ReviewError as exc:
                raise OptionError("currency", str(exc)) from None
            if self.decimals is None:
                self.decimals = digits
        if self.decimals is None:
            self.decimals = 2
        if not 0 <= self.decimals <= 9:
            raise OptionError("decimals", f"{self.decimals} is not between 0 and 9")
        if self.timeout_seconds <= 0:
            raise OptionError("timeout_seconds", "should be more than 0")
        if self.convert is not None:
            self.conversion = _conversion(self.convert, self.currency)

    @property
    def compared_currency(self) -> str | None:
        """The currency the checks see: the declared one, or the one converted to."""
        return self.conversion.target if self.conversion else self.currency

    @property
    def compared_decimals(self) -> int:
        """The decimals the checks see: the source's, or the converted-to currency's."""
        return self.conversion.digits if self.conversion else self.decimals

    @property
    def held_scale(self) -> int:
        """The scale amounts are held at: the review's, or this source's own (compared) decimals when read alone."""
        return self.compared_decimals if self.scale is None else self.scale

    def load(self, start: date, end: date, cancel: Cancel | None = None) -> Table:
        """Rows for a review of `start`..`end` widened by `margin_days` (every row when `whole`).

        `cancel` is called every few thousand rows (and by SQLite's progress handler); once it
        returns True the load stops with ReviewInterrupted.
        """
        raise NotImplementedError

    def _table(self, rows: Iterable[Row], notes: tuple[str, ...] = (), **about: Any) -> Table:
        """The rows (amounts at the source's `decimals`) as a Table at the review's scale, converted if declared."""
        if self.held_scale < self.compared_decimals:
            raise ReviewError(f"source {self.name!r}: held at {self.held_scale} decimals, fewer than its "
                              f"{self.compared_decimals}")  # fmt: skip
        if (conversion := self.conversion) is not None:
            rows = ((line, day, conversion.units(units, self.decimals), text) for line, day, units, text in rows)
            notes = (*notes, conversion.note)
        factor = 10 ** (self.held_scale - self.compared_decimals)
        return build_table(self.name, self.path, self.held_scale, rows, factor, currency=self.compared_currency,
                           notes=notes, **about)  # fmt: skip

    def _missing(self) -> ReviewError:
        return ReviewError(f"source {self.name!r}: no file at {self.path}; fix `path` in the schedule")


class _Hashing(io.RawIOBase):
    """A file read through a SHA-256: the digest is of exactly the bytes the reader got."""

    def __init__(self, raw: BinaryIO):
        self.raw, self.digest = raw, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = self.raw.readinto(buffer) or 0
        self.digest.update(memoryview(buffer)[:count])
        return count


@dataclass
class CsvSource(Source):
    """A CSV file, streamed: encoding, delimiter, date format, amount format, column mapping, sign.

    `columns` maps our columns to the file's headers; `debit` and `credit` may stand in for
    `amount` (amount = credit - debit; one of the two per row), and a `currency` column must hold the
    source's `currency` on every row. `account` is the account of every row of a file without an
    account column. `sign = "inverted"` negates every amount. A `date_format` without a day names
    a month, a quarter (`%q`) or a year, and each row is dated on its last day.

    What the file could be misread as is refused or left out, never summed: an unmapped column
    whose header names a currency, an account or a balance and disagrees with what the source
    assumes (app/review/unmapped.py), and total rows (app/review/total_rows.py), which are left out
    and said in the table's notes.
    """

    columns: dict[str, str] = field(default_factory=lambda: {"date": "date", "amount": "amount"})
    _: KW_ONLY
    encoding: str = "utf-8"  # a Python codec name, or "auto": detected (charset-normalizer), noted
    delimiter: str = ","
    date_format: str = "%Y-%m-%d"
    decimal: str = "."
    thousands: str = ""
    grouping: str = "standard"  # or "indian" (12,34,567.00)
    locale: str | None = None  # a CLDR locale giving decimal, thousands and grouping (de_DE, en_IN)
    negative: list[str] = field(default_factory=lambda: ["leading", "parentheses"])  # and/or "trailing"
    sign: str = "as-is"  # or "inverted"
    account: str | None = None  # every row's account, for a file without an account column
    amount_format: AmountFormat = field(init=False, default=PLAIN)
    dated: str = field(init=False, default="day")  # what one date names: a day, or a month, quarter or year

    def __post_init__(self) -> None:
        super().__post_init__()
        from nightshift.app.review.money import GROUPINGS, NEGATIVE_FORMS, locale_format

        allowed = {*COLUMNS, "debit", "credit", "currency"}
        has_pair = {"debit", "credit"} <= set(self.columns)
        unknown = sorted(set(self.columns) - allowed)
        if unknown or "date" not in self.columns or ("amount" in self.columns) == has_pair:
            raise OptionError("columns", f"maps {sorted(self.columns)}; it needs date and either amount or both "
                                         f"debit and credit, and may map {', '.join(TEXT_COLUMNS)} "
                                         f"(unknown: {unknown})")  # fmt: skip
        if not all(isinstance(value, str) for value in self.columns.values()):
            raise OptionError("columns", "should map each of our columns to a header name (a string)")
        if "currency" in self.columns and self.currency is None:
            raise OptionError(
                "columns", "maps a currency column; declare the source's `currency` (every row's must be it)"
            )
        if self.account is not None and "account" in self.columns:
            raise OptionError("account", "is every row's account for a file without an account column, but `columns` "
                                         f"maps account to {self.columns['account']!r}: keep one of them")  # fmt: skip
        try:
            self.dated = date_period(self.date_format)
        except ValueError as exc:
            raise OptionError("date_format", str(exc)) from None
        if self.encoding != "auto":
            try:
                codecs.lookup(self.encoding)
            except LookupError:
                raise OptionError("encoding", f'{self.encoding!r} is not an encoding; use e.g. "utf-8", '
                                              '"cp1252", "latin-1", "utf-16", or "auto"') from None  # fmt: skip
        if self.grouping not in GROUPINGS:
            raise OptionError("grouping", f"{self.grouping!r}; use one of {', '.join(GROUPINGS)}")
        if unknown := [form for form in self.negative if form not in NEGATIVE_FORMS]:
            raise OptionError("negative", f"{unknown} unknown; use some of {', '.join(NEGATIVE_FORMS)}")
        if self.sign not in ("as-is", "inverted"):
            raise OptionError("sign", f'{self.sign!r}; use "as-is" or "inverted"')
        decimal, thousands, grouping = self.decimal, self.thousands, GROUPINGS[self.grouping]
        if self.locale is not None:
            try:
                decimal, thousands, grouping = locale_format(self.locale)
            except ReviewError as exc:
                raise OptionError("locale", str(exc)) from None
        try:
            self.amount_format = AmountFormat(decimal, thousands, grouping, tuple(self.negative), self.currency)
        except ReviewError as exc:
            raise OptionError("locale" if self.locale else "decimal", str(exc)) from None

    def load(self, start: date, end: date, cancel: Cancel | None = None) -> Table:
        """The rows in the widened window (every row when `whole`), streamed and hashed as read.

        Every row is parsed and checked, so an error anywhere in the file fails the load; rows outside
        the window are then dropped, so memory follows the review's rows, not the file's.
        """
        if not self.path.is_file():
            raise self._missing()
        budget = Budget(self.name, self.timeout_seconds, cancel)
        with self.path.open("rb", buffering=0) as raw:
            hashing = _Hashing(raw)
            buffered = io.BufferedReader(hashing, DETECT_BYTES)
            encoding, notes = self._encoding(buffered.peek(DETECT_BYTES)[:DETECT_BYTES])
            handle = io.TextIOWrapper(buffered, encoding=encoding, newline="")
            reader = csv.reader(handle, delimiter=self.delimiter)
            try:
                header = next(reader, None)
                if header is None:
                    raise ReviewError(f"source {self.name!r}: {self.path} is empty (a header row is needed)")
                positions = self._positions(header)
                read = _CsvRead(
                    None if self.whole else TotalRows(),  # balances are not summed: no totals among them
                    watches(header, positions, self._at, self.decimals, self.amount_format, self.currency),
                )
                margin = timedelta(days=self.margin_days)
                kept = None if self.whole else (start - margin, end + margin)
                table = self._table(self._rows(reader, positions, budget, read, kept), notes=notes)
            except csv.Error as exc:
                raise ReviewError(f"{self._at(reader.line_num)}: not readable as CSV: {exc}") from None
            except UnicodeDecodeError:
                raise self._undecodable(encoding) from None
            table.sha256, table.rows_read = hashing.digest.hexdigest(), read.rows
            table.notes = (*table.notes, *self._dated_note(), *read.notes(self.decimals))
        return table

    def _dated_note(self) -> tuple[str, ...]:
        if self.dated == "day":
            return ()
        return (f"dates in the format {self.date_format!r} name a {self.dated}: each row is dated on its last day",)

    def _day(self, text: str) -> date:
        """The date `text` names in `date_format`: a day, or the last day of the month, quarter or year it names."""
        return parse_day(text, self.date_format, self.dated)

    def _encoding(self, head: bytes) -> tuple[str, tuple[str, ...]]:
        """The codec to read with (a UTF-8 BOM is dropped) and a note when it was detected, not declared."""
        marked = next((name for bom, name in _BOMS if head.startswith(bom)), None)
        declared = codecs.lookup(self.encoding).name if self.encoding != "auto" else None
        if marked is not None:
            if declared is not None and not declared.startswith(marked):  # utf-16-le is utf-16, utf-8-sig utf-8
                raise ReviewError(f"source {self.name!r}: {self.path} starts with a {marked} byte-order mark but "
                                  f"`encoding` is {self.encoding!r}; set it to {marked!r}")  # fmt: skip
            return ("utf-8-sig" if marked == "utf-8" else marked), ()
        if declared is not None or not head:  # an empty file is refused as such, not as undetectable
            return ("utf-8-sig" if declared in ("utf-8", None) else self.encoding), ()
        from charset_normalizer import from_bytes

        best = from_bytes(head).best()
        if best is None:
            raise ReviewError(f"source {self.name!r}: cannot tell the encoding of {self.path}; set `encoding`")
        found = codecs.lookup(best.encoding).name
        return found, (f"encoding {found} detected by charset-normalizer from the first {len(head):,} bytes",)

    def _undecodable(self, encoding: str) -> ReviewError:
        """The first line holding bytes that are not `encoding` text, found by reading again (only on failure)."""
        shown = encoding.removesuffix("-sig")
        with self.path.open(encoding=encoding, errors="surrogateescape", newline="") as handle:
            for number, line in enumerate(handle, start=1):
                if bad := _UNDECODABLE.search(line):  # an undecodable byte reads as a lone surrogate
                    return ReviewError(f"{self._at(number)}: byte 0x{ord(bad.group()) - 0xDC00:02x} is not {shown} text; "
                                       'set the source\'s `encoding` (e.g. "cp1252", "latin-1", or "auto") or save '
                                       "the file as UTF-8")  # fmt: skip
        return ReviewError(f"source {self.name!r}: {self.path} is not {shown} text; set the source's `encoding`")

    def _positions(self, header: list[str]) -> dict[str, int]:
        missing = [column for column in self.columns.values() if column not in header]
        if missing:
            raise ReviewError(
                f"source {self.name!r}: {self.path} has no column(s) {missing}; its header is {header}. "
                "Fix `columns` in the schedule (or `delimiter` if the header was not split)"
            )
        return {ours: header.index(theirs) for ours, theirs in self.columns.items()}

    def _at(self, line: int, column: str | None = None) -> str:
        where = f"source {self.name!r}, {self.path} line {line}"
        return f"{where}, column {self.columns[column]!r}" if column else where

    def _parsed(self, record: list[str], positions: dict[str, int], line: int, column: str) -> int:
        try:
            return parse_amount(record[positions[column]], self.decimals, self.amount_format)
        except ReviewError as exc:
            raise ReviewError(f"{self._at(line, column)}: {exc}") from None

    def _debit_credit(self, record: list[str], positions: dict[str, int], line: int) -> int:
        """The row's amount in units from a debit and a credit column: credit - debit (one filled, or the other 0)."""
        sides = {side: self._parsed(record, positions, line, side) if record[positions[side]].strip() else None
                 for side in ("debit", "credit")}  # fmt: skip
        for side, value in sides.items():
            if value is not None and value < 0:
                raise ReviewError(f"{self._at(line, side)}: {record[positions[side]]!r} is negative in a {side} "
                                  "column; which way it moves money is unclear")  # fmt: skip
        debit, credit = sides["debit"], sides["credit"]
        if debit is None and credit is None:
            raise ReviewError(f"{self._at(line)}: neither debit nor credit is filled")
        if debit and credit:
            raise ReviewError(f"{self._at(line)}: both debit and credit are filled; one of them should be")
        return (credit or 0) - (debit or 0)

    def _rows(self, reader: Iterator[list[str]], positions: dict[str, int], budget: Budget, read: _CsvRead,
              kept: tuple[date, date] | None) -> Iterator[Row]:  # fmt: skip
        """Every row parsed and checked (total rows left out); those dated within `kept` (None: all) yielded."""
        text_positions = {key: at for key, at in positions.items() if key in TEXT_COLUMNS}
        pair, negate = "amount" not in positions, self.sign == "inverted"
        first, last = kept or (date.min, date.max)
        days: dict[str, date] = {}  # a file has few distinct dates; strptime is the slow part of a row
        width = max(positions.values()) + 1
        totals, watched, account_at = read.totals, read.watches, positions.get("account")
        for number, record in enumerate(reader, start=2):
            if number % CHECK_EVERY == 0:
                budget.check()
            if not "".join(record).strip():
                continue
            read.rows += 1
            if len(record) < width:
                raise ReviewError(f"{self._at(number)}: {len(record)} fields, fewer than the header's")
            text = record[positions["date"]].strip()
            undated = None  # a row without a date may still be a total row, which is left out
            try:
                day = days.get(text) or days.setdefault(text, self._day(text))
            except ValueError as exc:
                undated = ReviewError(f"{self._at(number, 'date')}: {text!r} is not a date in the format "
                                      f"{self.date_format!r} (date_format): {exc}")  # fmt: skip
            if pair:
                units = self._debit_credit(record, positions, number)
            else:
                units = self._parsed(record, positions, number, "amount")
            units = -units if negate else units
            if totals is not None and totals.is_total(record, units, number):
                continue
            if undated is not None:
                raise undated
            if totals is not None:
                totals.add(units, day, number)
            if "currency" in positions and record[positions["currency"]].strip() != self.currency:
                raise ReviewError(f"{self._at(number, 'currency')}: {record[positions['currency']]!r} is not the "
                                  f"source's currency {self.currency}; amounts in two currencies are never added up")  # fmt: skip
            for watch in watched:
                watch.see(record, units, number, "" if account_at is None else record[account_at].strip())
            if first <= day <= last:
                texts = {key: record[at].strip() for key, at in text_positions.items()}
                if self.account is not None:
                    texts["account"] = self.account
                yield number, day, units, texts


@dataclass
class _CsvRead:
    """What reading a CSV keeps beside its rows: their count, the total rows found, the unmapped columns watched."""

    totals: TotalRows | None
    watches: list[Watch]
    rows: int = 0

    def notes(self, decimals: int) -> tuple[str, ...]:
        found = self.totals.notes(decimals) if self.totals is not None else ()
        return (*found, *(note for watch in self.watches for note in watch.notes()))


_READS = (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE)
_ACTION_NAMES = (
    "CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE", "CREATE_TEMP_TRIGGER", "CREATE_TEMP_VIEW",
    "CREATE_TRIGGER", "CREATE_VIEW", "DELETE", "DROP_INDEX", "DROP_TABLE", "DROP_TEMP_INDEX", "DROP_TEMP_TABLE",
    "DROP_TEMP_TRIGGER", "DROP_TEMP_VIEW", "DROP_TRIGGER", "DROP_VIEW", "INSERT", "PRAGMA", "TRANSACTION", "UPDATE",
    "ATTACH", "DETACH", "ALTER_TABLE", "REINDEX", "ANALYZE", "CREATE_VTABLE", "DROP_VTABLE", "SAVEPOINT",
)  # fmt: skip
_ACTIONS = {getattr(sqlite3, f"SQLITE_{name}"): name for name in _ACTION_NAMES if hasattr(sqlite3, f"SQLITE_{name}")}
PROGRESS_STEPS = 10_000  # SQLite virtual-machine steps between looks at the budget (well under a millisecond)
INTEGER_AMOUNTS = ("minor units", "whole units")


@dataclass
class SqliteSource(Source):
    """A query on a SQLite file, opened read-only by path; it may use :start and :end (ISO dates).

    Result columns are named like ours (date, amount, reference, account, description).
    Amounts stored as TEXT are parsed like a CSV's ("1234.56"), REAL through their shortest
    decimal text; INTEGER amounts must be declared: `integer_amounts = "minor units"` (12345 is
    123.45 at 2 decimals) or `"whole units"` (12345.00). :start and :end are the period widened by
    `margin_days` (the match tolerance) so items in transit are read as a CSV's would be.
    Only reading statements run (an authorizer refuses writes, ATTACH, VACUUM INTO, PRAGMA), within
    `timeout_seconds` (a progress handler, which also polls `cancel`).
    """

    query: str
    _: KW_ONLY
    integer_amounts: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.integer_amounts not in (None, *INTEGER_AMOUNTS):
            raise OptionError("integer_amounts", f'{self.integer_amounts!r}; use "minor units" or "whole units"')

    def load(self, start: date, end: date, cancel: Cancel | None = None) -> Table:
        if not self.path.is_file():
            raise ReviewError(f"source {self.name!r}: no SQLite file at {self.path}; fix `path` in the schedule")
        budget = Budget(self.name, self.timeout_seconds, cancel)
        margin = timedelta(days=self.margin_days)
        window = {"start": (start - margin).isoformat(), "end": (end + margin).isoformat()}
        refused: list[str] = []
        # as_uri() percent-escapes the path (%, #, ?), so "ledger%41.sqlite" opens that file; mode=ro never creates one.
        db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
        try:
            db.execute("BEGIN")  # one read transaction: the hash below is of the file the query read
            db.set_authorizer(lambda action, *_: sqlite3.SQLITE_OK if action in _READS else _deny(refused, action))
            db.set_progress_handler(budget.exceeded, PROGRESS_STEPS)
            cursor = db.execute(self.query, window)
            names = [column[0] for column in cursor.description or ()]
            for needed in ("date", "amount"):
                if needed not in names:
                    raise ReviewError(f"source {self.name!r}: the query returns {names}, no {needed!r}; "
                                      f"alias a column AS {needed}")  # fmt: skip
            counted = [0]
            table = self._table(self._rows(cursor, names, budget, counted))
            table.sha256, table.rows_read = _file_sha256(self.path), counted[0]
        except sqlite3.Error as exc:
            budget.check()
            if refused:
                asked = ", ".join(dict.fromkeys(refused))
                raise ReviewError(f"source {self.name!r}: the query may only read; it asks for {asked}. "
                                  "Fix `query` (a SELECT)") from None  # fmt: skip
            raise ReviewError(f"source {self.name!r}: the query on {self.path} failed: {exc}; fix `query`") from None
        finally:
            db.close()
        return table

    def _rows(self, cursor: sqlite3.Cursor, names: list[str], budget: Budget, counted: list[int]) -> Iterator[Row]:
        at = {name: i for i, name in enumerate(names)}
        texts = [(key, at[key]) for key in TEXT_COLUMNS if key in at]
        for number, record in enumerate(cursor, start=1):
            if number % CHECK_EVERY == 0:
                budget.check()
            counted[0] = number
            where = f"source {self.name!r}, query row {number}"
            value = record[at["date"]]
            try:  # a date, or a date and time ("2026-10-01 12:00:00"): nothing else is cut off
                if not isinstance(value, str) or value[10:11] not in ("", " ", "T"):
                    raise ValueError
                day = date.fromisoformat(value[:10])
            except ValueError:
                raise ReviewError(f"{where}, column 'date': {value!r} is not an ISO date (YYYY-MM-DD)") from None
            texts_of = {key: "" if record[i] is None else str(record[i]) for key, i in texts}
            yield number, day, self._units(record[at["amount"]], f"{where}, column 'amount'"), texts_of

    def _units(self, value: Any, where: str) -> int:
        try:
            if isinstance(value, int) and not isinstance(value, bool):
                if self.integer_amounts is None:
                    raise ReviewError(f"{value} is stored as an INTEGER; say what integers count with the source's "
                                      '`integer_amounts = "minor units"` (12345 is 123.45) or "whole units"')  # fmt: skip
                return check_units(value if self.integer_amounts == "minor units" else value * 10**self.decimals)
            if isinstance(value, float):
                value = repr(value)  # a float's repr is its shortest exact decimal form: 12.3 -> "12.3"
            if not isinstance(value, str):
                raise ReviewError(f"{value!r} is not an amount (a {type(value).__name__})")
            return parse_amount(value, self.decimals)
        except ReviewError as exc:
            raise ReviewError(f"{where}: {exc}") from None


def _deny(refused: list[str], action: int) -> int:
    refused.append(_ACTIONS.get(action, f"action {action}"))
    return sqlite3.SQLITE_DENY


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# Source kinds by a schedule's `type`: "module:Class", imported when a schedule uses the kind.
SOURCE_KINDS: dict[str, str] = {
    "csv": "nightshift.app.review.sources:CsvSource",
    "sqlite": "nightshift.app.review.sources:SqliteSource",
    "camt053": "nightshift.app.review.formats.camt:Camt053Source",
    "mt940": "nightshift.app.review.formats.mt940:Mt940Source",
    "ofx": "nightshift.app.review.formats.ofx:OfxSource",
    "beancount": "nightshift.app.review.formats.beancount:BeancountSource",
}


def source_kind(kind: str) -> type[Source]:
    """The Source class for a schedule's `type`; ReviewError lists the kinds when there is none."""
    if kind not in SOURCE_KINDS:
        raise ReviewError(f"{kind!r} is not a source type; use one of {', '.join(map(repr, SOURCE_KINDS))}")
    module, name = SOURCE_KINDS[kind].split(":")
    return getattr(importlib.import_module(module), name)
