"""[notify] in service.toml: what is read from it, and what a run's end says (the service test in
tests/test_review_run.py checks that a hook hears of every finished report)."""

from __future__ import annotations

import sys

import pytest

from nightshift.app.daemon.notify import NotifySettings, announce, desktop_command, message
from nightshift.app.daemon.runs import Run
from nightshift.app.daemon.settings import SettingsError, load_settings

DONE = Run(3, "month-end", None, None, "schedule", "done", "2026-12-01T10:00:00+00:00", "2026-12-01T10:00:01+00:00",
           "2026-12-01T10:02:00+00:00", "/r/month-end.pdf", None, None, None)  # fmt: skip


def test_notify_settings_are_read_and_checked(home):
    home.mkdir(parents=True)
    assert load_settings().notify == NotifySettings(desktop=True, command=())  # on by default, no hook
    (home / "service.toml").write_text('[notify]\ndesktop = false\ncommand = "/home/me/on report.sh --quiet"\n')
    assert load_settings().notify == NotifySettings(False, ("/home/me/on", "report.sh", "--quiet"))
    (home / "service.toml").write_text("[notify]\ncommand = \"'/home/me/on report.sh' --quiet\"\n")
    assert load_settings().notify.command == ("/home/me/on report.sh", "--quiet")
    for text, said in (("desktop = 1", "true or false"), ("command = ['a']", "as a string"),
                       ("command = \"'unclosed\"", "quotes"), ("sound = true", "unknown key")):  # fmt: skip
        (home / "service.toml").write_text(f"[notify]\n{text}\n")
        with pytest.raises(SettingsError, match=said):
            load_settings()


def test_what_a_run_end_says():
    assert message(DONE) == ("nightshift: month-end report ready", "/r/month-end.pdf")
    failed = Run(**{**DONE.__dict__, "state": "failed", "report": None, "error": "bank-statement.csv: no such file"})
    assert message(failed) == ("nightshift: month-end failed", "run 3: bank-statement.csv: no such file")
    interrupted = Run(**{**DONE.__dict__, "state": "interrupted"})
    assert announce(NotifySettings(True, (sys.executable, "-c", "")), interrupted) == []  # asked for: not announced


def test_a_desktop_notification_only_with_a_session(monkeypatch):
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    if sys.platform != "darwin":
        assert desktop_command("t", "b") is None  # a service with no desktop session shows nothing
