"""Writes the bundled sample data: a bank statement (CSV) and a ledger (SQLite) for September and October 2026.

Deterministic (fixed seed), so running it again rewrites the same files. The
books reconcile except for the discrepancies planted below on purpose; the
bundled reviews must find every one (tests/test_review_bundled.py lists them):

  daily    2026-10-30  ledger posts INV-5010 twice; bank charges 45.00 not in the ledger
  weekly   2026-W44    cheque CHQ-1042 (830.00) in the ledger, not yet in the bank;
                       INV-5004 is 1,250.00 in the ledger but 1,205.00 in the bank
  monthly  2026-10     insurance direct debit 1,480.00 in the bank, not in the ledger;
                       the ledger's closing bank balance is 100.00 above opening + movements;
                       Travel jumps from about 600 in September to about 2,300 in October

Run: python schedules/sample-data/generate.py
"""

from __future__ import annotations

import csv
import random
import sqlite3
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path

HERE = Path(__file__).parent
START, END = date(2026, 9, 1), date(2026, 10, 31)
OPENING = Decimal("52340.00")


def business_days(start: date, end: date):
    day = start
    while day <= end:
        if day.weekday() < 5:
            yield day
        day += timedelta(days=1)


def clearing(day: date, rng: random.Random) -> date:
    """The bank books a ledger item 0 or 1 business day later (3 calendar days over a weekend)."""
    cleared = day
    for _ in range(rng.choice((0, 0, 1))):
        cleared += timedelta(days=1)
        while cleared.weekday() >= 5:
            cleared += timedelta(days=1)
    return cleared


def ledger_entries(rng: random.Random) -> list[tuple[date, str, Decimal, str, str]]:
    entries = []
    invoice = 4900
    for day in business_days(START, END):
        for _ in range(rng.randint(2, 3)):
            invoice += 1
            amount = (Decimal(rng.randint(20000, 300000)) / 100).quantize(Decimal("0.01"))
            entries.append((day, "Sales", amount, f"INV-{invoice}", "Customer receipt"))
        if day.weekday() == 0:
            entries.append((day, "Purchases", Decimal("-3120.00"), f"PO-{day:%m%d}", "Supplier run"))
    for month in (9, 10):
        first = next(business_days(date(2026, month, 1), END))
        entries += [
            (first, "Rent", Decimal("-4500.00"), f"RENT-{month:02d}", "Office rent"),
            (date(2026, month, 25) if date(2026, month, 25).weekday() < 5 else date(2026, month, 23),
             "Payroll", Decimal("-18250.00"), f"PAY-{month:02d}", "Salaries"),
            (date(2026, month, 15), "Utilities", Decimal("-412.37"), f"UTIL-{month:02d}", "Electricity"),
            (date(2026, month, 5), "Software", Decimal("-289.00"), f"SW-{month:02d}", "Subscriptions"),
        ]
    travel = {9: ["212.40", "187.60", "240.00"], 10: ["640.00", "455.80", "1214.20"]}
    for month, amounts in travel.items():
        for n, amount in enumerate(amounts):
            entries.append((date(2026, month, 7 + 6 * n), "Travel", -Decimal(amount), f"TRV-{month:02d}{n}", "Travel"))
    return sorted(entries, key=lambda entry: (entry[0], entry[3]))


def main() -> None:
    rng = random.Random(2026)
    ledger = ledger_entries(rng)
    mismatch = next(e for e in ledger if e[0] == date(2026, 10, 27) and e[1] == "Sales")
    duplicate = next(e for e in ledger if e[0] == date(2026, 10, 30) and e[1] == "Sales")
    # Planted discrepancies (see the module docstring). Both planted invoices clear the same day.
    ledger = [(e[0], e[1], Decimal("1250.00"), *e[3:]) if e is mismatch else e for e in ledger]
    bank = [
        (e[0] if e in (mismatch, duplicate) else clearing(e[0], rng), e[2], e[3], e[4]) for e in ledger
    ]
    bank = [(d, Decimal("1205.00"), ref, m) if ref == mismatch[3] else (d, a, ref, m) for d, a, ref, m in bank]
    ledger.append((date(2026, 10, 28), "Purchases", Decimal("-830.00"), "CHQ-1042", "Cheque to Hale & Sons"))
    ledger.append(duplicate)
    bank.append((date(2026, 10, 30), Decimal("-45.00"), "", "BANK CHARGES OCT"))
    bank.append((date(2026, 10, 9), Decimal("-1480.00"), "DD-77120", "Direct debit Northwind Insurance"))
    ledger.sort(key=lambda entry: (entry[0], entry[3]))
    bank.sort(key=lambda row: (row[0], row[2]))

    with (HERE / "bank-statement.csv").open("w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle, delimiter=";", lineterminator="\n")
        out.writerow(["Booking date", "Amount", "Reference", "Text"])
        for day, amount, ref, memo in bank:
            text = f"{amount:,.2f}".replace(",", " ").replace(".", ",").replace(" ", ".")
            out.writerow([day.strftime("%d.%m.%Y"), text, ref, memo])

    balances = [("Bank", date(2026, 8, 31), OPENING)]
    for month_end, start in ((date(2026, 9, 30), date(2026, 9, 1)), (date(2026, 10, 31), date(2026, 10, 1))):
        moved = sum(amount for day, _, amount, _, _ in ledger if start <= day <= month_end)
        balances.append(("Bank", month_end, balances[-1][2] + moved))
    balances[-1] = ("Bank", balances[-1][1], balances[-1][2] + Decimal("100.00"))

    target = HERE / "ledger.sqlite"
    target.unlink(missing_ok=True)
    with sqlite3.connect(target) as db:
        db.execute("CREATE TABLE entries (posted TEXT, account TEXT, amount TEXT, ref TEXT, memo TEXT)")
        db.executemany("INSERT INTO entries VALUES (?, ?, ?, ?, ?)",
                       [(d.isoformat(), acc, str(a), ref, memo) for d, acc, a, ref, memo in ledger])  # fmt: skip
        db.execute("CREATE TABLE balances (account TEXT, date TEXT, balance TEXT)")
        db.executemany("INSERT INTO balances VALUES (?, ?, ?)", [(acc, d.isoformat(), str(b)) for acc, d, b in balances])
    db.close()


if __name__ == "__main__":
    main()
