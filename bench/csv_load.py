"""Benchmark: loading a large CSV source, seconds and peak memory, against an older revision side by side.

    .venv/bin/python -m bench.csv_load --mb 100 --against 171850c --catalogue /tmp/nsb/bench_runs.sqlite

Writes a bank-statement CSV of about MB megabytes (date, amount, reference,
description, account; one row in 64 outside the reviewed month) into a
temporary folder, then loads it as a review does (`CsvSource.load` for October
2026) in a fresh process per revision, so each peak RSS is that load's alone.
`--against REV` also loads it with money.py and sources.py as they were at REV.
Prints one line per revision and, with --catalogue, records each run.
"""

from __future__ import annotations

import argparse
import platform
import resource
import shlex
import sys
import tempfile
import time
import types
from datetime import date
from multiprocessing import get_context
from pathlib import Path
from subprocess import check_output

import psutil

HEADER = "date,amount,reference,description,account\n"
ACCOUNTS = ("Sales", "Purchases", "Rent", "Payroll", "Travel", "Utilities", "Software", "Fees")
MONTH = (date(2026, 10, 1), date(2026, 10, 31))
COLUMNS = {"date": "date", "amount": "amount", "reference": "reference", "description": "description",
           "account": "account"}  # fmt: skip


def write_csv(path: Path, megabytes: int) -> int:
    """A deterministic statement of about `megabytes` MB; returns its data rows."""
    target, rows, written = megabytes * 1_000_000, 0, 0
    with path.open("w", encoding="utf-8") as out:
        out.write(HEADER)
        while written < target:
            lines = []
            for n in range(rows, rows + 10_000):
                month, day = (9, 1 + n % 30) if n % 64 == 0 else (10, 1 + n % 31)
                cents = (n * 7919) % 1_000_000 - 500_000
                sign = "-" if cents < 0 else ""
                lines.append(f"2026-{month:02d}-{day:02d},{sign}{abs(cents) // 100}.{abs(cents) % 100:02d},"
                             f"REF-{n:08d},Payment {n % 977} to supplier {n % 131},{ACCOUNTS[n % 8]}\n")  # fmt: skip
            chunk = "".join(lines)
            out.write(chunk)
            written += len(chunk)
            rows += len(lines)
    return rows


def _old_sources(revision: str) -> types.ModuleType:
    """sources.py as it was at `revision`, importing that revision's money.py."""
    modules = {}
    for name in ("money", "sources"):
        text = check_output(["git", "show", f"{revision}:app/review/{name}.py"], text=True)
        text = text.replace("from nightshift.app.review.money import", "from _old_money import")
        module = types.ModuleType(f"_old_{name}")
        sys.modules[module.__name__] = module
        exec(compile(text, f"{revision}:app/review/{name}.py", "exec"), module.__dict__)
        modules[name] = module
    return modules["sources"]


def load(path: Path, revision: str | None) -> dict:
    """Load `path` in this (fresh) process; seconds, rows kept, peak RSS and the table's array bytes."""
    if revision is None:
        from nightshift.app.review.sources import CsvSource
    else:
        CsvSource = _old_sources(revision).CsvSource
    before = psutil.Process().memory_info().rss
    started, cpu = time.perf_counter(), time.process_time()
    table = CsvSource("bank", path, COLUMNS).load(*MONTH)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    arrays = table.dates.nbytes + table.amounts.nbytes + table.lines.nbytes + sum(
        column.nbytes for column in table.text.values())  # fmt: skip
    return {
        "seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2), "rows": len(table), "rss_before_mb": round(before / 2**20),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "table_array_mb": round(arrays / 2**20), "sha256": getattr(table, "sha256", "")[:12],
    }  # fmt: skip


def _verdict(figures: dict, base: dict) -> str:
    """ "win" when neither CPU seconds nor peak RSS is worse than the baseline's, "loss" when both are, else "mixed"."""
    worse = [figures[key] > base[key] for key in ("cpu_seconds", "peak_rss_mb")]
    return "loss" if all(worse) else "mixed" if any(worse) else "win"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--against", help="a git revision to load the same file with, side by side")
    parser.add_argument("--catalogue", type=Path, help="record each run in this run catalogue")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    head = check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "statement.csv"
        rows = write_csv(path, args.mb)
        size = path.stat().st_size
        print(f"{path.name}: {size / 1e6:.0f} MB, {rows:,} rows; host {platform.node()}")
        results = {}
        for revision in (None, args.against) if args.against else (None,):
            with get_context("spawn").Pool(1) as pool:
                results[revision] = pool.apply(load, (path, revision))
            print(f"{revision or 'HEAD (' + head + ')'}: {results[revision]}")
    if args.catalogue:
        from nightshift.engine.instruments.catalogue import Catalogue, Run

        catalogue = Catalogue(args.catalogue)
        base = results[args.against] if args.against else None
        for revision, figures in results.items():
            verdict = "baseline" if revision is not None or base is None else _verdict(figures, base)
            run = Run(kind="csv-load", model="-", verdict=verdict, command=shlex.join(["python", *sys.argv]),
                      config={"code": revision or head, "mb": args.mb, "rows": rows, "bytes": size},
                      figures=figures)  # fmt: skip
            print(f"recorded run {catalogue.record(run)} ({verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
