"""Hostile and malformed input: each is refused with a clear error of ours, or yields a safe review."""

from __future__ import annotations

import json
import re
import shutil
import socket
import sqlite3
from datetime import date
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from nightshift.app.daemon.service import Service
from nightshift.app.review import report
from nightshift.app.review.errors import ReviewError
from nightshift.app.review.money import UNITS_LIMIT, exact_group_sums, exact_sum, format_amount
from nightshift.app.review.narrative import build_prompt, write_narrative
from nightshift.app.review.runner import run_checks_for
from nightshift.app.review.schedule import BUNDLED_DIR, load_schedule, load_schedules
from nightshift.app.review.sources import SqliteSource
from nightshift.engine.runtime import open_model
from tests.helpers.reviews import BANK, month_end_on, row

OCTOBER = date(2026, 10, 30)


REFUSED = {
    "latin-1": (
        (BANK + row("1,00", text="Caf\xe9")).encode("latin-1"),
        "byte 0xe9 is not utf-8 text; set the source's `encoding`",
    ),
    "utf-16": (BANK.encode("utf-16"), "starts with a utf-16 byte-order mark but `encoding` is 'utf-8'"),
    "binary": (b"\x00\xff\xfe\x01" * 64, "line 1: byte 0xff is not utf-8 text"),
    "missing column": (
        BANK.replace("Booking date", "Datum").encode(),
        r"no column\(s\) \['Booking date'\]; its header is",
    ),
    "semicolons read as commas": (BANK.replace(";", "\t").encode(), "Fix `columns` in the schedule .*`delimiter`"),
    "empty": (b"", "is empty"),
    "short row": ((BANK + "29.10.2026\n").encode(), r"line \d+: 1 fields, fewer than the header's"),
    "NaN": ((BANK + row("NaN")).encode(), r"line \d+, column 'Amount': 'NaN' is not an amount"),
    "inf": ((BANK + row("-inf")).encode(), "'-inf' is not an amount"),
    "huge exponent": ((BANK + row("1e999999999")).encode(), "is in exponent notation"),
    "40 digits": ((BANK + row("9" * 40)).encode(), "is too large an amount"),
    "sub-cent": ((BANK + row("1,001")).encode(), "more than 2 decimals; set `decimals`"),
    "not a number": ((BANK + row("=1+1")).encode(), "'=1\\+1' is not an amount"),
    "day 0": ((BANK + row("1,00", day="00.10.2026")).encode(), "does not match format"),
    "year 10000": ((BANK + row("1,00", day="01.01.10000")).encode(), "unconverted data remains"),
    "2 MB field": ((BANK + row("1,00", text="A" * 2_000_000)).encode(), "not readable as CSV: field larger"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_malformed_csv_is_refused_with_what_to_fix(home, case):
    data, message = REFUSED[case]
    schedule = load_schedule(month_end_on(home, data))
    with pytest.raises(ReviewError, match=message) as raised:
        run_checks_for(schedule, OCTOBER)
    assert "hostile" in str(raised.value)  # names the source or its file


def test_formula_cells_nul_bytes_and_far_dates_are_data_not_errors(home):
    hostile = [
        row("1.234,00", "=cmd|' /C calc'!A0", '=HYPERLINK("http://example.com","x")'),
        row("2,00", "+SUM(1)", "@evil\x00nul"),
        row("3,00", "R-9999", "far future", day="31.12.9999"),
        row("4,00", "R-0001", "far past", day="01.01.0001"),
    ]
    schedule = load_schedule(month_end_on(home, (BANK + "".join(hostile)).encode()))
    findings = run_checks_for(schedule, OCTOBER).result.findings
    unmatched = [r for f in findings if f.check == "match" for r in f.rows]
    # The formula-like rows in October are findings shown as plain text; far-away rows are outside the period.
    assert {r["reference"] for r in unmatched} >= {"=cmd|' /C calc'!A0", "+SUM(1)"}
    assert not {"R-9999", "R-0001"} & {r["reference"] for r in unmatched}


def test_sums_of_amounts_near_the_limit_stay_exact():
    rng = np.random.default_rng(7)
    limit = UNITS_LIMIT - 1  # the largest amount a source can hold
    units = np.concatenate([np.full(40, limit), -np.full(3, limit), rng.integers(-limit, limit, 5000)])
    exact = sum(units.tolist())
    assert int(units.sum()) != exact  # numpy's int64 wraps around silently: this is what is guarded against
    assert exact_sum(units) == exact and exact_sum(units[:9]) == sum(units[:9].tolist()) and exact_sum(units[:0]) == 0
    groups = rng.integers(0, 3, len(units))
    assert exact_group_sums(units, groups, 4) == [sum(units[groups == g].tolist()) for g in range(4)]


def test_a_statement_of_huge_amounts_totals_exactly(home):
    huge = [row("9.999.999.999.999.999,99", f"H-{n}", "huge") for n in range(20)]  # 17 digits each
    schedule = load_schedule(month_end_on(home, (BANK + "".join(huge)).encode()))
    checked = run_checks_for(schedule, OCTOBER)
    bank = checked.tables["bank"].between(checked.window.start, checked.window.end)
    exact = sum(bank.amounts.tolist())
    assert exact > 2**63 and int(bank.amounts.sum()) != exact
    (summary,) = [t for t in checked.result.tables if t.title.startswith("Matching")]
    assert summary.rows[-1][1] == format_amount(exact, 2)  # the bank's total, not a wrapped-around one
    huge_findings = [f.amount for f in checked.result.findings if "not in ledger: H-" in f.title]
    assert len(huge_findings) == 20 and sum(huge_findings) == Decimal("199999999999999999.80")


def test_integer_minor_units_too_large_for_int64_are_refused(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    with sqlite3.connect(ledger) as db:
        db.execute("CREATE TABLE entries (date TEXT, amount INTEGER)")
        db.execute("INSERT INTO entries VALUES ('2026-10-01', ?)", (UNITS_LIMIT,))
    source = SqliteSource("ledger", ledger, "SELECT date, amount FROM entries", integer_amounts="minor units")
    with pytest.raises(
        ReviewError, match="source 'ledger', query row 1, column 'amount': 1000000000000000000 is too large an amount"
    ):
        source.load(OCTOBER, OCTOBER)


@pytest.mark.parametrize("as_of", [date(1, 1, 1), date(1, 12, 31), date(9999, 12, 31)])
def test_a_period_at_the_ends_of_the_calendar_is_refused(home, as_of):
    schedule = load_schedules()[0]["month-end"]
    with pytest.raises(ReviewError, match="out of range for a review"):
        run_checks_for(schedule, as_of)


BROKEN_SCHEDULES = {
    "not toml": ('name = "x"\nwhen = \n', r":2: not valid TOML"),
    "binary": ("\x00\x01name", "not valid TOML"),
    "bad when": ('name = "x"\nwhen = "every blue moon"\n', r":2: field `when`"),
    "bad zone": ('name = "x"\nwhen = "every day"\ntimezone = "Mars/Olympus"\n', "unknown time zone 'Mars/Olympus'"),
    "bad grace": ('name = "x"\nwhen = "every day"\ngrace = "soon"\n', "field `grace`"),
    "wrong type": ('name = 7\nwhen = "every day"\n', "field `name`: should be"),
    "unknown check": (
        (BUNDLED_DIR / "daily.toml").read_text().replace('type = "duplicates"', 'type = "dupes"'),
        "'dupes' is not a check",
    ),
    "template outside": (
        (BUNDLED_DIR / "daily.toml").read_text() + '\n[prompt]\ntemplate = "../../../../../../../../etc/passwd"\n',
        "field `prompt.template`",
    ),
}


def test_malformed_schedules_are_named_and_the_others_still_load(home):
    folder = home / "schedules"
    folder.mkdir(parents=True)
    for number, (text, _) in enumerate(BROKEN_SCHEDULES.values()):
        (folder / f"broken{number}.toml").write_text(text)
    schedules, errors = load_schedules()
    assert set(schedules) == {"daily", "weekly", "month-end", "camt053", "mt940", "ofx", "beancount"}
    by_file = {Path(str(error).split(":")[0]).name: str(error) for error in errors}
    for number, (case, (_, message)) in enumerate(BROKEN_SCHEDULES.items()):
        assert f"broken{number}.toml" in by_file, case
        assert re.search(message, by_file[f"broken{number}.toml"]), (case, by_file[f"broken{number}.toml"])


@pytest.mark.parametrize(
    "template, message",
    [
        ("<p>{% for x in %}</p>", r"bad\.html\.j2:1: Expected an expression"),
        ("<p>{{ nope.x }}</p>", "'nope' is undefined"),
    ],
)
def test_a_report_template_with_errors_is_named(tmp_path, monkeypatch, template, message):
    (tmp_path / "bad.html.j2").write_text(template)
    monkeypatch.setattr(report, "REPORTS_DIR", tmp_path)
    with pytest.raises(ReviewError, match=message):
        report.render_html("bad.html.j2", {})


@pytest.fixture(scope="module")
def short_context_model(tiny_model, tmp_path_factory) -> Path:
    """The tiny real model with a context of 64 tokens, which no review prompt fits in."""
    model = shutil.copytree(tiny_model, tmp_path_factory.mktemp("short") / "model")
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 64
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_a_prompt_longer_than_the_context_is_refused_before_generating(home, short_context_model):
    schedule = load_schedules()[0]["month-end"]
    checked = run_checks_for(schedule, OCTOBER)
    prompt = build_prompt(schedule.prompt_template, schedule.title, checked.window.label, checked.result, 10)
    with pytest.raises(ReviewError, match=r"over the model's context of 64; lower `prompt_findings` or `max_tokens`"):
        write_narrative(open_model(short_context_model), prompt, 160, 0.0, 0)


def ask(path: Path, raw: bytes) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(10)
        client.connect(str(path))
        try:
            client.sendall(raw)
            client.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the service stopped reading an oversized request; its reply is still there
        with client.makefile("rb") as replies:
            return json.loads(replies.readline())


HOSTILE_REQUESTS = [
    b"garbage\n", b"[1, 2]\n", b"\xff\xfe\n", b"{" * 100_000 + b"\n",
    b'{"command": "run", "review": "daily", "as_of": 123}\n',
    b'{"command": "run", "review": "daily", "as_of": "2026-13-40"}\n',
    b'{"command": "run_status", "id": "x"}\n', b'{"command": "jobs", "limit": 1e309}\n',
    b'{"command": "cancel", "id": [1]}\n', b'{"command": "rm -rf /"}\n',
]  # fmt: skip


def test_hostile_control_requests_get_an_error_reply_and_the_service_keeps_serving(home):
    service = Service(load_schedules()[0], work=False)
    service.start()
    try:
        for raw in HOSTILE_REQUESTS:
            reply = ask(service.control.path, raw)
            assert reply["ok"] is False and reply["error"], raw[:40]
        assert ask(service.control.path, b'{"command": "ping"}\n')["ok"] is True
    finally:
        service.stop()
