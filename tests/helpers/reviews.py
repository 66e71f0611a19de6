"""Review inputs and outputs the review tests share: the bundled bank statement, hostile variants of it, a report's
context."""

from __future__ import annotations

from pathlib import Path

from nightshift.app.review.narrative import Prompt
from nightshift.app.review.runner import _provenance, build_report_context
from nightshift.app.review.schedule import BUNDLED_DIR

BANK = (BUNDLED_DIR / "sample-data" / "bank-statement.csv").read_text(encoding="utf-8-sig")


def month_end_on(home: Path, csv: bytes, name: str = "hostile") -> Path:
    """The bundled month-end review with its bank statement replaced by `csv`."""
    folder = home / "schedules"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.csv").write_bytes(csv)
    text = (BUNDLED_DIR / "month-end.toml").read_text().replace('name = "month-end"', f'name = "{name}"')
    text = text.replace('"sample-data/bank-statement.csv"', f'"{name}.csv"')
    path = folder / f"{name}.toml"
    path.write_text(text.replace('"sample-data/', f'"{BUNDLED_DIR}/sample-data/'))
    return path


def row(amount: str, reference: str = "X-1", text: str = "Hostile", day: str = "29.10.2026") -> str:
    return f"{day};{amount};{reference};{text}\n"


def report_context(schedule, checked, narrative, prompt=None) -> dict:
    """The report's context for `narrative`, as written for `prompt` (by default a split one over every finding,
    three of them with an answer of their own)."""
    from datetime import datetime

    provenance = _provenance(schedule, checked, "tiny", narrative)
    prompt = prompt or Prompt("system", "summary", len(checked.result.findings), ("a", "b", "c"), "split")
    return build_report_context(schedule, checked, prompt, narrative, provenance, datetime.now())
