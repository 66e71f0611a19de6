"""CSV and SQLite sources: formats, column mapping, exact amounts, and errors that point at the row."""

from __future__ import annotations

import codecs
import hashlib
import re
import sqlite3
from datetime import date
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from nightshift.app.review.errors import ReviewError, ScheduleError
from nightshift.app.review.money import format_amount, parse_amount
from nightshift.app.review.schedule import load_schedule
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
    with pytest.raises(ReviewError, match=r"x\.csv line 3, column 'amount': 'five' is not an amount"):
        CsvSource("x", path, {"date": "date", "amount": "amount"}).load(*ANY)


def test_bad_date_names_the_line_and_the_format(tmp_path):
    path = write(tmp_path / "x.csv", "date,amount\n10/01/2026,5.00\n")
    with pytest.raises(
        ReviewError, match=r"line 2, column 'date': '10/01/2026' is not a date in the format '%Y-%m-%d'"
    ):
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
                                                          ("2026-10-02", "7", "B")])  # fmt: skip
    db.close()
    source = SqliteSource("ledger", path, "SELECT posted AS date, amount, account FROM e WHERE posted >= :start")
    table = source.load(date(2026, 10, 1), date(2026, 10, 31))
    assert table.amounts.tolist() == [1230, 700]  # REAL 12.3 read as its decimal text, TEXT 7 as 7.00
    assert table.text["account"].tolist() == ["B", "B"]
    assert table.dates.dtype == np.dtype("datetime64[D]")


def test_sqlite_errors_say_what_to_fix(tmp_path):
    path = tmp_path / "l.sqlite"
    sqlite3.connect(path).execute("CREATE TABLE e (d TEXT, a TEXT)").connection.close()
    with pytest.raises(ReviewError, match=r"the query on .* failed: no such table: nope; fix `query`"):
        SqliteSource("l", path, "SELECT * FROM nope").load(*ANY)
    with pytest.raises(ReviewError, match=r"returns \['d', 'a'\], no 'date'; alias a column AS date"):
        SqliteSource("l", path, "SELECT d, a FROM e").load(*ANY)


def ledger_db(path: Path, rows: list[tuple], amount_type: str = "", date_type: str = "TEXT") -> Path:
    with sqlite3.connect(path) as db:
        db.execute(f"CREATE TABLE e (date {date_type}, amount {amount_type}, reference TEXT)")
        db.executemany("INSERT INTO e VALUES (?, ?, ?)", rows)
    db.close()
    return path


QUERY = "SELECT date, amount, reference FROM e WHERE date BETWEEN :start AND :end"


def test_sqlite_integer_amounts_are_read_as_declared_never_guessed(tmp_path):
    path = ledger_db(tmp_path / "l.sqlite", [("2026-10-01", 12345, "A")], "INTEGER")
    minor = SqliteSource("l", path, QUERY, integer_amounts="minor units").load(*ANY)
    assert minor.amount(0) == Decimal("123.45")  # the docstring's minor units, not 12,345.00
    assert SqliteSource("l", path, QUERY, integer_amounts="whole units").load(*ANY).amount(0) == Decimal("12345.00")
    with pytest.raises(ReviewError, match=r"query row 1, column 'amount': 12345 is stored as an INTEGER.*"
                                          r"integer_amounts = \"minor units\""):  # fmt: skip
        SqliteSource("l", path, QUERY).load(*ANY)


@pytest.mark.parametrize("name", ["ledger%41.sqlite", "Ledger #2.sqlite", "what?mode=rwc.sqlite"])
def test_sqlite_opens_exactly_its_path_read_only(tmp_path, name):
    ledger_db(tmp_path / "ledgerA.sqlite", [("2026-10-01", "1.00", "WRONG FILE")])
    ledger_db(tmp_path / name, [("2026-10-01", "2.00", "RIGHT FILE")])
    before = sorted(p.name for p in tmp_path.iterdir())
    table = SqliteSource("l", tmp_path / name, QUERY).load(*ANY)
    assert table.text["reference"].tolist() == ["RIGHT FILE"]
    with pytest.raises(ReviewError, match="may only read; it asks for INSERT"):
        SqliteSource("l", tmp_path / name, "INSERT INTO e VALUES ('2026-10-02', '1', 'x') RETURNING *").load(*ANY)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no "Ledger " or journal left behind
    with pytest.raises(ReviewError, match="no SQLite file"):
        SqliteSource("l", tmp_path / name.replace(".sqlite", "-missing.sqlite"), QUERY).load(*ANY)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    ("query", "asked"),
    [
        ("ATTACH '{out}' AS other", "ATTACH"),
        ("VACUUM INTO '{out}'", "cannot VACUUM"),  # in the read transaction; outside one the authorizer sees ATTACH
        ("PRAGMA journal_mode = WAL", "PRAGMA"),
        ("DELETE FROM e", "DELETE"),
        ("CREATE TEMP TABLE t AS SELECT * FROM e", "INSERT"),  # into sqlite_temp_master: the first step it is refused
        ("SELECT date, amount FROM e; DROP TABLE e", None),
    ],
)
def test_sqlite_refuses_statements_that_write_or_attach(tmp_path, query, asked):
    path = ledger_db(tmp_path / "l.sqlite", [("2026-10-01", "1.00", "A")])
    out = tmp_path / "copy.sqlite"
    expected = (
        "one statement at a time"
        if asked is None
        else asked
        if "VACUUM" in asked
        else f"may only read; it asks for {asked}"
    )
    with pytest.raises(ReviewError, match=expected):
        SqliteSource("l", path, query.format(out=out)).load(*ANY)
    assert not out.exists()
    assert SqliteSource("l", path, QUERY).load(*ANY).text["reference"].tolist() == ["A"]


ENDLESS = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT '2026-10-01' AS date, '1' AS amount FROM n WHERE i < 0"


def test_a_query_that_never_ends_stops_at_its_budget_or_when_cancelled(tmp_path):
    from nightshift.app.review.errors import ReviewInterrupted

    path = ledger_db(tmp_path / "l.sqlite", [])
    with pytest.raises(ReviewError, match=r"longer than its 0.2 s budget; raise its `timeout_seconds`"):
        SqliteSource("l", path, ENDLESS, timeout_seconds=0.2).load(*ANY)
    calls = []
    with pytest.raises(ReviewInterrupted, match="stopped while loading"):
        SqliteSource("l", path, ENDLESS).load(*ANY, cancel=lambda: calls.append(1) or len(calls) > 3)


def test_the_sql_window_is_widened_by_the_match_tolerance(tmp_path):
    """A bank line on 2 October clears a ledger item of 30 September: a September review must read it."""
    ledger_db(tmp_path / "bank.sqlite", [("2026-10-02", "830.00", "CHQ-1"), ("2026-10-09", "5.00", "LATER")])
    schedule = write(tmp_path / "s.toml", SCHEDULE.format(bank=BANK_SQL, ledger=LEDGER_CSV, check=MATCH))
    write(tmp_path / "ledger.csv", "date,amount,reference\n2026-09-30,830.00,CHQ-1\n")
    loaded = load_schedule(schedule)
    bank = loaded.sources["bank"]
    assert bank.margin_days == 3
    table = bank.load(date(2026, 9, 1), date(2026, 9, 30))
    assert table.text["reference"].tolist() == ["CHQ-1"]  # read up to 3 October, not the 9th
    from nightshift.app.review.checks import CheckContext, check_match
    from nightshift.app.review.window import window_containing

    window = window_containing("month", date(2026, 9, 15))
    tables = {name: source.load(window.previous().start, window.end) for name, source in loaded.sources.items()}
    result = check_match(
        {"left": "bank", "right": "ledger"}, CheckContext(tables, window, window.previous(), Decimal(0))
    )
    assert result.findings == []  # in transit, as it is when both sources are CSV files


SCHEDULE = """name = "t"
when = "every day"
[sources.bank]
{bank}
[sources.ledger]
{ledger}
[[checks]]
{check}
"""
BANK_SQL = f'type = "sqlite"\npath = "bank.sqlite"\nquery = "{QUERY}"'
LEDGER_CSV = (
    'type = "csv"\npath = "ledger.csv"\ncolumns = { date = "date", amount = "amount", reference = "reference" }'
)
MATCH = 'type = "match"\nleft = "bank"\nright = "ledger"\ndate_tolerance_days = 3'


def test_sources_with_different_decimals_are_compared_at_one_scale(tmp_path):
    """Bank 125.00 (2 decimals) against ledger 12.500 (3 decimals): different amounts, never a match."""
    write(tmp_path / "bank.csv", "date,amount,reference\n2026-10-01,125.00,X\n")
    write(tmp_path / "ledger.csv", "date,amount,reference\n2026-10-01,12.500,X\n")
    bank = 'type = "csv"\npath = "bank.csv"\ncolumns = { date = "date", amount = "amount", reference = "reference" }'
    ledger = LEDGER_CSV + "\ndecimals = 3"
    loaded = load_schedule(write(tmp_path / "s.toml", SCHEDULE.format(bank=bank, ledger=ledger, check=MATCH)))
    tables = {name: source.load(*ANY) for name, source in loaded.sources.items()}
    assert tables["bank"].scale == tables["ledger"].scale == 3
    assert tables["bank"].amounts.tolist() == [125000] and tables["ledger"].amounts.tolist() == [12500]
    assert tables["bank"].amount(0) == Decimal("125") and tables["ledger"].amount(0) == Decimal("12.5")


def test_sources_of_two_currencies_compare_only_as_the_schedule_says(tmp_path):
    """Refused unless one source declares how it converts: a rate and a rounding, which the report states."""
    bank = 'type = "csv"\npath = "bank.csv"\ncurrency = "EUR"'
    ledger = LEDGER_CSV + '\ncurrency = "USD"'
    with pytest.raises(ScheduleError, match=r"field `checks\[0\]`: compares bank in EUR, ledger in USD.*convert ="):
        load_schedule(write(tmp_path / "s.toml", SCHEDULE.format(bank=bank, ledger=ledger, check=MATCH)))
    write(tmp_path / "bank.csv", "date,amount\n2026-10-01,92.31\n")
    write(tmp_path / "ledger.csv", "date,amount,reference\n2026-10-01,100.00,A\n2026-10-02,0.05,B\n2026-10-03,0.15,C\n")
    converted = ledger + '\nconvert = { to = "EUR", rate = "0.9231", rounding = "half-even" }'
    loaded = load_schedule(write(tmp_path / "s.toml", SCHEDULE.format(bank=bank, ledger=converted, check=MATCH)))
    table = loaded.sources["ledger"].load(*ANY)
    assert table.currency == "EUR" and table.amounts.tolist() == [9231, 5, 14]  # 0.046155 -> 0.05, 0.138465 -> 0.14
    assert table.notes == ("amounts converted from USD to EUR at 0.9231, each rounded half-even to 2 decimals",)
    bad = ledger + '\nconvert = { to = "EUR", rate = "-1", rounding = "half-even" }'
    with pytest.raises(ScheduleError, match=r"field `sources.ledger.convert`: rate '-1' is not a positive decimal"):
        load_schedule(write(tmp_path / "s.toml", SCHEDULE.format(bank=bank, ledger=bad, check=MATCH)))


@pytest.mark.parametrize(
    ("where", "line", "message"),
    [
        (
            "bank",
            "amount_in_minor_units = true",
            r":7: field `sources.bank.amount_in_minor_units`: is not a known "
            r"key; the nearest known key is `integer_amounts`",
        ),
        (
            "check",
            "date_tolerance = 5",
            r"field `checks\[0\].date_tolerance`: .* nearest known key is "
            r"`date_tolerance_days`",
        ),
        ("top", "materialty = 5", r"field `materialty`: .* nearest known key is `materiality`"),
        (
            "ledger",
            'decimal = ","\nthousands = ","',
            r"field `sources.ledger.decimal`: decimal and thousands are "
            r"both ','",
        ),
        ("ledger", 'encoding = "klingon"', r"field `sources.ledger.encoding`: 'klingon' is not an encoding"),
        ("ledger", 'currency = "EUX"', r"field `sources.ledger.currency`: 'EUX' is not an ISO 4217"),
        ("bank", 'integer_amounts = "cents"', r"field `sources.bank.integer_amounts`: 'cents'; use"),
        ("ledger", 'negative = ["sideways"]', r"field `sources.ledger.negative`: \['sideways'\] unknown"),
    ],
)
def test_schedule_keys_are_checked_never_ignored(tmp_path, where, line, message):
    parts = {"bank": BANK_SQL, "ledger": LEDGER_CSV, "check": MATCH}
    text = SCHEDULE.format(**{key: value + (f"\n{line}" if key == where else "") for key, value in parts.items()})
    text = f"{line}\n{text}" if where == "top" else text
    with pytest.raises(ScheduleError, match=message):
        load_schedule(write(tmp_path / "s.toml", text))


def test_the_hash_and_count_are_of_the_bytes_read(tmp_path):
    """A file changed after it was read: the provenance keeps the hash and count of what the figures came from."""
    path = write(tmp_path / "bank.csv", "date,amount\n2026-10-01,1.00\n\n2026-10-02,2.00\n")
    read = path.read_bytes()
    table = CsvSource("bank", path).load(*ANY)
    write(path, "date,amount\n2026-10-01,1.00\n2026-10-02,2.00\n2026-10-03,3.00\n")
    assert table.sha256 == hashlib.sha256(read).hexdigest() and table.rows_read == 2
    ledger = ledger_db(tmp_path / "l.sqlite", [("2026-10-01", "1.00", "A"), ("2026-10-02", "2.00", "B")])
    stored = ledger.read_bytes()
    sql = SqliteSource("l", ledger, QUERY).load(*ANY)
    assert sql.sha256 == hashlib.sha256(stored).hexdigest() and sql.rows_read == 2


CP1252 = "date;amount;text\n2026-10-01;-12,50;Müller – Gebühr €\n".encode("cp1252")


def test_declared_encodings_and_byte_order_marks(tmp_path):
    columns = {"date": "date", "amount": "amount", "description": "text"}
    path = tmp_path / "bank.csv"
    path.write_bytes(CP1252)
    source = CsvSource("bank", path, columns, delimiter=";", decimal=",", encoding="cp1252")
    assert source.load(*ANY).text["description"].tolist() == ["Müller – Gebühr €"]
    with pytest.raises(ReviewError, match=r"line 2: byte 0xfc is not utf-8 text; set the source's `encoding`"):
        CsvSource("bank", path, columns, delimiter=";", decimal=",").load(*ANY)
    text = "date;amount;text\n2026-10-01;-12,50;Müller – Gebühr €\n"
    path.write_bytes(codecs.BOM_UTF8 + text.encode())
    assert CsvSource("bank", path, columns, delimiter=";", decimal=",").load(*ANY).amounts.tolist() == [-1250]
    path.write_bytes(text.encode("utf-16"))  # with its byte-order mark
    assert CsvSource("bank", path, columns, delimiter=";", decimal=",", encoding="utf-16").load(*ANY).amounts.tolist() == [-1250]  # fmt: skip
    with pytest.raises(ReviewError, match=r"starts with a utf-16 byte-order mark but `encoding` is 'cp1252'"):
        CsvSource("bank", path, columns, delimiter=";", decimal=",", encoding="cp1252").load(*ANY)


def test_a_detected_encoding_is_said(tmp_path):
    path = tmp_path / "bank.csv"
    path.write_bytes(
        ("date;amount;text\n" + "2026-10-01;-12,50;Müller Gebühren für Überweisung\n" * 40).encode("cp1252")
    )
    table = CsvSource("bank", path, {"date": "date", "amount": "amount", "description": "text"}, delimiter=";",
                      decimal=",", encoding="auto").load(*ANY)  # fmt: skip
    assert table.text["description"][0] == "Müller Gebühren für Überweisung"
    (note,) = table.notes  # the codec it guessed (cp1250 and cp1252 read these letters alike): said, not hidden
    assert re.fullmatch(r"encoding cp125\d detected by charset-normalizer from the first 2,017 bytes", note)
    path.write_bytes(b"")
    with pytest.raises(ReviewError, match="is empty"):  # not "cannot tell the encoding"
        CsvSource("bank", path, encoding="auto").load(*ANY)


def test_debit_and_credit_columns_and_an_inverted_sign(tmp_path):
    path = write(tmp_path / "bank.csv", "date;Soll;Haben\n2026-10-01;45,00;\n2026-10-02;0,00;1.200,00\n")
    pair = {"date": "date", "debit": "Soll", "credit": "Haben"}
    source = CsvSource("bank", path, pair, delimiter=";", decimal=",", thousands=".")
    assert source.load(*ANY).amounts.tolist() == [-4500, 120000]
    inverted = CsvSource("bank", path, pair, delimiter=";", decimal=",", thousands=".", sign="inverted")
    assert inverted.load(*ANY).amounts.tolist() == [4500, -120000]
    for row, message in (("2026-10-03;1,00;2,00", "both debit and credit are filled"),
                         ("2026-10-03;;", "neither debit nor credit is filled"),
                         ("2026-10-03;-1,00;", r"column 'Soll': '-1,00' is negative in a debit column")):  # fmt: skip
        write(path, f"date;Soll;Haben\n{row}\n")
        with pytest.raises(ReviewError, match=rf"bank\.csv line 2.*{message}"):
            source.load(*ANY)


def test_a_csv_load_keeps_its_budget_and_stops_when_cancelled(tmp_path):
    from nightshift.app.review.errors import ReviewInterrupted

    path = write(tmp_path / "big.csv", "date,amount\n" + "2026-10-01,1.00\n" * 10_000)
    with pytest.raises(ReviewInterrupted, match="stopped while loading"):
        CsvSource("big", path).load(*ANY, cancel=lambda: True)
    assert len(CsvSource("big", path).load(*ANY, cancel=lambda: False)) == 10_000


def test_the_report_lists_each_file_as_it_was_read(tmp_path):
    """The runner's provenance takes the hash and count from the load, not from the file as it is afterwards."""
    from nightshift.app.review.runner import run_checks_for, source_files

    bank = 'type = "csv"\npath = "bank.csv"\ncolumns = { date = "date", amount = "amount", reference = "reference" }'
    write(tmp_path / "bank.csv", "date,amount,reference\n2026-10-01,5.00,A\n")
    write(tmp_path / "ledger.csv", "date,amount,reference\n2026-10-01,5.00,A\n")
    read = (tmp_path / "bank.csv").read_bytes()
    schedule = load_schedule(write(tmp_path / "s.toml", SCHEDULE.format(bank=bank, ledger=LEDGER_CSV, check=MATCH)))
    checked = run_checks_for(schedule, date(2026, 10, 15))
    write(tmp_path / "bank.csv", "date,amount,reference\n2026-10-01,5.00,A\n2026-10-02,7.00,B\n")
    files = {file.source: file for file in source_files(checked)}
    assert files["bank"].sha256 == hashlib.sha256(read).hexdigest() and files["bank"].rows == 1


def test_a_csv_keeps_the_rows_of_its_window_and_checks_them_all(tmp_path):
    """Memory follows the review's rows: rows outside the widened window are parsed (an error fails) but not kept."""
    rows = "".join(f"20{year}-10-01,1.00,Y{year}\n" for year in range(10, 26)) + "2026-10-02,2.00,NOW\n"
    path = write(tmp_path / "bank.csv", "date,amount,reference\n" + rows)
    source = CsvSource("bank", path, {"date": "date", "amount": "amount", "reference": "reference"}, margin_days=3)
    table = source.load(date(2026, 10, 5), date(2026, 10, 31))
    assert table.text["reference"].tolist() == ["NOW"] and table.rows_read == 17
    source.whole = True  # a balance check's balances: an opening balance may be years old
    assert len(source.load(date(2026, 10, 5), date(2026, 10, 31))) == 17
    write(path, "date,amount,reference\n2015-01-01,1e5,OLD\n2026-10-02,2.00,NOW\n")
    with pytest.raises(ReviewError, match="line 2, column 'amount': '1e5' is in exponent notation"):
        source.load(date(2026, 10, 5), date(2026, 10, 31))


def test_the_schedule_sets_each_sources_window_and_scale():
    from nightshift.app.review.schedule import BUNDLED_DIR

    sources = load_schedule(BUNDLED_DIR / "month-end.toml").sources
    assert {name: (s.margin_days, s.whole, s.held_scale) for name, s in sources.items()} == {
        "bank": (3, False, 2), "ledger": (3, False, 2), "balances": (0, True, 2)}  # fmt: skip


def test_a_schedule_declares_a_csv_encoding(tmp_path):
    """A cp1252 bank export read through a schedule (before, `encoding` was not a schedule key)."""
    (tmp_path / "bank.csv").write_bytes(b"date;amount;reference\n2026-10-01;-12,50;M\xfcller\n")
    bank = ('type = "csv"\npath = "bank.csv"\ndelimiter = ";"\ndecimal = ","\nencoding = "cp1252"\n'
            'columns = { date = "date", amount = "amount", reference = "reference" }')  # fmt: skip
    loaded = load_schedule(write(tmp_path / "s.toml", SCHEDULE.format(bank=bank, ledger=LEDGER_CSV, check=MATCH)))
    assert loaded.sources["bank"].load(*ANY).text["reference"].tolist() == ["Müller"]


def test_a_currency_column_must_hold_the_sources_currency(tmp_path):
    path = write(tmp_path / "bank.csv", "date,amount,ccy\n2026-10-01,5.00,EUR\n2026-10-02,7.00,USD\n")
    source = CsvSource("bank", path, {"date": "date", "amount": "amount", "currency": "ccy"}, currency="EUR")
    with pytest.raises(ReviewError, match=r"line 3, column 'ccy': 'USD' is not the source's currency EUR"):
        source.load(*ANY)
    with pytest.raises(ReviewError, match=r"declare the source's `currency`"):
        CsvSource("bank", path, {"date": "date", "amount": "amount", "currency": "ccy"})


@pytest.mark.parametrize("value", ["2026-10-01x", "2026-10-0", "01.10.2026", 2461315.5])
def test_a_sql_date_is_an_iso_date_or_date_and_time(tmp_path, value):
    path = ledger_db(tmp_path / "l.sqlite", [("2026-10-01 12:30:00", "1.00", "A"), ("2026-10-02T08:00", "2.00", "B")])
    assert SqliteSource("l", path, QUERY.replace(" WHERE date BETWEEN :start AND :end", "")).load(*ANY).dates.astype(
        str).tolist() == ["2026-10-01", "2026-10-02"]  # fmt: skip
    bad = ledger_db(tmp_path / "bad.sqlite", [(value, "1.00", "A")], date_type="")  # a julian day stays a REAL
    with pytest.raises(ReviewError, match=r"query row 1, column 'date': .* is not an ISO date"):
        SqliteSource("l", bad, "SELECT date, amount FROM e").load(*ANY)


def test_a_review_cancelled_while_a_query_runs_stops_there(tmp_path):
    """run_review hands its cancel Event to the loads: a query that never ends stops, no model is loaded."""
    import threading

    from nightshift.app.review.errors import ReviewInterrupted
    from nightshift.app.review.runner import run_review

    ledger_db(tmp_path / "bank.sqlite", [])
    bank = f'type = "sqlite"\npath = "bank.sqlite"\nquery = "{ENDLESS}"'
    write(tmp_path / "ledger.csv", "date,amount,reference\n2026-10-01,1.00,A\n")
    schedule = load_schedule(write(tmp_path / "s.toml", SCHEDULE.format(bank=bank, ledger=LEDGER_CSV, check=MATCH)))
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    with pytest.raises(ReviewInterrupted, match="source 'bank': stopped while loading"):
        run_review(schedule, date(2026, 10, 15), tmp_path / "no-model", cancel=cancel,
                   load_model=lambda _: pytest.fail("no model is loaded for a cancelled run"))  # fmt: skip
