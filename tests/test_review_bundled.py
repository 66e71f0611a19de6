"""The three bundled reviews find every discrepancy planted in the sample data (schedules/sample-data/generate.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from nightshift.app.review.runner import run_checks_for
from nightshift.app.review.schedule import load_schedules

# (check, title, amount) of every planted discrepancy, per review.
DAILY = [
    ("duplicates", "2 identical rows in ledger: INV-5010", Decimal("1918.40")),
    ("match", "In ledger, not in bank: INV-5010", Decimal("1918.40")),  # the second posting has no bank line
    ("match", "In bank, not in ledger: BANK CHARGES OCT", Decimal("-45.00")),
]
WEEKLY = [
    *DAILY,
    ("match", "In ledger, not in bank: CHQ-1042", Decimal("-830.00")),
    ("match", "Amount differs for reference INV-5004", Decimal("-45.00")),
]
MONTH_END = [
    *WEEKLY,
    ("match", "In bank, not in ledger: DD-77120", Decimal("-1480.00")),
    ("balance", "Bank: opening + movements does not equal closing", Decimal("-100.00")),
    ("variance", "account Travel: up 261% against September 2026", Decimal("-1670.00")),
]


@pytest.mark.parametrize(("review", "planted"), [("daily", DAILY), ("weekly", WEEKLY), ("month-end", MONTH_END)])
def test_every_planted_discrepancy_is_found(review, planted):
    schedules, errors = load_schedules()
    assert errors == []
    schedule = schedules[review]
    findings = run_checks_for(schedule, schedule.as_of).result.findings
    found = [(f.check, f.title, f.amount) for f in findings]
    assert sorted(found) == sorted(planted)  # every planted item, and nothing else in clean sample data


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.skipif(not shutil.which("pdftotext"), reason="pdftotext (poppler-utils) is not installed")
def test_readme_first_command_on_the_default_model(sparse_store, tmp_path):
    """`nightshift review run month-end --now`: the README's first command, its experts streamed from the store.
    It runs first (tests/conftest.py), on one worker while the others go through the rest."""
    store, _ = sparse_store
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    (home / "models" / store.name).symlink_to(store)
    command = [sys.executable, "-m", "nightshift.app.cli", "review", "run", "month-end", "--now"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=900, env={**os.environ, "NIGHTSHIFT_HOME": str(home)}
    )
    assert done.returncode == 0, done.stderr
    report = Path(done.stdout.strip())
    assert report.is_file() and report.parent == home / "reports" / "month-end"
    text = subprocess.run(["pdftotext", "-layout", str(report), "-"], capture_output=True, text=True).stdout
    for _, title, _ in MONTH_END:
        assert title.split(":")[0] in text
    assert "written by the model" in text and "smollm2-135m-instruct-moe" in text
    read = re.search(r"bytes read per drive\s+(\S+): ([\d,]+)", text)
    assert read and int(read.group(2).replace(",", "")) > 0, "the review streamed no experts"
