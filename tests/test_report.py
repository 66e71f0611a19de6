"""Report rendering: model text escaped and its numbers checked, nothing fetched, a complete PDF with metadata."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from nightshift.app.review.charts import bar_chart
from nightshift.app.review.checks import Figures, Finding
from nightshift.app.review.narrative import split_narrative
from nightshift.app.review.report import REPORTS_DIR, local_only_fetcher, render_html, write_pdf
from nightshift.app.review.runner import Provenance, build_report_context, run_checks_for
from nightshift.app.review.schedule import BUNDLED_DIR, Schedule, load_schedule, load_schedules
from nightshift.app.review.verify import mark, verifier_for
from nightshift.app.review.window import window_containing
from nightshift.engine.generation import GenerationStats

NARRATIVE = """The bank shows 1,480.00 not in the ledger and the balance is off by 100.00; roughly 7,777 is at risk. <script>alert(1)</script>
F1: Check INV-5010 & its duplicate.
F4: Find the 100.00 difference."""


def test_numbers_are_marked_verified_or_not_and_text_is_escaped():
    window = window_containing("month", date(2026, 10, 15))
    finding = Finding("match", "high", "In bank, not in ledger: X", "", Decimal("-1480.00"),
                      figures=Figures(amounts=(Decimal("-1480.00"),)))  # fmt: skip
    verifier = verifier_for([finding], [], window, window.previous())
    text = "1,480.00 <b>and</b> 99.5 in October 2026"
    html = str(mark(text, verifier.check(text)))
    assert html == ('<span class="verified">1,480.00</span> &lt;b&gt;and&lt;/b&gt; '
                    '<span class="unverified" title="not a figure of what it is about">99.5</span> in '
                    '<span class="verified">October 2026</span>')  # fmt: skip
    assert [(n.text, n.verified) for n in verifier.check("F1, F2")] == [("F1", True), ("F2", False)]  # one finding


def test_the_narrative_keeps_its_text_and_picks_out_comments():
    narrative = split_narrative(NARRATIVE, GenerationStats())
    assert narrative.text == NARRATIVE
    assert narrative.comments == {1: "Check INV-5010 & its duplicate.", 4: "Find the 100.00 difference."}


def test_control_characters_a_model_emits_are_dropped_line_breaks_and_tabs_kept():
    narrative = split_narrative("Totals\x11 agree.\r\nF2:\x13 check\tthe\x7f fee.\x00", GenerationStats())
    assert narrative.text == "Totals agree.\r\nF2: check\tthe fee."
    assert narrative.comments == {2: "check\tthe fee."}


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
    narrative = split_narrative(narrative_text, GenerationStats(prompt_tokens=400, generated_tokens=60, elapsed=30.0))
    stats = GenerationStats(prompt_tokens=400, generated_tokens=60, time_to_first_token=20.0, elapsed=30.0,
                            peak_memory_bytes=10**8, finish_reason="length", drive_bytes={"ssd0": 123456789},
                            cache_hits=1234, prefetch_recall=0.87)  # fmt: skip
    provenance = Provenance("/models/m", 160, 0.0, 0, stats, [], [], str(schedule.file), "abc", "test")
    created = datetime(2026, 10, 30, 22, 5, tzinfo=UTC)
    context = build_report_context(schedule, checked, "", narrative, provenance, created)
    return render_html(schedule.report_template, context), context


@pytest.fixture(scope="module")
def month_end_html():
    schedules, _ = load_schedules()
    return report_of(schedules["month-end"])


def test_model_text_is_escaped_and_unverified_numbers_highlighted(month_end_html):
    html, context = month_end_html
    assert "<script>" not in html and "&lt;script&gt;alert(" in html
    assert context["unverified"] == ["7,777"]
    assert '<span class="unverified" title="not a figure of what it is about">7,777</span>' in html
    assert '<span class="verified">1,480.00</span>' in html
    assert 'Check <span class="verified">INV-5010</span> &amp; its duplicate.' in html
    assert "ssd0: 123,456,789" in html and "1,234 hits" in html and "prefetch recall 87 %" in html
    assert "prefill 20.0 tok/s, decode 5.9 tok/s" in html and "60 generated (length)" in html  # the stats' own


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
