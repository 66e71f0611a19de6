"""Benchmark: a review whose checks find a flood of findings (a wrong file, a wrong period), capped per check.

    .venv/bin/python -m bench.review_findings_cap --rows 1000000 --missing 500000
    .venv/bin/python -m bench.review_findings_cap --rows 20000 --missing 5000 --max-findings 5000

Writes bench/review_checks.py's synthetic bank statement and ledger (ROWS rows each, MISSING bank rows
dropped, so MISSING ledger rows are unmatched findings), then runs the review without the model, every
check and the PDF, with `max_findings` set on every check; prints each step's seconds and RSS, the
findings listed and summed, the PDF's size and the peak RSS, one JSON line, and records the run in the
run catalogue (`nightshift runs list --kind review-findings-cap`). Run each setting in its own process
(as above) so the peak RSS is that setting's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import psutil

from bench.review_checks import peak_rss_mb, timed, write_review_files
from nightshift.app.paths import catalogue_file
from nightshift.engine.instruments.catalogue import Catalogue, Run


def capped_review(folder: Path, rows: int, missing: int, max_findings: int) -> dict[str, Any]:
    """The review of bench/review_checks.py's files with every check capped at `max_findings`."""
    from nightshift.app.review.narrative import Narrative, build_prompt
    from nightshift.app.review.runner import run_checks_for, write_report
    from nightshift.app.review.schedule import load_schedule

    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as child:
        path, t_write = timed(lambda: child.submit(write_review_files, folder, rows, missing).result())
    path.write_text(path.read_text().replace("[[checks]]\n", f"[[checks]]\nmax_findings = {max_findings}\n"))
    os.environ["NIGHTSHIFT_HOME"] = str(folder / "home")  # the report and its index entry stay in the temp folder
    process = psutil.Process()
    steps: list[dict[str, Any]] = []

    def step(name: str, seconds: float) -> None:
        steps.append({"step": name, "seconds": round(seconds, 2), "rss_mb": round(process.memory_info().rss / 1e6),
                      "peak_rss_mb": round(peak_rss_mb())})  # fmt: skip

    started = time.monotonic()
    schedule = load_schedule(path)
    checked, t_checks = timed(lambda: run_checks_for(schedule, schedule.as_of, step))
    result = checked.result
    prompt = build_prompt(schedule.prompt_template, schedule.title, checked.window.label, result,
                          schedule.generation.prompt_findings)  # fmt: skip
    entry, t_report = timed(lambda: write_report(schedule, schedule.as_of, checked, prompt,
                                                 Narrative(""), "none (narrative skipped)", started))  # fmt: skip
    step("report (HTML, PDF, index)", t_report)
    return {
        "rows": rows, "planted_unmatched": missing, "max_findings": max_findings, "host": platform.node(),
        "write_csv_s": round(t_write, 2), "checks_with_loading_s": round(t_checks, 2), "report_s": round(t_report, 2),
        "review_s": round(time.monotonic() - started, 2), "findings": result.total_findings,
        "findings_listed": sum(not f.summarized for f in result.findings),
        "summaries": sum(bool(f.summarized) for f in result.findings), "pdf_bytes": Path(entry.path).stat().st_size,
        "peak_rss_mb": round(peak_rss_mb()), "steps": steps,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--missing", type=int, default=500_000, help="bank rows dropped: unmatched ledger rows")
    parser.add_argument("--max-findings", type=int, default=100, help="every check's cap (the default is 100)")
    parser.add_argument("--catalogue", type=Path, default=None, help="run catalogue (default: the data dir's)")
    args = parser.parse_args()
    catalogue = Catalogue(args.catalogue or catalogue_file())  # before the review points the data dir elsewhere
    with tempfile.TemporaryDirectory() as folder:
        figures = capped_review(Path(folder), args.rows, args.missing, args.max_findings)
    print(f"{'step':<28}{'seconds':>10}{'RSS MB after':>14}{'peak so far':>13}")
    for row in figures["steps"]:
        print(f"{row['step']:<28}{row['seconds']:>10.2f}{row['rss_mb']:>14,}{row['peak_rss_mb']:>13,}")
    print(f"{figures['findings']:,} findings ({figures['findings_listed']:,} listed, the rest in "
          f"{figures['summaries']} summaries); PDF {figures['pdf_bytes']:,} bytes in {figures['report_s']:.1f} s; "
          f"review {figures['review_s']:.1f} s; peak RSS {figures['peak_rss_mb']:,} MB")  # fmt: skip
    print(json.dumps(figures))
    config = {key: figures[key] for key in ("rows", "planted_unmatched", "max_findings")}
    run_id = catalogue.record(Run("review-findings-cap", "none", config, figures, "pass",
                                  command="python " + " ".join(sys.argv)))  # fmt: skip
    print(f"recorded as run {run_id} in {catalogue.path}")


if __name__ == "__main__":
    main()
