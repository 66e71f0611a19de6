"""A word when an unattended run ends: its report is ready, or it failed.

Two ways, each off or on in service.toml's `[notify]` (app/daemon/settings.py):

- `desktop` (on by default): a desktop notification where one can be shown, `notify-send` (libnotify) on a
  Linux desktop session, `osascript` on macOS; a service with no desktop session shows none, silently.
- `command`: the user's own hook, run with two more arguments, the report's path ("" when the run failed)
  and the run's state (done or failed), and the same in its environment with the review, the run's id and
  the error: NIGHTSHIFT_REPORT, NIGHTSHIFT_STATE, NIGHTSHIFT_REVIEW, NIGHTSHIFT_RUN, NIGHTSHIFT_ERROR.
  Run without a shell, in the background; one that fails or hangs past HOOK_TIMEOUT_S is said in the log.

Interrupted runs (a cancel, the service stopping) are not announced: they are queued again or were asked for.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass

from nightshift.app.daemon.runs import Run

log = logging.getLogger("nightshift.notify")
HOOK_TIMEOUT_S = 60.0
ANNOUNCED = ("done", "failed")


@dataclass(frozen=True)
class NotifySettings:
    desktop: bool = True
    command: tuple[str, ...] = ()  # the hook's argv (shlex-split from service.toml); empty: no hook


def message(run: Run) -> tuple[str, str]:
    """A notification's title and body for a run that ended."""
    if run.state == "done":
        return f"nightshift: {run.review} report ready", run.report or ""
    return f"nightshift: {run.review} failed", f"run {run.id}: {run.error or 'no reason recorded'}"


def desktop_command(title: str, body: str) -> list[str] | None:
    """How to show a desktop notification here; None where there is no way or no desktop session to show it in."""
    if sys.platform == "darwin" and shutil.which("osascript"):
        return ["osascript", "-e", f"display notification {json.dumps(body)} with title {json.dumps(title)}"]
    session = any(os.environ.get(name) for name in ("DISPLAY", "WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS"))
    if shutil.which("notify-send") and session:
        return ["notify-send", "--app-name=nightshift", title, body]
    return None


def announce(settings: NotifySettings, run: Run) -> list[threading.Thread]:
    """Tell the user that `run` ended (done or failed), the ways `settings` turn on; returns the threads that
    wait for the commands (tests join them), started in the background so the worker goes on at once."""
    if run.state not in ANNOUNCED:
        return []
    title, body = message(run)
    commands = []
    if settings.desktop and (shown := desktop_command(title, body)) is not None:
        commands.append((shown, None))
    if settings.command:
        environment = {**os.environ, "NIGHTSHIFT_REPORT": run.report or "", "NIGHTSHIFT_STATE": run.state,
                       "NIGHTSHIFT_REVIEW": run.review, "NIGHTSHIFT_RUN": str(run.id),
                       "NIGHTSHIFT_ERROR": run.error or ""}  # fmt: skip
        commands.append(([*settings.command, run.report or "", run.state], environment))
    threads = [
        threading.Thread(target=_run, args=(argv, env, run), name="notify", daemon=True) for argv, env in commands
    ]
    for thread in threads:
        thread.start()
    return threads


def _run(argv: list[str], environment: dict[str, str] | None, run: Run) -> None:
    """One notification command, to its end; a failure is said in the log, never raised (the run is recorded)."""
    try:
        done = subprocess.run(argv, env=environment, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=HOOK_TIMEOUT_S)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("run %s: the notification %s did not run to its end: %s", run.id, argv[0], exc)
        return
    if done.returncode != 0:
        log.warning("run %s: the notification %s exited %s: %s", run.id, argv[0], done.returncode,
                    done.stderr.strip()[-500:])  # fmt: skip
