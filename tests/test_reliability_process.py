"""Process faults: the service killed while writing a PDF, and a full disk under the report folder."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from nightshift.app.cli import main
from nightshift.app.daemon.runs import RunQueue
from nightshift.app.review.index import read_index
from tests.helpers.service import serve, states, user_schedule
from tests.helpers.waits import wait_for

ROOT = os.geteuid() == 0


def with_output(schedule: Path, output: Path) -> None:
    text = schedule.read_text()
    schedule.write_text(text.replace(f'output = "reports/{schedule.stem}"', f'output = "{output}"'))


ATTEMPTS = 5


def whole(pdf: Path) -> bool:
    return pdf.read_bytes().rstrip().endswith(b"%%EOF")


def kill_while_writing(home: Path, reports: Path) -> bool:
    """Start the service, run the review and SIGKILL the service as soon as a PDF is being written.

    True when the kill landed mid-write: the temporary file is still there afterwards (a dead process
    can neither finish nor remove it). False when the write ended first, between the test seeing the
    file and the signal (the test's process can be descheduled for that long on a loaded machine).
    """
    service = serve(home)
    try:
        assert main(["review", "run", "pdf", "--no-wait"]) == 0

        def writing() -> bool:
            assert service.poll() is None, "the service ended before it wrote a PDF"
            return reports.is_dir() and bool(list(reports.glob(".*.pdf.part")))

        wait_for(writing, 300, "a PDF being written", 0.002)
    finally:
        service.send_signal(signal.SIGKILL)
        service.wait()
    return bool(list(reports.glob(".*.pdf.part")))


@pytest.mark.slow
def test_a_kill_while_the_pdf_is_written_leaves_no_partial_report_and_the_run_is_redone(home, tiny_model):
    user_schedule(home, tiny_model, "pdf", max_tokens=4)
    reports = home / "reports" / "pdf"
    if not any(kill_while_writing(home, reports) for _ in range(ATTEMPTS)):
        pytest.fail(f"in {ATTEMPTS} tries no kill landed while a PDF was being written")
    # Killed mid-write: the half PDF is only a temporary file; anything under a report's name is whole.
    assert all(whole(pdf) for pdf in reports.glob("*.pdf"))
    (killed,) = [run_id for run_id, _, state in states(home) if state == "running"]
    assert RunQueue().get(killed).report is None
    service = serve(home)
    try:
        wait_for(lambda: not {state for _, _, state in states(home)} & {"queued", "running"}, 300)
    finally:
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=300) == 0
    with sqlite3.connect(home / "runs.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    runs = RunQueue().recent(100)
    assert next(run for run in runs if run.id == killed).state == "interrupted"
    (retry,) = [run for run in runs if run.id > killed and run.origin == "retry"]  # re-run once
    assert retry.state == "done" and whole(Path(retry.report))
    assert not list(reports.glob(".*"))  # no temporary file left
    assert all(run.state in ("done", "interrupted") for run in runs)
    entries = read_index()  # the killed run left no entry; its retry's report did, once
    assert all(entry.state == "done" for entry in entries) and killed not in {e.run for e in entries}
    assert [entry.path for entry in entries if entry.run == retry.id] == [retry.report]


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs holding one earlier report, filled to the last byte."""
    if not ROOT or not shutil.which("mount"):
        pytest.skip("needs root to mount a small tmpfs as the report folder")
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        (folder / "earlier.pdf").write_bytes(b"%PDF-1.7 an earlier report\n" * 1000 + b"%%EOF\n")
        filler = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(filler, b"\0" * 4096):
                pass
        except OSError:
            pass  # full
        finally:
            os.close(filler)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.mark.slow
def test_a_full_disk_fails_the_run_clearly_and_keeps_earlier_reports(home, tiny_model, full_disk, capsys):
    with_output(user_schedule(home, tiny_model, "full", max_tokens=4), full_disk)
    earlier = hashlib.sha256((full_disk / "earlier.pdf").read_bytes()).hexdigest()
    assert main(["review", "run", "full"]) == 1
    error = capsys.readouterr().err
    assert f"cannot write the report {full_disk}/full-" in error and "No space left on device" in error
    assert sorted(p.name for p in full_disk.iterdir()) == ["earlier.pdf", "filler"]  # no temporary file left
    assert hashlib.sha256((full_disk / "earlier.pdf").read_bytes()).hexdigest() == earlier
    (run,) = RunQueue().recent()
    assert run.state == "failed" and "No space left on device" in run.error
    (entry,) = read_index()
    assert entry.failed and "No space left on device" in entry.reason
