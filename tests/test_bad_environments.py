"""Bad inputs and environments a user can make (issue [20]), each through the command a user runs: one line that
says what is wrong and what to do, never a traceback.

These add to the earlier list in tests/test_abuse_inputs.py (hostile CSVs, schedules that do not check out,
templates, prompts, control requests) and the service's faults in tests/test_reliability_service.py and
tests/test_reliability_kills.py; docs/reliability.md lists them all.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from nightshift.app.cli import main
from nightshift.app.review.schedule import BUNDLED_DIR
from tests.helpers.service import nightshift, serve, user_schedule
from tests.helpers.waits import wait_for

DAILY = (BUNDLED_DIR / "daily.toml").read_text().replace('"sample-data/', f'"{BUNDLED_DIR}/sample-data/')


FOLDER, PIPE, DANGLING = "folder", "pipe", "link to nothing"


def made(relative: str, what: bytes | str) -> Callable[[Path], None]:
    """A preparation: `relative` in the data dir made as `what`: bytes (a file holding them), a folder, a named
    pipe or a link to nothing."""

    def make(home: Path) -> None:
        path = home / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if what == FOLDER:
            path.mkdir()
        elif what == PIPE:
            os.mkfifo(path)
        elif what == DANGLING:
            path.symlink_to(home / "nowhere")
        else:
            path.write_bytes(what)

    return make


def under_a_file(home: Path) -> Path:
    (home.parent / "a-file").write_text("not a folder")
    return home.parent / "a-file" / "nightshift"


def a_file(home: Path) -> Path:
    (home.parent / "home-file").write_text("not a folder")
    return home.parent / "home-file"


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    said: str  # a pattern the command's output must show: the error line, or what is listed
    prepare: Callable[[Path], Path | None] = lambda home: None  # makes the bad input; may name another data dir
    code: int = 1


LATIN_1 = 'name = "latin"\ntitle = "T\xe4gliche Pr\xfcfung"\n'.encode("latin-1")
BOM = b"\xef\xbb\xbf" + DAILY.replace('name = "daily"', 'name = "bom"').encode()
LIST = ("review", "list")
CASES = {
    # The data dir itself (NIGHTSHIFT_HOME)
    "data dir under a file": Case(("jobs",), "cannot make the data dir .*a-file is a file, not a folder; set NIGHTSHIFT_HOME", under_a_file),
    "data dir is a file": Case(LIST, "the data dir .*home-file is a file, not a folder; move the file away", a_file),
    "data dir in /proc": Case(("jobs",), "cannot make the data dir /proc/self/none/home: No such file",
                              lambda home: Path("/proc/self/none/home")),
    "data dir name too long": Case(("review", "run", "daily"), "cannot make the data dir .*: File name too long",
                                   lambda home: home / ("x" * 300)),
    # Schedule files that cannot be read: named with the line and skipped; every other review lists and runs
    "schedule in Latin-1": Case(LIST, r"latin\.toml:2: byte 0xe4 is not UTF-8 text; save the file as UTF-8",
                                made("schedules/latin.toml", LATIN_1), 0),
    "schedule in UTF-16": Case(LIST, r"utf16\.toml:1: starts with a UTF-16 byte-order mark",
                               made("schedules/utf16.toml", DAILY.encode("utf-16")), 0),
    "schedule of random bytes": Case(LIST, r"random\.toml:\d+: byte 0x[0-9a-f]{2} is not UTF-8",
                                     made("schedules/random.toml", bytes(range(128, 256)) * 8), 0),
    "a folder named x.toml": Case(LIST, r"x\.toml: is a directory, not a schedule file; move it out",
                                  made("schedules/x.toml", FOLDER), 0),
    "schedule with a TOML error": Case(LIST, r"syntax\.toml:3: not valid TOML",
                                       made("schedules/syntax.toml", b'name = "s"\nwhen = "every day"\n[sources\n'), 0),
    "schedule with an unknown key": Case(LIST, r"typo\.toml:2: field `whenn`: is not a known key; the nearest known "
                                         "key is `when`", made("schedules/typo.toml", b'name = "t"\nwhenn = "x"\n'), 0),
    "a pipe named x.toml": Case(LIST, r"pipe\.toml: is a special file \(a pipe, socket or device\)",
                                made("schedules/pipe.toml", PIPE), 0),
    "schedule nested 5000 deep": Case(LIST, r"deep\.toml: not a schedule: its arrays or tables are nested too deeply",
                                      made("schedules/deep.toml", b"a = " + b"[" * 5000 + b"]" * 5000), 0),
    "a 2 MB schedule": Case(LIST, r"big\.toml: is 2,097,152 bytes, not a schedule file",
                            made("schedules/big.toml", b"#" * (2 << 20)), 0),
    "a link to nothing named x.toml": Case(LIST, r"gone\.toml: is a link to nothing",
                                           made("schedules/gone.toml", DANGLING), 0),
    "schedule with a UTF-8 byte-order mark (read)": Case(LIST, "(?m)^bom ", made("schedules/bom.toml", BOM), 0),
    "another review beside a Latin-1 schedule": Case(("review", "run", "nope"), r"no review named 'nope' \(known: ",
                                                     made("schedules/latin.toml", LATIN_1)),
    "the Latin-1 schedule's own run": Case(("review", "run", "latin"), r"latin\.toml:2: byte 0xe4 is not UTF-8",
                                           made("schedules/latin.toml", LATIN_1)),
    "jobs beside a folder named x.toml": Case(("jobs",), r"note: schedule skipped \(the other reviews run\): .*x\.toml: "
                                              "is a directory", made("schedules/x.toml", FOLDER), 0),
    # Arguments
    "jobs --limit -1": Case(("jobs", "--limit", "-1"), "argument --limit: '-1' is not a number of runs; give 1 to",
                            code=2),
    "jobs --limit 0": Case(("jobs", "--limit", "0"), "'0' is not a number of runs", code=2),
    "jobs --limit abc": Case(("jobs", "--limit", "abc"), "'abc' is not a number of runs", code=2),
    "jobs --limit 10^30": Case(("jobs", "--limit", "1" + "0" * 30), "is not a number of runs; give 1 to 1,000,000",
                               code=2),
    "review run --as-of 0001-01-01": Case(("review", "run", "daily", "--as-of", "0001-01-01"),
                                          "the review failed: .*out of range for a review; use a date in the years 2"),
    # Files in the data dir
    "runs.sqlite not a database": Case(("jobs",), r"the run queue .*runs\.sqlite is damaged \(file is not a "
                                       r"database\); start `nightshift serve`",
                                       made("runs.sqlite", b"not a database" * 400)),
    "runs.sqlite a folder": Case(("jobs",), r"the run queue .*runs\.sqlite cannot be read or written: unable to open "
                                 "database file", made("runs.sqlite", FOLDER)),
    "report index not JSON": Case(("reports", "list"), r"the report index .*index\.json is damaged; move it aside",
                                  made("reports/index.json", b"{[")),
    "run catalogue not a database": Case(("runs", "list"), r"bench_runs\.sqlite is not a usable run catalogue \(file "
                                         r"is not a database\); move it aside", made("bench_runs.sqlite", b"x" * 5000)),
    "engine.lock a folder": Case(("review", "run", "daily"), r"engine\.lock is a folder where nightshift keeps a file; "
                                 "move the folder away", made("engine.lock", FOLDER)),
    "nightshift.sock a plain file": Case(("jobs",), "service: not running", made("nightshift.sock", b""), 0),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_bad_input_or_environment_is_one_line_not_a_traceback(case, home, monkeypatch, capsys):
    home.mkdir(mode=0o700)
    if (other := case.prepare(home)) is not None:
        monkeypatch.setenv("NIGHTSHIFT_HOME", str(other))
    try:
        code = main(list(case.argv))
    except SystemExit as exc:  # argparse's refusal
        code = exc.code
    out, err = capsys.readouterr()
    assert code == case.code, (out, err)
    assert re.search(case.said, out + err), (out, err)
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) <= 1 and "Traceback" not in err, err


def test_a_read_only_or_unwritable_data_dir_is_said_before_a_review_runs(home, capsys):
    home.mkdir(mode=0o700)
    home.chmod(0o500)
    try:
        if os.access(home, os.W_OK):
            pytest.skip(
                "root writes to a folder it may not write (tests/test_reliability_kills.py mounts a read-only one)"
            )
        assert main(["review", "run", "daily"]) == 1
        assert f"the data dir {home} is not writable by you; make it yours (chmod u+rwx)" in capsys.readouterr().err
    finally:
        home.chmod(0o700)


SERVE_CASES = {
    "serve.lock a folder": (lambda home: (home / "serve.lock").mkdir(), r"serve\.lock is a folder where nightshift"),
    "nightshift.log a folder": (lambda home: (home / "nightshift.log").mkdir(), r"nightshift\.log is a folder where"),
    "service.toml not UTF-8": (
        lambda home: (home / "service.toml").write_bytes(b"[service]\nbatch_width = \xe4\n"),
        r"service\.toml: not readable as TOML",
    ),
    "service.toml a folder": (lambda home: (home / "service.toml").mkdir(), r"service\.toml: not readable as TOML"),
}


@pytest.mark.slow
@pytest.mark.parametrize("make, said", SERVE_CASES.values(), ids=SERVE_CASES.keys())
def test_serve_refuses_a_data_dir_it_cannot_use_in_one_line(home, make, said):
    home.mkdir(mode=0o700)
    make(home)
    result = nightshift(home, "serve", timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert re.search(said, result.stderr) and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.slow
def test_serve_keeps_damaged_databases_aside_and_starts(home):
    home.mkdir(mode=0o700)
    (home / "runs.sqlite").write_bytes(b"not a database" * 400)
    (home / "scheduler.sqlite").write_bytes(b"not a database either" * 400)
    service = serve(home)
    try:
        jobs = nightshift(home, "jobs").stdout
        assert "note: repaired at the service's start: the run queue" in jobs, jobs
        assert "note: repaired at the service's start: the scheduler's store" in jobs, jobs
        assert "scheduled   daily" in jobs  # its schedules fire as before
    finally:
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=120) == 0
    assert "Traceback" not in service.stderr.read()
    assert len(list(home.glob("*.damaged-*"))) >= 2


@pytest.mark.slow
def test_serve_starts_beside_unreadable_schedules_runs_the_others_and_names_new_ones_on_sighup(home, tiny_model):
    home.mkdir(mode=0o700)
    user_schedule(home, tiny_model, "good", max_tokens=4)
    made("schedules/latin.toml", LATIN_1)(home)
    made("schedules/x.toml", FOLDER)(home)
    made("schedules/syntax.toml", b'name = "s"\nwhen = "every day"\n[sources\n')(home)
    named = ("latin.toml:2: byte 0xe4 is not UTF-8", "x.toml: is a directory", "syntax.toml:3: not valid TOML")
    service = serve(home)
    try:
        jobs = nightshift(home, "jobs").stdout
        assert all(what in jobs for what in named) and "scheduled   good" in jobs, jobs
        ran = nightshift(home, "review", "run", "good", timeout=300)  # in the service, which runs it
        assert ran.returncode == 0 and "in the running service" in ran.stderr, ran.stderr
        made("schedules/utf16.toml", DAILY.encode("utf-16"))(home)
        service.send_signal(signal.SIGHUP)  # read the schedule files again
        wait_for(lambda: "utf16.toml:1: starts with a UTF-16 byte-order mark" in nightshift(home, "jobs").stdout, 60)
    finally:
        service.send_signal(signal.SIGTERM)
        code = service.wait(timeout=120)
    err = service.stderr.read()
    assert code == 0 and "Traceback" not in err and "Exception in thread" not in err, err
    assert "nightshift: stopping\n" in err  # nothing was running: no run "interrupted and queued again"
    log = (home / "nightshift.log").read_text()
    assert all(what in log for what in (*named, "utf16.toml:1")), log


@pytest.mark.slow
def test_the_dashboard_names_a_skipped_schedule_on_its_queue_screen(home):
    from nightshift.app.tui.app import Dashboard
    from nightshift.app.tui.screens import QueueScreen

    home.mkdir(mode=0o700)
    made("schedules/latin.toml", LATIN_1)(home)

    async def drive() -> str:
        app = Dashboard()
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.press("2")
            deadline = time.monotonic() + 60
            while not (
                isinstance(app.screen, QueueScreen) and "latin.toml" in app.screen.query_one("#queue-note").text
            ):
                assert time.monotonic() < deadline, "the queue screen never named the schedule"
                await pilot.pause(0.1)
            return app.screen.query_one("#queue-note").text

    note = asyncio.run(drive())
    assert "schedule skipped (the other reviews run)" in note and "latin.toml:2: byte 0xe4 is not UTF-8" in note
