"""Real processes killed at every step of a run (issue [12]): each due run ends done exactly once, one report.

`nightshift serve` runs as a child process on the tiny model; the test stops it with SIGKILL (and
power loss looks the same to the data dir: commits are synchronous), SIGTERM or SIGINT while a run
is claimed or being written, starts it again, and reads the queue, the report folder and the index.
A foreground `review run` beside a starting service, a stopped (SIGSTOP) service, a read-only and a
full data dir are here too. All slow; the full and read-only data dirs need root (a small tmpfs).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest

from nightshift.app.daemon.control import request
from nightshift.app.daemon.runs import RunQueue
from nightshift.app.review.index import read_index
from nightshift.app.review.schedule import BUNDLED_DIR
from tests.helpers.service import nightshift, serve, user_schedule
from tests.helpers.waits import wait_for

pytestmark = pytest.mark.slow
DUE = datetime(2026, 10, 30, 22, 0, tzinfo=UTC)


def settled() -> bool:
    return all(run.state not in ("queued", "running") for run in RunQueue().recent(1000))


def stop(service: subprocess.Popen) -> None:
    service.send_signal(signal.SIGTERM)
    assert service.wait(timeout=120) == 0


def done_once(home: Path, review: str) -> None:
    """The review's due run ended done exactly once, every other attempt interrupted; one PDF, one index entry."""
    runs = [run for run in RunQueue().recent(1000) if run.review == review]
    assert [run.state for run in runs].count("done") == 1, [(run.id, run.state, run.error) for run in runs]
    assert all(run.state in ("done", "interrupted") for run in runs)
    assert all(run.due == DUE for run in runs)
    (report,) = (home / "reports" / review).glob("*.pdf")
    assert [entry.path for entry in read_index() if entry.review == review] == [str(report)]


WHEN = {
    "claimed": lambda run: run.state == "running",
    "writing": lambda run: run.state == "running" and run.progress is not None and run.progress.generated_tokens > 2,
}


@pytest.mark.parametrize("when", sorted(WHEN))
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["KILL", "TERM", "INT"])
def test_a_due_run_is_done_exactly_once_whatever_stops_the_service(home, tiny_model, signum, when):
    user_schedule(home, tiny_model, "due", max_tokens=400)
    run_id = RunQueue().enqueue("due", due=DUE, origin="schedule")  # fell due while the service was off
    service = serve(home)
    try:
        wait_for(lambda: WHEN[when](RunQueue().get(run_id)) or RunQueue().get(run_id).state == "done", 300)
    finally:
        service.send_signal(signum)
        code = service.wait(timeout=120)
    assert code == (-signal.SIGKILL if signum == signal.SIGKILL else 0)
    first = RunQueue().get(run_id)
    if first.state != "done":  # the signal landed mid-run
        if signum != signal.SIGKILL:  # a stop the service saw: interrupted and queued again, as it says
            assert first.state == "interrupted" and [r.origin for r in RunQueue().recent()].count("retry") == 1
        jobs = nightshift(home, "jobs").stdout  # true without the service: nothing shown running
        assert not re.search(r"^\s*\d+\s+running ", jobs, re.MULTILINE), jobs
    service = serve(home)
    try:
        wait_for(settled, 300)
    finally:
        stop(service)
    done_once(home, "due")


def test_a_foreground_run_beside_a_starting_service_is_left_to_finish(home, tiny_model):
    user_schedule(home, tiny_model, "fore", max_tokens=600)
    foreground = subprocess.Popen([sys.executable, "-m", "nightshift.app.cli", "review", "run", "fore"],
                                  env={**os.environ, "NIGHTSHIFT_HOME": str(home)},
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        wait_for(lambda: (home / "runs.sqlite").exists() and RunQueue().recent() and
                 RunQueue().recent()[0].state == "running", 120)  # fmt: skip
        service = serve(home)
        try:
            (run,) = RunQueue().recent()
            assert run.state == "running" and run.pid == foreground.pid  # not interrupted, not run again
            assert "running     fore" in nightshift(home, "jobs").stdout
            assert foreground.wait(timeout=300) == 0
            # `jobs` makes the service look for runs whose process ended: the foreground's is done, not one of them.
            assert "done        fore" in nightshift(home, "jobs").stdout
        finally:
            stop(service)
    finally:
        foreground.kill()
    (run,) = RunQueue().recent()
    assert run.state == "done" and len(list((home / "reports" / "fore").glob("*.pdf"))) == 1
    assert len(read_index()) == 1


ENDLESS = """WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n)
SELECT '2026-10-01' AS date, '1.00' AS amount, 'r' AS reference, 'a' AS account, 'm' AS description FROM n WHERE i < 0"""


def endless_ledger(home: Path, model: Path, name: str, budget: str = "") -> None:
    """The month-end review with a ledger query that never ends (and never returns a row)."""
    schedule = user_schedule(home, model, name, max_tokens=4)
    text = schedule.read_text()
    start = text.index('query = """', text.index("[sources.ledger]"))
    end = text.index('"""', start + len('query = """')) + 3
    schedule.write_text(f'{text[:start]}query = """{ENDLESS}"""\n{budget}{text[end:]}')


def test_an_endless_sqlite_query_stops_at_sigterm_and_at_its_budget(home, tiny_model):
    endless_ledger(home, tiny_model, "endless")
    endless_ledger(home, tiny_model, "budgeted", "timeout_seconds = 2\n")
    service = serve(home)
    try:
        endless = RunQueue().enqueue("endless", due=DUE, origin="schedule")
        wait_for(lambda: RunQueue().get(endless).state == "running", 120)
        ledger = str((BUNDLED_DIR / "sample-data" / "ledger.sqlite").resolve())

        def in_query() -> bool:  # the ledger is open only while its query runs
            return ledger in {file.path for file in psutil.Process(service.pid).open_files()}

        wait_for(in_query, 120, "the service in the ledger's query", 0.05)
        service.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert service.wait(timeout=60) == 0
        assert time.monotonic() - started < 20  # the query was stopped, not waited for
    finally:
        service.kill()
    assert RunQueue().get(endless).state == "interrupted"
    assert [run.origin for run in RunQueue().recent() if run.review == "endless"].count("retry") == 1
    assert "budgeted" in nightshift(home, "review", "list").stdout
    result = nightshift(home, "review", "run", "budgeted", timeout=120)
    assert result.returncode == 1 and "longer than its 2 s budget" in result.stderr, result.stderr


def test_a_stopped_service_gives_jobs_a_clear_message(home, tiny_model):
    service = serve(home)
    service.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        jobs = nightshift(home, "jobs")
        assert jobs.returncode == 1 and time.monotonic() - started < 30
        assert "did not answer within 10 s: it may be stopped (SIGSTOP)" in jobs.stderr
        assert "Traceback" not in jobs.stderr
    finally:
        service.send_signal(signal.SIGCONT)
        stop(service)


def test_sigusr1_writes_every_threads_stack_and_the_service_goes_on(home):
    """A service that seems stuck can be asked where each thread is, without stopping it."""
    service = serve(home)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(service.stderr), daemon=True)  # until stderr closes
    reader.start()
    try:
        service.send_signal(signal.SIGUSR1)
        wait_for(lambda: any("in _worker" in line for line in lines), 60, "the worker thread's stack on stderr")
        assert any("in _watchdog" in line for line in lines)
        assert (request("ping") or {}).get("pid") == service.pid
    finally:
        stop(service)


@pytest.fixture
def small_home(tmp_path, monkeypatch) -> Path:
    """NIGHTSHIFT_HOME on a 16 MiB tmpfs (root)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a small tmpfs as the data dir")
    home = tmp_path / "home"
    home.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(home)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    monkeypatch.setenv("NIGHTSHIFT_HOME", str(home))
    yield home
    subprocess.run(["umount", "-l", str(home)], check=False)


def fill(folder: Path) -> Path:
    """Fill the file system under `folder` to the last byte; returns the filler file."""
    filler = folder / "filler"
    handle = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(handle, b"\0" * 65536):
            pass
    except OSError:
        with_small = b"\0" * 512
        try:
            while os.write(handle, with_small):
                pass
        except OSError:
            pass  # full
    finally:
        os.close(handle)
    return filler


def test_a_read_only_data_dir_gives_messages_not_tracebacks(small_home, tiny_model):
    user_schedule(small_home, tiny_model, "ro", max_tokens=4)
    queue = RunQueue()
    queue.enqueue("ro")
    queue.db.close()  # this process's connection holds the file open for writing: the remount would be refused
    subprocess.run(["mount", "-o", "remount,ro", str(small_home)], check=True)
    for args, said in ((["jobs"], "cannot be read or written"),
                       (["review", "run", "ro"], "is on a read-only file system; mount it read-write")):  # fmt: skip
        result = nightshift(small_home, *args)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert said in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_full_data_dir_fails_the_run_with_its_reason_and_the_worker_goes_on(small_home, tiny_model):
    user_schedule(small_home, tiny_model, "full", max_tokens=400)
    service = serve(small_home)
    try:
        first = RunQueue().enqueue("full")
        wait_for(lambda: WHEN["writing"](RunQueue().get(first)), 300)
        filler = fill(small_home)  # mid-generation: live figures, the PDF and the queue's writes all fail
        wait_for(lambda: "No space left" in (small_home / "nightshift.log").read_text(errors="replace"), 300)
        time.sleep(2)  # the service lives on with its disk full: the time it lasts is what is tested
        assert service.poll() is None and "Traceback" not in nightshift(small_home, "jobs").stderr
        # The worker has ended the run and cannot record it yet: `jobs` says how it ended, not `running`.
        wait_for(lambda: "not in the run queue yet" in nightshift(small_home, "jobs").stdout, 120)
        jobs = nightshift(small_home, "jobs").stdout
        assert re.search(rf"^\s*{first}\s+failed .*No space left", jobs, re.MULTILINE), jobs
        filler.unlink()  # the cause clears: the failure is recorded with its reason, the queue moves on
        wait_for(lambda: RunQueue().get(first).state != "running", 120)
        assert RunQueue().get(first).state == "failed" and "No space left" in RunQueue().get(first).error
        second = RunQueue().enqueue("full")
        wait_for(lambda: RunQueue().get(second).state == "done", 300)
    finally:
        stop(service)
