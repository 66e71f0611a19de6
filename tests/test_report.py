"""Report rendering: model text escaped and its numbers checked, nothing fetched, a complete PDF with metadata."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from nightshift.app.review.charts import bar_chart
from nightshift.app.review.gate import Answer
from nightshift.app.review.narrative import Prompt, read_narrative
from nightshift.app.review.report import REPORTS_DIR, local_only_fetcher, render_html, write_pdf
from nightshift.app.review.runner import Provenance, build_report_context, run_checks_for
from nightshift.app.review.schedule import BUNDLED_DIR, Schedule, load_schedule, load_schedules
from nightshift.engine.generation import GenerationStats

NARRATIVE = """The bank shows 1,480.00 not in the ledger and the balance is off by 100.00; roughly 7,777 is at risk. <script>alert(1)</script>
F1: Check INV-5010 & its duplicate.
F4: Find the 100.00 difference."""


def test_the_narrative_picks_out_each_finding_s_line():
    narrative = read_narrative(NARRATIVE, GenerationStats(), cut=True)
    assert narrative.text == NARRATIVE
    assert narrative.answers == [
        Answer(NARRATIVE.splitlines()[0], None),
        Answer("Check INV-5010 & its duplicate.", 1),
        Answer("Find the 100.00 difference.", 4, cut=True),  # a cut falls on the last part
    ]


def test_control_characters_a_model_emits_are_dropped_line_breaks_and_tabs_kept():
    narrative = read_narrative("Totals\x11 agree.\r\nF2:\x13 check\tthe\x7f fee.\x00", GenerationStats())
    assert narrative.text == "Totals agree.\r\nF2: check\tthe fee."
    assert narrative.answers == [Answer("Totals agree.", None), Answer("check\tthe fee.", 2)]


def test_the_fetcher_refuses_the_network_and_files_outside_the_templates(tmp_path):
    from weasyprint.urls import URLFetchingError

    fetcher = local_only_fetcher()
    for url in ("http://127.0.0.1:9/x.css", "https://example.com/a.png", f"file://{tmp_path}/x.css",
                f"file://{REPORTS_DIR}/../prompts/review.j2"):  # fmt: skip
        with pytest.raises(URLFetchingError, match="refused"):
            fetcher.fetch(url)
    assert b"@page" in fetcher.fetch(f"file://{REPORTS_DIR / 'report.css'}").read()


def test_rendering_fetches_nothing_from_the_network(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    port = server.getsockname()[1]
    connections = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            connections.append(server.accept())

    listener = threading.Thread(target=accept)
    listener.start()
    html = f'<link rel="stylesheet" href="http://127.0.0.1:{port}/x.css"><img src="http://127.0.0.1:{port}/a.png"><p>hi</p>'
    target = write_pdf(html, tmp_path / "out" / "r.pdf")
    listener.join()
    server.close()
    assert connections == []
    assert target.read_bytes().startswith(b"%PDF") and list(target.parent.iterdir()) == [target]


def test_chart_is_svg_with_escaped_labels():
    svg = str(bar_chart([("R&D", Decimal("-1200"), Decimal("-300")), ("Sales", Decimal("5000"), None)], "Oct", "Sep"))
    assert svg.startswith("<svg") and "R&amp;D" in svg and svg.count("<rect") == 3 + 2  # bars + legend


def report_of(schedule: Schedule, narrative_text: str = NARRATIVE) -> tuple[str, dict]:
    """The report's HTML and context for `schedule` over its pinned period, with `narrative_text` as the model's."""
    checked = run_checks_for(schedule, schedule.as_of)
    narrative = read_narrative(narrative_text, GenerationStats(prompt_tokens=400, generated_tokens=60, elapsed=30.0))
    stats = GenerationStats(prompt_tokens=400, generated_tokens=60, time_to_first_token=20.0, elapsed=30.0,
                            peak_memory_bytes=10**8, finish_reason="length", drive_bytes={"ssd0": 123456789},
                            cache_hits=1234, prefetch_recall=0.87)  # fmt: skip
    provenance = Provenance("/models/m", 160, 0.0, 0, stats, [], [], str(schedule.file), "abc", "test")
    created = datetime(2026, 10, 30, 22, 5, tzinfo=UTC)
    prompt = Prompt("system", "user", len(checked.result.findings))
    context = build_report_context(schedule, checked, prompt, narrative, provenance, created)
    return render_html(schedule.report_template, context), context


@pytest.fixture(scope="module")
def month_end_html():
    schedules, _ = load_schedules()
    return report_of(schedules["month-end"])


def test_model_text_is_escaped_and_every_figure_in_it_is_the_template_s(month_end_html):
    """Since [19] the model's figures are never printed: the summary's (a finding's amounts, an invented 7,777)
    are refused there, and a finding's line prints its figures from the finding (100.00 is its -100.00)."""
    html, context = month_end_html
    assert "<script>" not in html and "alert(" not in html and "7,777" not in html
    assert [r.reason for r in context["narrative"].gated.refused] == ["unplaced", "unplaced"]  # <script>alert(1)
    assert (
        'F4: Find the <span class="verified" title="placed from the finding: difference">-100.00</span> difference.'
        in html
    )
    assert (
        'Check <span class="name" title="placed from the finding: reference">INV-5010</span> &amp; its duplicate.'
        in html
    )
    assert "ssd0: 123,456,789" in html and "1,234&nbsp;hits" in html and "prefetch recall 87&nbsp;%" in html
    assert "writing 5.9&nbsp;tok/s (the tokens after the first" in html and "read at 20.0&nbsp;tokens/s" in html
    assert "60 written (reached max_tokens)" in html  # the stats' own


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("pdftotext"), reason="pdftotext (poppler-utils) is not installed")
def test_the_pdf_has_pages_headers_and_metadata(month_end_html, tmp_path):
    html, _ = month_end_html
    target = write_pdf(html, tmp_path / "month-end.pdf")
    text = subprocess.run(["pdftotext", "-layout", str(target), "-"], capture_output=True, text=True, check=True).stdout
    info = subprocess.run(["pdfinfo", str(target)], capture_output=True, text=True, check=True).stdout
    pages = int(next(line.split()[-1] for line in info.splitlines() if line.startswith("Pages:")))
    assert pages >= 3 and f"page {pages} of {pages}" in text
    assert "Month-end review · October 2026" in text  # running header
    assert "written by the model" in text and "Provenance" in text
    assert "Title:           Month-end review: October 2026" in info
    assert "Author:          nightshift" in info


def month_end_with(tmp_path, old: str, new: str) -> Schedule:
    """The bundled month-end review with one piece of its text replaced (a source's query, say)."""
    text = (BUNDLED_DIR / "month-end.toml").read_text().replace('"sample-data/', f'"{BUNDLED_DIR}/sample-data/')
    assert old in text
    path = tmp_path / "month-end.toml"
    path.write_text(text.replace(old, new))
    return load_schedule(path)


BALANCES_QUERY = 'query = "SELECT date, balance AS amount, account FROM balances ORDER BY date"'


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        (
            BALANCES_QUERY,
            'query = "SELECT date, balance AS amount FROM balances ORDER BY date"',
            "balances has no balances for account &#39;Bank&#39; (it has no account column or values)",
        ),
        (
            BALANCES_QUERY,
            "query = \"SELECT date, balance AS amount, account FROM balances WHERE date >= '2026-10-01'\"",
            "Bank: balances has no balance before 2026-10-01 (the opening balance)",
        ),
        (
            "FROM entries WHERE posted BETWEEN :start AND :end",
            "FROM entries WHERE posted < '2026-09-20'",
            "ledger has no rows in October 2026 (nor within 3 days of it)",
        ),
    ],
    ids=["balances without the account", "no opening balance", "match with an empty side"],
)
def test_a_check_that_cannot_run_shows_in_the_report_and_its_title_page(tmp_path, old, new, why):
    html, context = report_of(month_end_with(tmp_path, old, new), "Nothing to say.")
    html = html.replace("\u00a0", " ")  # the no-break spaces that keep phrases on one line (app/review/typeset.py)
    title_page = html[html.index('class="title-page"') : html.index('class="narrative"')]
    assert f"could not run: {why}" in title_page  # the title page's list of checks
    assert f"<strong>could not run: {why}" in html  # and a high finding in the findings table
    assert "ran, <span" in title_page and "could not run</span>" in title_page
    assert any(run.state == "not run" for run in context["runs"])
    assert context["headline"].by_severity["high"] >= 1


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("pdftotext"), reason="pdftotext (poppler-utils) is not installed")
def test_the_pdf_says_which_check_could_not_run(tmp_path):
    schedule = month_end_with(tmp_path, BALANCES_QUERY, 'query = "SELECT date, balance AS amount FROM balances"')
    html, _ = report_of(schedule, "Nothing to say.")
    target = write_pdf(html, tmp_path / "month-end.pdf")
    text = subprocess.run(["pdftotext", "-layout", str(target), "-"], capture_output=True, text=True, check=True).stdout
    first_page = text.split("\f")[0]
    assert "Checks: 4 of 5 ran, 1 could not run" in first_page and "not run" in first_page
    assert "could not run: balances has no balances for account" in first_page
