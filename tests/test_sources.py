"""CSV and SQLite sources: formats, column mapping, exact amounts, and errors that point at the row."""

from __future__ import annotations

import re
import sqlite3
from datetime import date
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from nightshift.app.review.errors import ReviewError
from nightshift.app.review.money import format_amount, parse_amount
from nightshift.app.review.sources import CsvSource, SqliteSource

ANY = (date(2000, 1, 1), date(2100, 1, 1))


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_with_european_formats_and_mapping(tmp_path):
    path = write(tmp_path / "bank.csv", "Tag;Betrag;Ref\n31.10.2026;1.234,56;A-1\n01.11.2026;-0,10;\n")
    source = CsvSource("bank", path, {"date": "Tag", "amount": "Betrag", "reference": "Ref"},
                       delimiter=";", date_format="%d.%m.%Y", decimal=",", thousands=".")  # fmt: skip
    table = source.load(*ANY)
    assert table.dates.tolist() == [date(2026, 10, 31), date(2026, 11, 1)]
    assert table.amounts.tolist() == [123456, -10]
    assert table.text["reference"].tolist() == ["A-1", ""]
    assert table.lines.tolist() == [2, 3]
    assert table.amount(0) == Decimal("1234.56")


def test_amounts_are_exact_where_floats_are_not():
    units = [parse_amount("0.10", 2)] * 3
    assert sum(units) == parse_amount("0.30", 2)  # 0.1 + 0.1 + 0.1 != 0.3 in binary floats
    assert format_amount(sum(units), 2) == "0.30"
    assert parse_amount("(45.00)", 2) == -4500


def test_too_many_decimals_is_an_error_not_a_rounding():
    with pytest.raises(ReviewError, match=re.escape("'1.005' has more than 2 decimals")):
        parse_amount("1.005", 2)


def test_bad_amount_names_the_file_and_line(tmp_path):
    path = write(tmp_path / "x.csv", "date,amount\n2026-10-01,5.00\n2026-10-02,five\n")
    with pytest.raises(ReviewError, match=r"x\.csv line 3: 'five' is not an amount"):
        CsvSource("x", path, {"date": "date", "amount": "amount"}).load(*ANY)


def test_bad_date_names_the_line_and_the_format(tmp_path):
    path = write(tmp_path / "x.csv", "date,amount\n10/01/2026,5.00\n")
    with pytest.raises(ReviewError, match=r"line 2: .*date_format is '%Y-%m-%d'"):
        CsvSource("x", path, {"date": "date", "amount": "amount"}).load(*ANY)


def test_missing_column_lists_the_header(tmp_path):
    path = write(tmp_path / "x.csv", "when;how much\n")
    with pytest.raises(
        ReviewError, match=r"no column\(s\) \['date', 'how much'\].*header is \['when;how much'\].*delimiter"
    ):
        CsvSource("x", path, {"date": "date", "amount": "how much"}).load(*ANY)


def test_missing_file(tmp_path):
    with pytest.raises(ReviewError, match=r"no file at .*nope\.csv; fix `path`"):
        CsvSource("x", tmp_path / "nope.csv", {"date": "d", "amount": "a"}).load(*ANY)


def test_sqlite_query_with_window_parameters(tmp_path):
    path = tmp_path / "ledger.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE e (posted TEXT, amount, account TEXT)")
        db.executemany("INSERT INTO e VALUES (?, ?, ?)", [("2026-09-30", "1.50", "A"), ("2026-10-01", 12.3, "B"),
                                                          ("2026-10-02", 7, "B")])  # fmt: skip
    db.close()
    source = SqliteSource("ledger", path, "SELECT posted AS date, amount, account FROM e WHERE posted >= :start")
    table = source.load(date(2026, 10, 1), date(2026, 10, 31))
    assert table.amounts.tolist() == [1230, 700]  # REAL 12.3 read as its decimal text, INTEGER 7 as 7.00
    assert table.text["account"].tolist() == ["B", "B"]
    assert table.dates.dtype == np.dtype("datetime64[D]")


def test_sqlite_errors_say_what_to_fix(tmp_path):
    path = tmp_path / "l.sqlite"
    sqlite3.connect(path).execute("CREATE TABLE e (d TEXT, a TEXT)").connection.close()
    with pytest.raises(ReviewError, match=r"the query on .* failed: no such table: nope; fix `query`"):
        SqliteSource("l", path, "SELECT * FROM nope").load(*ANY)
    with pytest.raises(ReviewError, match=r"returns \['d', 'a'\], no 'date'; alias a column AS date"):
        SqliteSource("l", path, "SELECT d, a FROM e").load(*ANY)
