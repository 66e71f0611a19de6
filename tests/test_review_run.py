"""Running reviews end to end on a tiny real model: in the foreground, through the service, and across a kill."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from nightshift.app.cli import main
from tests.helpers.service import serve, states, user_schedule
from tests.helpers.waits import wait_for


@pytest.mark.slow
def test_review_run_in_the_foreground_then_jobs_and_reports(home, tiny_model, capsys):
    user_schedule(home, tiny_model)
    assert main(["review", "run", "tiny"]) == 0
    report = Path(capsys.readouterr().out.strip())
    assert report.is_file() and report.read_bytes().startswith(b"%PDF")
    assert [p.name for p in report.parent.iterdir()] == [report.name]  # no temporary file left behind
    assert main(["jobs"]) == 0
    jobs = capsys.readouterr().out
    assert "service: not running" in jobs and "done        tiny" in jobs and str(report) in jobs
    assert main(["reports", "list"]) == 0
    assert str(report) in capsys.readouterr().out
    assert main(["reports", "open", "tiny", "--print-only"]) == 0
    assert capsys.readouterr().out.strip() == str(report)


def test_unknown_review_and_bad_date(home, capsys):
    assert main(["review", "run", "nope"]) == 1
    assert (
        "no review named 'nope' (known: beancount, camt053, daily, month-end, mt940, ofx, weekly)"
        in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        main(["review", "run", "daily", "--as-of", "30/10/2026"])
    assert "'30/10/2026' is not a date; write YYYY-MM-DD" in capsys.readouterr().err


def test_review_list_reports_a_broken_schedule_and_lists_the_rest(home, capsys):
    (home / "schedules").mkdir(parents=True)
    (home / "schedules" / "bad.toml").write_text('when = "every day at 7"\n[sources]\n')
    assert main(["review", "list"]) == 0
    captured = capsys.readouterr()
    assert [line.split()[0] for line in captured.out.splitlines()] == [
        "beancount",
        "camt053",
        "daily",
        "month-end",
        "mt940",
        "ofx",
        "weekly",
    ]
    assert f"{home / 'schedules' / 'bad.toml'}:1: field `when`" in captured.err


def test_serve_install_writes_a_user_unit(home, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert main(["serve", "--install"]) == 0
    unit = (tmp_path / "config" / "systemd" / "user" / "nightshift.service").read_text()
    assert f"ExecStart={sys.executable} -m nightshift.app.cli serve" in unit and f"NIGHTSHIFT_HOME={home}" in unit
    assert (
        "systemctl --user daemon-reload && systemctl --user enable --now nightshift.service" in capsys.readouterr().err
    )
    from nightshift.app.daemon.install import launchd_plist

    assert "<string>serve</string>" in launchd_plist() and "org.nightshift.serve" in launchd_plist()


@pytest.mark.slow
def test_the_service_runs_queued_reviews_and_a_kill_loses_nothing(home, tiny_model, capsys):
    user_schedule(home, tiny_model, "long", max_tokens=4000)  # long enough to be killed in the middle
    user_schedule(home, tiny_model, "short", max_tokens=4)
    service = serve(home)
    try:
        assert stat.S_IMODE((home / "nightshift.sock").stat().st_mode) == 0o600
        second = subprocess.run([sys.executable, "-m", "nightshift.app.cli", "serve"], capture_output=True, text=True,
                                env={**os.environ, "NIGHTSHIFT_HOME": str(home)}, timeout=60)  # fmt: skip
        assert second.returncode == 1 and "already running" in second.stderr
        assert main(["review", "run", "long", "--no-wait"]) == 0
        assert main(["review", "run", "short", "--no-wait"]) == 0
        assert "queued as run 2 in the running service" in capsys.readouterr().err
        wait_for(lambda: states(home)[:2] == [(1, "long", "running"), (2, "short", "queued")])
        assert main(["jobs"]) == 0
        jobs = capsys.readouterr().out
        assert "service: running" in jobs and "running     long" in jobs and "queued      short" in jobs
    finally:
        service.send_signal(signal.SIGKILL)
        service.wait()
    assert states(home) == [(1, "long", "running"), (2, "short", "queued")]  # as the kill left them
    user_schedule(home, tiny_model, "long", max_tokens=4)  # the retry may finish quickly
    service = serve(home)
    try:
        wait_for(lambda: [s for _, _, s in states(home)] == ["interrupted", "done", "done"])
        assert [review for _, review, _ in states(home)] == ["long", "short", "long"]
        assert main(["reports", "list"]) == 0
        assert capsys.readouterr().out.count(".pdf") == 2
    finally:
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=60) == 0
    assert not (home / "nightshift.sock").exists()


@pytest.mark.slow
def test_the_service_tells_a_hook_of_each_finished_report_and_each_failure(home, tiny_model, tmp_path):
    """[notify] command in service.toml: run once per run that ended, with the report's path (empty for a
    failure) and the state, and the same in its environment."""
    user_schedule(home, tiny_model, "short", max_tokens=4)
    broken = user_schedule(home, tiny_model, "broken", max_tokens=4)
    broken.write_text(broken.read_text().replace("bank-statement.csv", "no-such-statement.csv", 1))
    heard = tmp_path / "heard.jsonl"
    hook = tmp_path / "hook.py"
    hook.write_text(
        "import json, os, sys\n"
        f"with open({str(heard)!r}, 'a') as out:\n"
        "    out.write(json.dumps([sys.argv[1:], os.environ['NIGHTSHIFT_REVIEW'], os.environ['NIGHTSHIFT_RUN'],"
        " os.environ['NIGHTSHIFT_REPORT']]) + '\\n')\n"
    )
    (home / "service.toml").write_text(f"[notify]\ndesktop = false\ncommand = '{sys.executable} {hook}'\n")
    service = serve(home)
    try:
        for name in ("short", "broken", "short"):
            assert main(["review", "run", name, "--no-wait"]) == 0
        wait_for(lambda: heard.exists() and len(heard.read_text().splitlines()) == 3)
    finally:
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=60) == 0
    calls = [json.loads(line) for line in heard.read_text().splitlines()]
    with sqlite3.connect(home / "runs.sqlite") as db:
        reports = dict(db.execute("SELECT id, report FROM runs WHERE state = 'done'").fetchall())
    assert sorted(reports) == [1, 3] and all(Path(path).is_file() for path in reports.values())
    assert sorted(calls, key=lambda call: int(call[2])) == [
        [[reports[1], "done"], "short", "1", reports[1]],
        [["", "failed"], "broken", "2", ""],
        [[reports[3], "done"], "short", "3", reports[3]],
    ]
