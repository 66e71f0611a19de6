"""Sources that cannot be misread: a fixed account, unmapped currency/account/balance columns, total rows, and
month- or period-dated balances dated at the period's end; with a German month-end as nobody here wrote it."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest

from bench.helpers.german import GERMAN, german_books
from nightshift.app.review.errors import ReviewError, ScheduleError
from nightshift.app.review.runner import run_checks_for, source_files
from nightshift.app.review.schedule import load_schedule
from nightshift.app.review.sources import CsvSource, date_period, parse_day
from nightshift.app.review.total_rows import says_total
from nightshift.app.review.unmapped import header_kind

ANY = (date(2000, 1, 1), date(2100, 1, 1))


def test_the_german_month_end_balance_check_runs_with_a_fixed_account(tmp_path):
    schedule = load_schedule(german_books(tmp_path))
    checked = run_checks_for(schedule, schedule.as_of)
    result = checked.result
    assert [(run.check, run.state) for run in result.runs] == [("match", "ran"), ("balance", "ran")]
    found = sorted((f.check, f.title, f.amount) for f in result.findings)
    assert found == [
        ("balance", "Bank: opening + movements does not equal closing", Decimal("-100.00")),
        ("match", "In bank, not in ledger: Kontoführungsgebühren", Decimal("-12.50")),
    ]  # the total rows are no findings: neither matched nor unmatched
    balance = next(f for f in result.findings if f.check == "balance")
    roles = balance.figures.roles
    assert (roles["opening_date"], roles["closing_date"]) == (date(2026, 9, 30), date(2026, 10, 31))  # month ends
    assert "closing balance on 2026-10-31 is 4,206.35: -100.00 unexplained" in balance.detail
    bank = checked.tables["bank"]
    assert len(bank) == 9 and bank.rows_read == 11  # both total rows read, neither kept
    assert bank.notes == (
        "2 total rows left out, not read as transactions: line 4 ('Summe September', 1,000.00: the sum of the rows "
        "from line 2); line 12 ('Summe Oktober', -5,893.65: the sum of the rows from line 5)",
    )
    assert checked.tables["saldo"].notes == (
        "dates in the format '%m.%Y' name a month: each row is dated on its last day",
    )


def test_the_reports_data_files_say_how_the_german_files_were_read(tmp_path):
    schedule = load_schedule(german_books(tmp_path))
    files = {file.source: file for file in source_files(run_checks_for(schedule, schedule.as_of))}
    assert (files["bank"].rows, files["bank"].rows_in_period) == (11, 7)  # 11 read, 2 of them total rows left out
    assert files["bank"].notes[0].startswith("2 total rows left out, not read as transactions: line 4")
    assert files["saldo"].notes == ("dates in the format '%m.%Y' name a month: each row is dated on its last day",)


def test_without_the_fixed_account_the_balance_check_could_not_run(tmp_path):
    schedule = load_schedule(german_books(tmp_path, GERMAN.replace('account = "Bank"\ncolumns = { date = "Monat"',
                                                                   'columns = { date = "Monat"')))  # fmt: skip
    result = run_checks_for(schedule, schedule.as_of).result
    assert [run.state for run in result.runs] == ["ran", "not run"]
    assert any("could not run: saldo has no balances for account 'Bank' (it has no account column" in f.title
               for f in result.findings)  # fmt: skip


def test_a_fixed_account_beside_a_mapped_account_column_is_refused(tmp_path):
    text = GERMAN.replace('columns = { date = "Monat", amount = "Kontostand" }',
                          'columns = { date = "Monat", amount = "Kontostand", account = "Konto" }')  # fmt: skip
    with pytest.raises(ScheduleError, match=r"field `sources.saldo.account`: is every row's account for a file "
                                            r"without an account column, but `columns` maps account to 'Konto'"):  # fmt: skip
        load_schedule(german_books(tmp_path, text))


def csv_source(tmp_path: Path, text: str, **options) -> CsvSource:
    path = tmp_path / "bank.csv"
    path.write_text(text, encoding="utf-8")
    options.setdefault("columns", {"date": "Date", "amount": "Amount"})
    return CsvSource("bank", path, **options)


MIXED = "Date,Amount,Currency,Text\n2026-10-01,100.00,EUR,a\n2026-10-02,50.00,€,b\n2026-10-03,75.00,USD,c\n"


def test_an_unmapped_currency_column_with_usd_and_eur_is_refused(tmp_path):
    with pytest.raises(ReviewError) as caught:
        csv_source(tmp_path, MIXED, currency="EUR").load(*ANY)
    assert str(caught.value).startswith(
        f"source 'bank', {tmp_path / 'bank.csv'} line 4: column 'Currency' (not mapped) says 'USD', but the source's "
        "currency is EUR; amounts in two currencies are never added up. Give each currency its own file and source"
    )
    with pytest.raises(
        ReviewError, match=r"line 3: column 'Currency' \(not mapped\) says '€' here and 'EUR' on line 2"
    ):
        csv_source(tmp_path, MIXED).load(*ANY)  # no currency declared: one currency, whichever it is
    table = csv_source(tmp_path, MIXED.replace("USD", "eur"), currency="EUR").load(*ANY)  # the code or a symbol
    assert table.amounts.tolist() == [10000, 5000, 7500]


def test_an_unmapped_account_column_with_two_accounts_is_refused(tmp_path):
    text = (
        "Date,Amount,IBAN,Gegenkonto\n2026-10-01,1.00,DE02,DE77\n2026-10-02,2.00,DE02,DE88\n2026-10-03,3.00,DE03,DE99\n"
    )
    with pytest.raises(ReviewError, match=r"line 4: column 'IBAN' \(not mapped\) says 'DE03' here and 'DE02' on line "
                                          r"2: rows of more than one account. Map it \(`columns.account = 'IBAN'`\)"):  # fmt: skip
        csv_source(tmp_path, text, account="Bank").load(*ANY)
    mapped = csv_source(tmp_path, text, columns={"date": "Date", "amount": "Amount", "account": "IBAN"}).load(*ANY)
    assert mapped.text["account"].tolist() == ["DE02", "DE02", "DE03"]  # the counterparty's Gegenkonto is not watched
    one = csv_source(tmp_path, text.replace("DE03", "DE02"), account="Bank").load(*ANY)
    assert one.text["account"].tolist() == ["Bank"] * 3


BALANCED = "Date,Amount,Saldo\n2026-10-01,-10.00,90.00\n2026-10-02,25.00,\n2026-10-03,5.00,120.00\n"


def test_an_unmapped_running_balance_must_follow_from_the_amounts(tmp_path):
    assert len(csv_source(tmp_path, BALANCED).load(*ANY)) == 3  # oldest first; a row without a balance in between
    newest_first = "Date,Amount,Saldo\n2026-10-03,5.00,120.00\n2026-10-02,25.00,\n2026-10-01,-10.00,90.00\n"
    assert len(csv_source(tmp_path, newest_first).load(*ANY)) == 3
    with pytest.raises(ReviewError) as caught:
        csv_source(tmp_path, BALANCED, sign="inverted").load(*ANY)
    assert str(caught.value).endswith(
        "line 4: column 'Saldo' (not mapped) is a running balance the amounts as read do not add up to: 120.00 after "
        "90.00 on line 2 is a change of 30.00, but the amounts say -30.00 (oldest row first) or 15.00 (newest first). "
        "Check the source's `sign`, `decimal` and which columns are mapped to amount (or debit and credit)"
    )
    by_account = (
        "Date,Account,Amount,Balance\n2026-10-01,A,5.00,5.00\n2026-10-01,B,7.00,107.00\n2026-10-02,A,1.00,6.00\n"
    )
    columns = {"date": "Date", "amount": "Amount", "account": "Account"}
    assert len(csv_source(tmp_path, by_account, columns=columns).load(*ANY)) == 3  # one chain per account
    with pytest.raises(ReviewError, match=r"column 'Account' \(not mapped\) says 'B' here and 'A' on line 2"):
        csv_source(tmp_path, by_account).load(*ANY)
    with pytest.raises(ReviewError, match=r"line 3: column 'Balance' \(not mapped\) is a running balance"):
        csv_source(tmp_path, by_account.replace("Account", "Unit")).load(*ANY)  # read as one account: no chain


def test_a_short_row_leaves_a_watched_column_empty(tmp_path):
    text = "Date,Amount,Text,Currency\n2026-10-01,1.00,a,EUR\n2026-10-02,2.00\n"  # the last row stops at Amount
    assert len(csv_source(tmp_path, text, currency="EUR").load(*ANY)) == 2


def test_a_balance_column_in_another_format_is_said_not_checked(tmp_path):
    table = csv_source(tmp_path, BALANCED.replace("90.00", "90.00 H")).load(*ANY)
    assert table.notes == ("column 'Saldo' names a balance, but line 2's '90.00 H' is not an amount in the source's "
                           "format, so it was not checked against the amounts",)  # fmt: skip


def test_total_rows_are_left_out_never_read_as_transactions(tmp_path):
    text = (
        "Date,Amount,Text\n"
        "2026-10-01,10.00,a\n2026-10-01,20.00,b\n,30.00,Tagessumme\n"  # an undated daily subtotal
        "2026-10-02,-45.00,TOTAL ENERGIES 0815\n"  # reads as a total, sums nothing: a transaction
        "2026-10-02,5.00,c\n2026-10-02,-40.00,d\n"  # -40.00 is the sum of the two before it, but says nothing of totals
        "2026-10-02,-80.00,Total 2 Oct\n"  # the day's three rows
        "2026-10-31,-50.00,Grand total\n"  # every transaction row of the file, subtotals left out
    )
    table = csv_source(tmp_path, text, columns={"date": "Date", "amount": "Amount", "description": "Text"}).load(*ANY)
    assert table.text["description"].tolist() == ["a", "b", "TOTAL ENERGIES 0815", "c", "d"]
    assert table.rows_read == 8
    assert table.notes[0].startswith("3 total rows left out, not read as transactions: line 4 ('Tagessumme', 30.00: "
                                     "the sum of the rows from line 2); line 8 ('Total 2 Oct', -80.00: the sum of "
                                     "the rows from line 5)")  # fmt: skip


def test_a_row_that_is_not_a_total_keeps_its_errors(tmp_path):
    with pytest.raises(ReviewError, match=r"line 4, column 'Date': '' is not a date"):
        csv_source(tmp_path, "Date,Amount,Text\n2026-10-01,10.00,a\n2026-10-01,20.00,b\n,31.00,Summe\n").load(*ANY)
    one = "Date,Amount,Text\n2026-10-01,10.00,a\n2026-10-02,10.00,Total\n"  # a block of one row is no total
    assert len(csv_source(tmp_path, one).load(*ANY)) == 2


def test_balances_are_never_searched_for_totals(tmp_path):
    source = csv_source(tmp_path, "Date,Amount,Text\n2026-08-31,1.00,Saldo\n2026-09-30,2.00,Saldo\n"
                                  "2026-10-31,3.00,Saldo\n")  # fmt: skip
    source.whole = True  # a balance check's balances: 3.00 is a balance, not the sum of the two before
    assert len(source.load(*ANY)) == 3


@pytest.mark.parametrize(
    ("date_format", "text", "day"),
    [
        ("%m.%Y", "10.2026", date(2026, 10, 31)),
        ("%m.%Y", "02.2028", date(2028, 2, 29)),
        ("%Y-%m", "2026-09", date(2026, 9, 30)),
        ("%b %Y", "Dec 2026", date(2026, 12, 31)),
        ("Q%q %Y", "Q3 2026", date(2026, 9, 30)),
        ("%Y-Q%q", "2026-Q4", date(2026, 12, 31)),
        ("%Y", "2026", date(2026, 12, 31)),
        ("%d.%m.%Y", "01.10.2026", date(2026, 10, 1)),
        ("%Y-%j", "2026-274", date(2026, 10, 1)),
    ],
)
def test_a_period_date_is_the_periods_last_day(date_format, text, day):
    assert parse_day(text, date_format, date_period(date_format)) == day


def test_period_date_errors(tmp_path):
    with pytest.raises(ValueError, match="quarter 5 is not 1 to 4"):
        parse_day("Q5 2026", "Q%q %Y", "quarter")
    with pytest.raises(ReviewError, match=r"line 2, column 'Date': 'Q5 2026' is not a date in the format 'Q%q %Y'"):
        csv_source(tmp_path, "Date,Amount\nQ5 2026,1.00\n", date_format="Q%q %Y").load(*ANY)
    with pytest.raises(ReviewError, match=r"`date_format`: '%d Q%q %Y' has a quarter \(%q\) and a month or day"):
        csv_source(tmp_path, "Date,Amount\n", date_format="%d Q%q %Y")


@pytest.mark.parametrize(
    ("cell", "total"),
    [("Summe", True), ("Total général", True), ("Grand Total", True), ("Monatssumme Oktober", True),
     ("Gesamt:", True), ("Saldo", True), ("Totaal", True), ("Suma total", True), ("Итого", True),
     ("TOTAL ENERGIES 0815", True), ("Summer sale", False), ("Totalreparatur", False), ("", False)],
)  # fmt: skip
def test_what_reads_as_a_total(cell, total):
    assert says_total(cell) is total


@pytest.mark.parametrize(
    ("header", "kind"),
    [("Currency", "currency"), ("Währung", "currency"), ("WKZ", "currency"), ("Devise", "currency"),
     ("IBAN", "account"), ("Auftragskonto", "account"), ("Account No.", "account"), ("Gegenkonto", None),
     ("Saldo", "balance"), ("Running balance", "balance"), ("Solde", "balance"), ("Betrag (EUR)", None)],
)  # fmt: skip
def test_which_headers_are_watched(header, kind):
    assert header_kind(header) == kind
