"""The parse-trap table in docs/reviews.md, row by row: each amount gives the value shown or the error, never another.

The table is the test's data, so the documentation cannot drift from what the
code does. Each text is written into a one-row CSV with the row's declared
keys and loaded through CsvSource, so errors also show their file, line and
column.
"""

from __future__ import annotations

import re
import tomllib
from datetime import date
from pathlib import Path

import pytest

from nightshift.app.review.errors import ReviewError
from nightshift.app.review.sources import CsvSource

DOC = Path(__file__).parents[1] / "docs" / "reviews.md"
ROW = re.compile(r"^\| `(?P<text>\".*\")` \| `(?P<declared>.*)` \| (?P<gives>.*) \|$")


def traps() -> list[tuple[str, dict, str]]:
    block = DOC.read_text(encoding="utf-8").split("<!-- parse-traps -->")[1].split("<!-- /parse-traps -->")[0]
    rows = []
    for line in block.splitlines():
        if found := ROW.match(line):
            text = tomllib.loads(f"t = {found['text']}")["t"]
            declared = tomllib.loads(f"d = {{ {found['declared']} }}")["d"]
            rows.append((text, declared, found["gives"]))
    return rows


TRAPS = traps()


def test_the_table_has_the_traps_the_issue_names():
    assert len(TRAPS) >= 20
    texts = {text for text, _, _ in TRAPS}
    for named in ("1234,56", "1.23457E+11", "1e5", "NaN", "-0,00", "12,34,567.89", "١٬٢٣٤٫٥٦", "1\u202f234,56",
                  "€1,234.56", "45.00-"):  # fmt: skip
        assert named in texts


@pytest.mark.parametrize(("text", "declared", "gives"), TRAPS, ids=[f"{t!r}-{sorted(d.items())}" for t, d, _ in TRAPS])
def test_trap(tmp_path, text, declared, gives):
    path = tmp_path / "bank.csv"
    path.write_text(f"date;amount\n2026-10-01;{text}\n", encoding="utf-8")
    source = CsvSource("bank", path, delimiter=";", **declared)
    if gives.startswith("error: "):
        expected = rf"source 'bank', .*bank\.csv line 2, column 'amount': .*{re.escape(gives.removeprefix('error: '))}"
        with pytest.raises(ReviewError, match=expected):
            source.load(date(2026, 10, 1), date(2026, 10, 31))
    else:
        table = source.load(date(2026, 10, 1), date(2026, 10, 31))
        assert str(table.amount(0)) == gives
