"""Benchmark: a whole review (sources, capped checks, the model, the PDF) whose bank statement is a 500 MB CSV.

    .venv/bin/python -m bench.review_500mb --model MODEL_DIR [--mb 500] [--timeout-seconds 1800]

Writes bench/csv_load.py's statement of about MB megabytes (nearly every row in
October 2026, none in the bundled ledger, so nearly every row is a finding
before the caps) into a temporary data dir, points a copy of the bundled
month-end review's bank source at it (its own `timeout_seconds`), and runs
`nightshift review run` on it in a child process, as a user would, with a tiny
model. Prints the outcome (the PDF, or the reason it was refused), the wall
seconds, the child's peak RSS and the findings listed and summed, as one JSON
line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.csv_load import write_csv
from nightshift.app.review.schedule import BUNDLED_DIR


def schedule_for(home: Path, statement: Path, model: Path, timeout_seconds: float) -> None:
    """The bundled month-end review with `statement` as its bank source, written by `model`."""
    text = (BUNDLED_DIR / "month-end.toml").read_text()
    text = text.replace('name = "month-end"', 'name = "big"').replace('"sample-data/', f'"{BUNDLED_DIR}/sample-data/')
    start = text.index("[sources.bank]")
    end = text.index("[sources.ledger]")
    bank = (f'[sources.bank]\ntype = "csv"\npath = "{statement}"\ncurrency = "EUR"\n'
            f"timeout_seconds = {timeout_seconds}\n"
            'columns = { date = "date", amount = "amount", reference = "reference", description = "description" }\n\n')  # fmt: skip
    text = text[:start] + bank + text[end:]
    text = text.replace("max_tokens = 160", f'name = "{model}"\nmax_tokens = 8')
    text = text.replace('output = "reports/month-end"', 'output = "reports/big"')
    (home / "schedules").mkdir(parents=True, exist_ok=True)
    (home / "schedules" / "big.toml").write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--timeout-seconds", type=float, default=1800.0, help="the bank source's load budget")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch) / "home"
        statement = Path(scratch) / "statement.csv"
        rows = write_csv(statement, args.mb)
        schedule_for(home, statement, args.model.resolve(), args.timeout_seconds)
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "nightshift.app.cli", "review", "run", "big"],
                                env={**os.environ, "NIGHTSHIFT_HOME": str(home)}, capture_output=True, text=True)  # fmt: skip
        seconds = time.monotonic() - started
        index = json.loads((home / "reports" / "index.json").read_text()) if (home / "reports").is_dir() else []
        entry = index[-1] if index else {}
        figures = {
            "mb": round(statement.stat().st_size / 1e6), "rows": rows, "exit": result.returncode,
            "seconds": round(seconds, 1),
            "child_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
            "findings": entry.get("findings"), "by_severity": entry.get("by_severity"),
            "pdf_kb": round(Path(entry["path"]).stat().st_size / 1024) if entry.get("path") else None,
            "reason": (result.stderr.strip().splitlines() or [""])[-1][:500] if result.returncode else None,
        }  # fmt: skip
    print(json.dumps(figures))
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
