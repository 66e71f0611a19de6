"""A failed run is recorded in the report index with its reason, next to the reports, which stay as they were."""

from __future__ import annotations

import asyncio
import json
from datetime import date

from nightshift.app.cli import main
from nightshift.app.daemon.runs import RunQueue
from nightshift.app.daemon.work import execute
from nightshift.app.paths import reports_index
from nightshift.app.review.index import IndexEntry, add_failure, add_to_index, read_index
from nightshift.app.review.window import window_containing
from tests.helpers.reviews import BANK, month_end_on

EARLIER = {"state": "done", "run": 1, "as_of": "2026-09-30", "review": "month-end", "title": "Month-end review",
           "period": "September 2026", "start": "2026-09-01", "end": "2026-09-30",
           "created": "2026-09-30T22:04:11+01:00", "findings": 3,
           "by_severity": {"high": 1, "medium": 2, "low": 0}, "replaced_sentences": 0, "seconds": 12.5}  # fmt: skip
# An entry as the first index files stored reports: no state, run, title, replaced count or time.
FIRST_FORMAT = {"id": 1, "as_of": "2026-08-31", "review": "month-end", "period": "August 2026",
                "start": "2026-08-01", "end": "2026-08-31", "created": "2026-08-31T22:04:11+01:00",
                "path": "/nowhere/month-end-2026-08-01.pdf", "findings": 2,
                "by_severity": {"high": 0, "medium": 2, "low": 0}}  # fmt: skip


def hostile_review(home, data: bytes) -> None:
    """The bundled month-end review on `data` as its bank statement; its model is any folder (never loaded)."""
    schedule = month_end_on(home, data)
    schedule.write_text(schedule.read_text().replace("max_tokens = 160", f'name = "{home}"\nmax_tokens = 160'))


def test_a_run_failing_on_its_source_leaves_a_failed_entry_with_the_reason(home, capsys):
    earlier_pdf = home / "reports" / "month-end" / "month-end-2026-09-01.pdf"
    earlier_pdf.parent.mkdir(parents=True)
    earlier_pdf.write_bytes(b"%PDF-1.7 an earlier report\n%%EOF\n")
    add_to_index(IndexEntry(**EARLIER, path=str(earlier_pdf)))
    before = reports_index().read_text()
    hostile_review(home, ("\ufeff" + BANK).encode("utf-8")[:-40] + "Caf\xe9\n".encode("latin-1"))
    assert main(["review", "run", "hostile", "--as-of", "2026-10-30"]) == 1
    reason = capsys.readouterr().err
    assert "is not utf-8 text" in reason
    earlier, failed = read_index()
    stored_earlier, stored_failed = json.loads(reports_index().read_text())
    assert stored_earlier == json.loads(before)[0] == {"id": 1, **EARLIER, "path": str(earlier_pdf)}  # untouched
    assert earlier == IndexEntry(id=1, **EARLIER, path=str(earlier_pdf)) and not earlier.missing
    (run,) = RunQueue().recent()
    assert failed.failed and failed.run == run.id and failed.review == "hostile"
    assert failed.as_of == "2026-10-30" and failed.period == "October 2026"
    assert failed.start == "2026-10-01" and failed.end == "2026-10-31"
    assert failed.reason == run.error and "is not utf-8 text" in failed.reason
    assert "\n" not in failed.reason and failed.created.startswith(str(date.today().year))
    assert failed.path is None and not failed.missing
    assert stored_failed["state"] == "failed" and not set(stored_failed) & {"path", "findings", "missing"}

    assert main(["reports", "list"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert "September 2026" in first and "3 findings" in first
    assert f"FAILED (run {run.id}, as of 2026-10-30): " in second and "is not utf-8 text" in second
    assert main(["reports", "open", "--print-only"]) == 0  # the latest report: the failed run has none
    assert capsys.readouterr().out.strip() == str(earlier_pdf)
    assert main(["reports", "open", str(failed.id), "--print-only"]) == 1
    assert f"entry {failed.id} is a failed run, with no report: " in capsys.readouterr().err


def test_an_index_in_the_first_format_is_read_and_kept_as_it_was(home, capsys):
    reports_index().parent.mkdir(parents=True, exist_ok=True)
    reports_index().write_text(json.dumps([FIRST_FORMAT]))
    add_failure("month-end", "no file", 2)
    (first, failed) = read_index()
    assert (first.state, first.run, first.name, first.replaced_sentences, first.seconds) == (
        "done", None, "month-end", 0, None)  # fmt: skip
    assert first.path == FIRST_FORMAT["path"] and first.missing and failed.id == 2
    assert json.loads(reports_index().read_text())[0] == FIRST_FORMAT
    assert main(["reports", "list"]) == 0
    assert "2 findings (0 high)  /nowhere/month-end-2026-08-01.pdf  (file missing)" in capsys.readouterr().out


def test_a_run_whose_review_is_gone_is_recorded_by_name(home):
    queue = RunQueue()
    run = queue.claim(queue.enqueue("vanished"), 1)
    assert execute(queue, run).state == "failed"
    (entry,) = read_index()
    assert entry.review == "vanished" and entry.period is None and entry.as_of is None
    assert "no review named 'vanished'" in entry.reason


def test_interrupted_runs_get_no_entry(home):
    queue = RunQueue()
    queue.claim(queue.enqueue("month-end"), 1)
    queue.recover()  # the service died during the run: interrupted, queued again
    assert read_index() == []


def test_the_dashboard_shows_a_failed_run_apart_from_the_reports(home):
    from nightshift.app.tui.app import Dashboard
    from tests.helpers.dashboard import cells, text
    from tests.helpers.waits import until

    add_to_index(IndexEntry(**EARLIER, path=str(home / "gone.pdf")))
    add_failure("month-end", "source 'bank': no file at /data/bank.csv; fix `path` in the schedule", 7,
                "Month-end review", date(2026, 10, 30), window_containing("month", date(2026, 10, 30)))  # fmt: skip

    async def drive() -> None:
        app = Dashboard()
        async with app.run_test(size=(120, 30)) as pilot:
            await until(pilot, lambda: app.service is not None, 30, "the first refresh")
            await pilot.press("3")
            await until(pilot, lambda: len(cells(app, "#reports")) == 2, 30, "the reports table")
            failed, earlier = cells(app, "#reports")  # newest first
            assert failed[:2] + failed[3:] == ["2", "7", "month-end", "October 2026", "—", "failed"]  # [2]: time
            assert earlier[:2] + earlier[3:] == ["1", "1", "month-end", "September 2026", "3", "missing"]
            summary = text(app, "#summary")
            assert "run 7 FAILED" in summary and "no file at /data/bank.csv" in summary

    asyncio.run(drive())
