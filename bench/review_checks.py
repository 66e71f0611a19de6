"""Benchmark: reconciliation checks on a million rows, numpy against plain Python, side by side;
or (--review) a whole review without the model, every check and the PDF, with its peak memory.

    .venv/bin/python -m bench.review_checks --rows 1000000
    .venv/bin/python -m bench.review_checks --review --rows 10000000

Writes a synthetic bank statement and ledger (CSV) of ROWS rows each into a
temporary folder, with a known number of planted unmatched rows, times loading
them and each check, and times the same greedy matching written as plain
Python dictionaries, checking both pair the same number of rows. Prints a
table and one JSON line of figures to record.

With --review the files are written by a child process (so its lists do not
count), then this process runs a schedule with every check type on them as a
review does (load, checks, prompt, report PDF and index entry, in a temporary
data dir), with the narrative step skipped, and reports each step's seconds and
the process's RSS after it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from nightshift.app.review.checks import CheckContext, check_duplicates, check_totals
from nightshift.app.review.matching import match
from nightshift.app.review.sources import CsvSource, Table
from nightshift.app.review.window import window_containing

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
        out.writelines(
            f"{d},{a},R{i},{acc}\n" for i, (d, a, acc) in enumerate(zip(days.astype(str), amounts, accounts))
        )
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


SCHEDULE = """\
# Every check type on the benchmark's files, as a user's month-end review would run them.
name = "checks-benchmark"
title = "Checks benchmark"
when = "last day of the month at 22:00"
timezone = "UTC"
materiality = "1000.00"

[window]
period = "month"
as_of = 2026-10-15

[sources.bank]
type = "csv"
path = "bank.csv"
columns = { date = "date", amount = "amount", reference = "reference" }

[sources.ledger]
type = "csv"
path = "ledger.csv"
columns = { date = "date", amount = "amount", reference = "reference", account = "account" }

[sources.balances]
type = "csv"
path = "balances.csv"
columns = { date = "date", amount = "amount", account = "account" }

[[checks]]
type = "match"
left = "bank"
right = "ledger"
date_tolerance_days = 3

[[checks]]
type = "duplicates"
source = "ledger"
keys = ["date", "amount", "reference"]

[[checks]]
type = "totals"
source = "ledger"
by = "account"

[[checks]]
type = "balance"
balances = "balances"
movements = "ledger"
account = "Bank"

[[checks]]
type = "variance"
source = "ledger"
by = "account"
threshold_pct = 50

[report]
output = "reports"
"""


def write_review_files(folder: Path, rows: int, missing: int) -> Path:
    """The sample's bank and ledger, a balances file and the schedule; returns the schedule's path."""
    write_sample(folder, rows, missing)
    (folder / "balances.csv").write_text("date,amount,account\n2026-09-30,1000.00,Bank\n2026-10-31,1000.00,Bank\n")
    (folder / "checks-benchmark.toml").write_text(SCHEDULE)
    return folder / "checks-benchmark.toml"


def review_without_model(folder: Path, rows: int, missing: int) -> dict[str, Any]:
    """Write the files in a child process, then run the review here, step by step, with the narrative skipped."""
    from nightshift.app.review.narrative import Narrative, build_prompt
    from nightshift.app.review.runner import (
        run_checks_for,
        write_report,
    )  # the model's modules: not in the writing child
    from nightshift.app.review.schedule import load_schedule

    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as child:
        path, t_write = timed(lambda: child.submit(write_review_files, folder, rows, missing).result())
    os.environ["NIGHTSHIFT_HOME"] = str(folder / "home")  # the report and its index entry stay in the temp folder
    process = psutil.Process()
    steps: list[tuple[str, float, float, float]] = []  # step, seconds, RSS MB after it, peak RSS MB so far

    def step(name: str, seconds: float) -> None:
        steps.append((name, seconds, process.memory_info().rss / 1e6, peak_rss_mb()))

    started = time.monotonic()
    schedule = load_schedule(path)
    window = window_containing(schedule.period, schedule.as_of)
    checked, t_checks = timed(lambda: run_checks_for(schedule, schedule.as_of, step))
    prompt, t_prompt = timed(lambda: build_prompt(schedule.prompt_template, schedule.title, window.label,
                                                  checked.result, schedule.generation.prompt_findings))  # fmt: skip
    step("prompt", t_prompt)
    entry, t_report = timed(lambda: write_report(schedule, schedule.as_of, checked, prompt,
                                                 Narrative(""), "none (narrative skipped)", started))  # fmt: skip
    step("report (HTML, PDF, index)", t_report)
    return {
        "rows": rows, "planted_unmatched": missing, "host": platform.node(), "write_csv_s": t_write,
        "steps": [{"step": name, "seconds": round(value, 2), "rss_mb": round(rss), "peak_rss_mb": round(peak)}
                  for name, value, rss, peak in steps],
        "checks_with_loading_s": t_checks, "review_s": time.monotonic() - started,
        "findings": len(checked.result.findings), "pdf_bytes": Path(entry.path).stat().st_size,
        "peak_rss_mb": peak_rss_mb(),
    }  # fmt: skip


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6  # KiB on Linux


def print_review(figures: dict[str, Any]) -> None:
    print(f"{'step':<28}{'seconds':>10}{'RSS MB after':>14}{'peak so far':>13}")
    for row in figures["steps"]:
        print(f"{row['step']:<28}{row['seconds']:>10.2f}{row['rss_mb']:>14,}{row['peak_rss_mb']:>13,}")
    print(f"{figures['rows']:,} rows: review without the model {figures['review_s']:.1f} s, "
          f"peak RSS {figures['peak_rss_mb']:,.0f} MB, {figures['findings']:,} findings, "
          f"PDF {figures['pdf_bytes']:,} bytes (writing the CSVs took {figures['write_csv_s']:.1f} s)")  # fmt: skip
    print(json.dumps({key: round(value, 3) if isinstance(value, float) else value for key, value in figures.items()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--missing", type=int, default=1000, help="bank rows dropped (planted unmatched ledger rows)")
    parser.add_argument(
        "--review",
        action="store_true",
        help="run a whole review without the model (every check, the PDF) and report peak memory",
    )
    args = parser.parse_args()
    if args.review:
        with tempfile.TemporaryDirectory() as folder:
            print_review(review_without_model(Path(folder), args.rows, args.missing))
        return
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
    _, t_duplicates = timed(
        lambda: check_duplicates({"source": "ledger", "keys": ["date", "amount", "account"]}, context)
    )
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
