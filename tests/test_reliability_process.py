"""Process faults: the service killed while writing a PDF, and a full disk under the report folder."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from app.cli import main
from app.daemon.runs import RunQueue
from app.review.index import read_index
from tests.test_review_run import serve, states, tiny_model, user_schedule, wait_for  # noqa: F401 - tiny_model is a fixture

ROOT = os.geteuid() == 0


def with_output(schedule: Path, output: Path) -> None:
    text = schedule.read_text()
    schedule.write_text(text.replace(f'output = "reports/{schedule.stem}"', f'output = "{output}"'))


@pytest.mark.slow
def test_a_kill_while_the_pdf_is_written_leaves_no_partial_report_and_the_run_is_redone(home, tiny_model):
    user_schedule(home, tiny_model, "pdf", max_tokens=4)
    reports = home / "reports" / "pdf"
    service = serve(home)
    try:
        assert main(["review", "run", "pdf", "--no-wait"]) == 0
        deadline = time.monotonic() + 120
        while not (partial := list(reports.glob(".*.pdf.part")) if reports.is_dir() else []):
            assert time.monotonic() < deadline and service.poll() is None, "no PDF was being written"
            time.sleep(0.002)
    finally:
        service.send_signal(signal.SIGKILL)
        service.wait()
    # Killed mid-write: the half PDF is only a temporary file; anything under a report's name is whole.
    assert partial and all(pdf.read_bytes().rstrip().endswith(b"%%EOF") for pdf in reports.glob("*.pdf"))
    service = serve(home)
    try:
        wait_for(lambda: [s for _, _, s in states(home)] == ["interrupted", "done"])
    finally:
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=60) == 0
    with sqlite3.connect(home / "runs.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    (done,) = [run for run in RunQueue().recent() if run.state == "done"]
    assert not list(reports.glob(".*"))  # no temporary file left
    assert Path(done.report).read_bytes().rstrip().endswith(b"%%EOF")
    (entry,) = read_index()  # the interrupted run left no entry; the retry's report did
    assert entry["state"] == "done" and entry["run"] == done.id and entry["path"] == done.report


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs holding one earlier report, filled to the last byte."""
    if not ROOT or not shutil.which("mount"):
        pytest.skip("needs root to mount a small tmpfs as the report folder")
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True, text=True)
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
    assert entry["state"] == "failed" and "No space left on device" in entry["reason"]
