"""Benchmark: reconciliation checks on a million rows, numpy against plain Python, side by side.

    python -m app.review.benchmark --rows 1000000

Writes a synthetic bank statement and ledger (CSV) of ROWS rows each into a
temporary folder, with a known number of planted unmatched rows, times loading
them and each check, and times the same greedy matching written as plain
Python dictionaries, checking both pair the same number of rows. Prints a
table and one JSON line of figures to record.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from collections import defaultdict
from datetime import date
from pathlib import Path

import numpy as np

from app.review.checks import CheckContext, check_duplicates, check_totals
from app.review.matching import match
from app.review.sources import CsvSource, Table
from app.review.window import window_containing

ACCOUNTS = np.array(["Sales", "Purchases", "Rent", "Payroll", "Travel", "Utilities", "Software", "Fees"])


def write_sample(folder: Path, rows: int, missing: int, seed: int = 0) -> None:
    """bank.csv and ledger.csv: the same rows, the bank's dated 0-2 days later, `missing` bank rows dropped."""
    rng = np.random.default_rng(seed)
    days = np.datetime64("2026-10-01") + rng.integers(0, 31, rows).astype("timedelta64[D]")
    cents = rng.integers(-500_000, 500_000, rows)
    accounts = ACCOUNTS[rng.integers(0, len(ACCOUNTS), rows)]
    amounts = [f"{c // 100}.{c % 100:02d}" if c >= 0 else f"-{-c // 100}.{-c % 100:02d}" for c in cents.tolist()]
    with (folder / "ledger.csv").open("w") as out:
        out.write("date,amount,reference,account\n")
        out.writelines(f"{d},{a},R{i},{acc}\n" for i, (d, a, acc) in enumerate(zip(days.astype(str), amounts, accounts)))
    cleared = days + rng.integers(0, 3, rows).astype("timedelta64[D]")
    keep = np.ones(rows, dtype=bool)
    keep[rng.choice(rows, missing, replace=False)] = False
    order = rng.permutation(rows)
    with (folder / "bank.csv").open("w") as out:
        out.write("date,amount,reference\n")
        out.writelines(f"{cleared[i]},{amounts[i]},\n" for i in order if keep[i])


def sweep(left_days: list[int], right_days: list[int], tolerance: int) -> int:
    """Pairs within one group, both lists sorted by day: the matcher's rule, one row at a time."""
    pairs, j = 0, 0
    for day in left_days:
        while j < len(right_days) and right_days[j] < day - tolerance:
            j += 1
        if j < len(right_days) and right_days[j] <= day + tolerance:
            pairs += 1
            j += 1
    return pairs


def python_match(left: Table, right: Table, tolerance: int) -> int:
    """The same matching in plain Python: rows grouped by amount in dictionaries, each group swept by date."""
    groups: dict[int, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
    for side, table in ((0, left), (1, right)):
        for amount, day in zip(table.amounts.tolist(), table.dates.astype(np.int64).tolist()):
            groups[amount][side].append(day)
    return sum(sweep(sorted(lefts), sorted(rights), tolerance) for lefts, rights in groups.values())


def timed(action):
    start = time.perf_counter()
    result = action()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--missing", type=int, default=1000, help="bank rows dropped (planted unmatched ledger rows)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        _, t_write = timed(lambda: write_sample(folder, args.rows, args.missing))
        window = window_containing("month", date(2026, 10, 15))
        ledger, t_ledger = timed(lambda: CsvSource("ledger", folder / "ledger.csv", {
            "date": "date", "amount": "amount", "reference": "reference", "account": "account"}).load(window.start, window.end))  # fmt: skip
        bank, t_bank = timed(lambda: CsvSource("bank", folder / "bank.csv", {"date": "date", "amount": "amount"}).load(
            window.start, window.end))  # fmt: skip
    result, t_match = timed(lambda: match(bank, ledger, 3, use_reference=False))
    python_pairs, t_python = timed(lambda: python_match(bank, ledger, 3))
    context = CheckContext({"ledger": ledger}, window, window.previous(), materiality=0)
    _, t_duplicates = timed(lambda: check_duplicates({"source": "ledger", "keys": ["date", "amount", "account"]}, context))
    _, t_totals = timed(lambda: check_totals({"source": "ledger", "by": "account"}, context))
    figures = {
        "rows": args.rows, "planted_unmatched": args.missing, "host": platform.node(),
        "unmatched_found": int(result.right_unmatched.size), "pairs_numpy": int(result.left.size),
        "pairs_python": python_pairs, "write_csv_s": t_write, "load_ledger_csv_s": t_ledger, "load_bank_csv_s": t_bank,
        "match_numpy_s": t_match, "match_python_s": t_python, "duplicates_s": t_duplicates, "totals_s": t_totals,
    }  # fmt: skip
    print(f"{'step':<28}{'seconds':>10}")
    for key, value in figures.items():
        if key.endswith("_s"):
            print(f"{key[:-2]:<28}{value:>10.2f}")
    print(f"matching: numpy {t_match:.2f} s vs plain Python {t_python:.2f} s ({t_python / t_match:.1f}x); "
          f"pairs {figures['pairs_numpy']:,} vs {python_pairs:,}; unmatched ledger rows {figures['unmatched_found']:,} "
          f"of {args.missing:,} planted")  # fmt: skip
    print(json.dumps({key: round(value, 3) if isinstance(value, float) else value for key, value in figures.items()}))


if __name__ == "__main__":
    main()
