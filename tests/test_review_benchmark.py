"""The checks benchmark's whole-review mode on a small sample: every check runs and a PDF is written, no model."""

from __future__ import annotations

import pytest

from bench.review_checks import review_without_model


@pytest.mark.slow
def test_a_review_without_the_model_runs_every_check_and_writes_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("NIGHTSHIFT_HOME", str(tmp_path / "untouched"))  # the benchmark points it at its folder
    figures = review_without_model(tmp_path, rows=3000, missing=7)
    steps = [row["step"] for row in figures["steps"]]
    assert steps == [
        "load bank",
        "load ledger",
        "load balances",
        "check 1 match",
        "check 2 duplicates",
        "check 3 totals",
        "check 4 balance",
        "check 5 variance",
        "prompt",
        "report (HTML, PDF, index)",
    ]
    # 7 planted unmatched ledger rows, the balance that does not roll forward, and the variance check, which
    # could not run (the sample has no September to compare against)
    assert figures["findings"] == 7 + 1 + 1
    assert figures["pdf_bytes"] > 0 and figures["peak_rss_mb"] >= max(row["rss_mb"] for row in figures["steps"]) * 0.99
    (report,) = (tmp_path / "home" / "reports").glob("*.pdf")
    assert report.read_bytes().rstrip().endswith(b"%%EOF")
    assert not (tmp_path / "untouched").exists()
