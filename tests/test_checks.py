"""Reconciliation checks on small hand-made tables whose right answers are known."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from pathlib import Path

import numpy as np

from nightshift.app.review.checks import CheckContext, run_checks
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
    ledger = table("ledger", [])
    result = run_checks(
        [{"type": "match", "left": "bank", "right": "ledger"}], context({"bank": bank, "ledger": ledger})
    )
    assert [f.severity for f in result.findings] == ["high", "medium"]


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
