"""Reconciliation checks on small hand-made tables whose right answers are known."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from pathlib import Path

import numpy as np

from nightshift.app.review.checks import MAX_FINDINGS, CheckContext, run_checks
from nightshift.app.review.matching import match
from nightshift.app.review.sources import Table, build_table
from nightshift.app.review.window import window_containing


def table(name: str, rows: list[tuple]) -> Table:
    """rows: (date, amount text, reference[, account])."""
    built = []
    for line, (day, amount, reference, *account) in enumerate(rows, start=1):
        built.append((line, date.fromisoformat(day), int(Decimal(amount) * 100), {"reference": reference,
                      "account": account[0] if account else "", "description": f"row {line}"}))  # fmt: skip
    return build_table(name, Path(f"{name}.csv"), 2, built)


def context(tables: dict[str, Table], as_of: str = "2026-10-15", period: str = "month") -> CheckContext:
    window = window_containing(period, date.fromisoformat(as_of))
    return CheckContext(tables, window, window.previous(), Decimal("1000"))


def test_match_pairs_by_reference_then_amount_and_date():
    bank = table("bank", [("2026-10-01", "100.00", "A"), ("2026-10-05", "50.00", ""), ("2026-10-09", "50.00", "")])
    ledger = table(
        "ledger", [("2026-10-03", "100.00", "A"), ("2026-10-08", "50.00", "X"), ("2026-10-04", "50.00", "Y")]
    )
    result = match(bank, ledger, date_tolerance_days=3)
    pairs = sorted(zip(result.left.tolist(), result.right.tolist()))
    assert pairs == [(0, 0), (1, 2), (2, 1)]  # in date order: 10-05 takes 10-04, 10-09 takes 10-08
    assert result.left_unmatched.size == 0 and result.right_unmatched.size == 0


def test_match_is_one_to_one_and_respects_the_tolerance():
    bank = table("bank", [("2026-10-01", "20.00", ""), ("2026-10-01", "20.00", ""), ("2026-10-20", "9.00", "")])
    ledger = table("ledger", [("2026-10-02", "20.00", ""), ("2026-10-10", "9.00", "")])
    result = match(bank, ledger, date_tolerance_days=3)
    assert result.left.tolist() == [0] and result.right.tolist() == [0]
    assert result.left_unmatched.tolist() == [1, 2]
    assert result.right_unmatched.tolist() == [1]


def test_match_check_reports_unmatched_and_amount_differences():
    bank = table("bank", [("2026-10-01", "100.00", "A"), ("2026-10-02", "1205.00", "B"), ("2026-10-03", "-45.00", "")])
    ledger = table(
        "ledger", [("2026-10-01", "100.00", "A"), ("2026-10-02", "1250.00", "B"), ("2026-10-06", "-830.00", "C")]
    )
    result = run_checks(
        [{"type": "match", "left": "bank", "right": "ledger"}], context({"bank": bank, "ledger": ledger})
    )
    titles = {f.title: f for f in result.findings}
    assert set(titles) == {"Amount differs for reference B", "In bank, not in ledger: row 3",
                           "In ledger, not in bank: C"}  # fmt: skip
    assert titles["Amount differs for reference B"].amount == Decimal("-45.00")
    assert titles["Amount differs for reference B"].severity == "high"
    assert titles["In ledger, not in bank: C"].severity == "medium"  # below materiality
    assert [row["line"] for row in titles["In ledger, not in bank: C"].rows] == [3]


def test_items_in_transit_across_the_period_end_are_not_unmatched():
    bank = table("bank", [("2026-10-01", "70.00", "T")])  # cleared on the 1st
    ledger = table("ledger", [("2026-09-30", "70.00", "T")])  # booked on the 30th
    result = run_checks(
        [{"type": "match", "left": "bank", "right": "ledger"}], context({"bank": bank, "ledger": ledger})
    )
    assert result.findings == []


def test_duplicates_group_identical_rows():
    ledger = table("ledger", [("2026-10-01", "10.00", "A"), ("2026-10-01", "10.00", "A"), ("2026-10-01", "10.00", "B"),
                              ("2026-10-02", "10.00", "A"), ("2026-10-01", "10.00", "A")])  # fmt: skip
    result = run_checks([{"type": "duplicates", "source": "ledger"}], context({"ledger": ledger}))
    assert len(result.findings) == 1
    finding = result.findings[0]
    assert finding.row_count == 3 and [r["line"] for r in finding.rows] == [1, 2, 5]
    assert finding.amount == Decimal("20.00")  # counted twice too many


def test_totals_by_account_and_against_another_source():
    ledger = table("ledger", [("2026-10-01", "10.00", "", "Rent"), ("2026-10-02", "5.50", "", "Rent"),
                              ("2026-10-03", "1.25", "", "Travel"), ("2026-09-03", "99.00", "", "Travel")])  # fmt: skip
    budget = table("budget", [("2026-10-01", "15.50", "", "Rent"), ("2026-10-01", "2.00", "", "Travel")])
    result = run_checks([{"type": "totals", "source": "ledger", "by": "account", "compare": "budget"}],
                        context({"ledger": ledger, "budget": budget}))  # fmt: skip
    assert result.tables[0].rows == [["Rent", "2", "15.50"], ["Travel", "1", "1.25"], ["total", "3", "16.75"]]
    assert [(f.title, f.amount) for f in result.findings] == [("account Travel: totals differ", Decimal("-0.75"))]


def test_balance_roll_forward():
    balances = table("balances", [("2026-09-30", "1000.00", "", "Bank"), ("2026-10-31", "1130.00", "", "Bank")])
    movements = table("bank", [("2026-10-05", "50.00", ""), ("2026-10-06", "-20.00", ""), ("2026-09-05", "7.00", "")])
    checks = [{"type": "balance", "balances": "balances", "movements": "bank", "account": "Bank"}]
    result = run_checks(checks, context({"balances": balances, "bank": movements}))
    assert result.tables[0].rows == [["Bank", "1,000.00", "30.00", "1,130.00", "-100.00"]]
    assert len(result.findings) == 1 and result.findings[0].amount == Decimal("-100.00")
    fixed = table("balances", [("2026-09-30", "1000.00", "", "Bank"), ("2026-10-31", "1030.00", "", "Bank")])
    assert run_checks(checks, context({"balances": fixed, "bank": movements})).findings == []


def test_variance_against_the_previous_period():
    ledger = table("ledger", [("2026-09-10", "-600.00", "", "Travel"), ("2026-10-10", "-2300.00", "", "Travel"),
                              ("2026-09-10", "-4500.00", "", "Rent"), ("2026-10-10", "-4600.00", "", "Rent"),
                              ("2026-10-11", "-50.00", "", "Gifts")])  # fmt: skip
    checks = [{"type": "variance", "source": "ledger", "by": "account", "threshold_pct": 25, "min_change": "100"}]
    result = run_checks(checks, context({"ledger": ledger}))
    assert [f.title for f in result.findings] == ["account Travel: up 283% against September 2026"]
    assert result.findings[0].amount == Decimal("-1700.00")


def test_findings_come_most_severe_first():
    bank = table("bank", [("2026-10-01", "5.00", ""), ("2026-10-01", "5000.00", "")])
    ledger = table("ledger", [("2026-10-20", "7.00", "")])
    result = run_checks(
        [{"type": "match", "left": "bank", "right": "ledger"}], context({"bank": bank, "ledger": ledger})
    )
    assert [(f.severity, f.amount) for f in result.findings] == [
        ("high", Decimal("5000.00")),
        ("medium", Decimal("7.00")),
        ("medium", Decimal("5.00")),
    ]


def test_matching_pairs_every_row_even_when_amounts_repeat():
    rng = np.random.default_rng(0)
    n = 20000
    days = rng.integers(0, 60, n)
    amounts = rng.integers(-3000, 3000, n)  # many equal amounts within days of each other
    rows = [(i + 1, date(2026, 9, 1) + np.timedelta64(int(d), "D").astype(object), int(a), {})
            for i, (d, a) in enumerate(zip(days, amounts))]  # fmt: skip
    left = build_table("a", Path("a"), 2, rows)
    shuffled = rng.permutation(n)
    right = left.where(shuffled)
    right.dates = right.dates + rng.integers(-2, 3, n).astype("timedelta64[D]")
    result = match(left, right, date_tolerance_days=2, use_reference=False)
    assert result.left_unmatched.size == 0 and result.right_unmatched.size == 0
    assert np.array_equal(left.amounts[result.left], right.amounts[result.right])
    assert np.all(np.abs((left.dates[result.left] - right.dates[result.right]).astype(int)) <= 2)


def not_run(result) -> list[str]:
    return [f.title for f in result.findings if f.title.startswith("could not run")]


BANK = table("bank", [("2026-10-05", "50.00", ""), ("2026-10-06", "-20.00", "")])
BALANCE = [{"type": "balance", "balances": "balances", "movements": "bank", "account": "Bank"}]


def test_a_balances_source_without_the_account_cannot_run_and_says_so():
    """The missed 100.00 (issue 17): a balances file with no account column skipped the account without a word."""
    balances = table("balances", [("2026-09-30", "1000.00", ""), ("2026-10-31", "1130.00", "")])  # no account
    result = run_checks(BALANCE, context({"balances": balances, "bank": BANK}))
    assert not_run(result) == ["could not run: balances has no balances for account 'Bank' (it has no account "
                               "column or values); map the account column, give the source a fixed `account`, or name an "
                               "account it has"]  # fmt: skip
    assert result.findings[0].severity == "high" and result.runs[0].state == "not run"
    other = table("balances", [("2026-09-30", "1000.00", "", "Cash"), ("2026-10-31", "1130.00", "", "Cash")])
    assert "its accounts are Cash" in not_run(run_checks(BALANCE, context({"balances": other, "bank": BANK})))[0]


def test_a_balance_without_an_opening_or_closing_balance_cannot_run():
    balances = table("balances", [("2026-10-31", "1130.00", "", "Bank")])  # nothing before October
    result = run_checks(BALANCE, context({"balances": balances, "bank": BANK}))
    assert not_run(result) == ["could not run: Bank: balances has no balance before 2026-10-01 (the opening balance)"]
    balances = table("balances", [("2026-09-30", "1000.00", "", "Bank")])  # nothing in October
    assert (
        "no balance dated in October 2026"
        in not_run(run_checks(BALANCE, context({"balances": balances, "bank": BANK})))[0]
    )


def test_one_account_that_cannot_be_checked_leaves_the_check_partly_run():
    balances = table("balances", [("2026-09-30", "1000.00", "", "Bank"), ("2026-10-31", "1030.00", "", "Bank"),
                                  ("2026-10-31", "10.00", "", "Cash")])  # fmt: skip
    movements = table("ledger", [("2026-10-05", "30.00", "", "Bank"), ("2026-10-05", "10.00", "", "Cash")])
    checks = [{"type": "balance", "balances": "balances", "movements": "ledger"}]
    result = run_checks(checks, context({"balances": balances, "ledger": movements}))
    assert not_run(result) == ["could not run: Cash: balances has no balance before 2026-10-01 (the opening balance)"]
    assert result.runs[0].state == "partly" and result.tables[0].rows[0][0] == "Bank"


def test_a_match_with_an_empty_side_cannot_run():
    empty = table("ledger", [("2026-08-01", "5.00", "")])  # rows, but none near October
    result = run_checks(
        [{"type": "match", "left": "bank", "right": "ledger"}], context({"bank": BANK, "ledger": empty})
    )
    assert not_run(result) == ["could not run: ledger has no rows in October 2026 (nor within 3 days of it), "
                               "so nothing can be matched against it"]  # fmt: skip
    assert len(result.findings) == 1 and result.runs[0].state == "not run"


def test_checks_over_no_rows_or_a_missing_column_cannot_run():
    ledger = table("ledger", [("2026-10-01", "10.00", "A"), ("2026-09-01", "10.00", "A")])  # no account values
    checks = [{"type": "duplicates", "source": "ledger", "keys": ["date", "amount", "account"]},
              {"type": "totals", "source": "ledger", "by": "account"},
              {"type": "variance", "source": "ledger", "by": "category"},
              {"type": "duplicates", "source": "ledger"}]  # fmt: skip
    result = run_checks(checks, context({"ledger": ledger}, as_of="2026-11-15"))
    assert [run.state for run in result.runs] == ["not run"] * 4
    assert sorted(not_run(result)) == sorted([
        "could not run: ledger has no rows in November 2026",
        "could not run: ledger has no rows in November 2026",
        "could not run: ledger has no rows in November 2026",
        "could not run: ledger has no rows in November 2026",
    ])  # fmt: skip
    result = run_checks(checks[:3], context({"ledger": ledger}))
    assert not_run(result) == ["could not run: ledger has no account values (no column mapped to 'account'?)"] * 2 + [
        "could not run: ledger has no column 'category'; map one in the source's `columns`"
    ]


def test_findings_are_capped_per_check_with_the_rest_counted_and_summed():
    rows = [("2026-10-02", f"{n}.00", "") for n in range(1, 251)]  # 1,000 and above are high
    bank = table("bank", [*rows, ("2026-10-02", "1500.00", "")])
    ledger = table("ledger", [("2026-10-20", "0.01", "")])
    checks = [{"type": "match", "left": "bank", "right": "ledger", "max_findings": 10}]
    result = run_checks(checks, context({"bank": bank, "ledger": ledger}))
    listed = [f for f in result.findings if not f.summarized]
    assert [f.amount for f in listed] == [Decimal("1500.00"), *(Decimal(n) for n in range(250, 241, -1))]
    (summary,) = [f for f in result.findings if f.summarized]
    assert summary.summarized == {"medium": 242}  # 241 bank rows and the ledger's 0.01
    assert summary.amount == sum(Decimal(n) for n in range(1, 242)) + Decimal("0.01")
    assert summary.title == "242 more match findings not listed"
    assert result.total_findings == 252 and result.runs[0].findings == 252
    many = table("ledger", [("2026-10-01", "1.00", f"R{n % 300}") for n in range(900)])  # 300 groups of 3
    result = run_checks([{"type": "duplicates", "source": "ledger"}], context({"ledger": many}))
    assert len(result.findings) == MAX_FINDINGS + 1 and result.total_findings == 300


def test_summary_tables_keep_the_largest_groups_and_sum_the_rest():
    ledger = table("ledger", [("2026-10-01", f"{n}.00", "", f"A{n:03d}") for n in range(1, 101)]
                   + [("2026-09-01", "1.00", "", "A001")])  # fmt: skip
    result = run_checks([{"type": "totals", "source": "ledger", "by": "account"},
                         {"type": "variance", "source": "ledger", "by": "account", "threshold_pct": 1000000}],
                        context({"ledger": ledger}))  # fmt: skip
    totals, variance = result.tables
    assert [row[0] for row in totals.rows[:2]] == ["A061", "A062"] and len(totals.rows) == 40 + 2
    assert totals.rows[-2:] == [["60 more", "60", "1,830.00"], ["total", "100", "5,050.00"]]
    assert len(variance.rows) == 40 + 1 and variance.rows[-1][0] == "60 more" and len(variance.chart) == 40
