"""A user's schedule on a tiny model, and the scheduler service as a process to talk to."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from nightshift.app.daemon.control import request
from nightshift.app.daemon.runs import RunQueue
from nightshift.app.daemon.service import Service
from nightshift.app.review.schedule import BUNDLED_DIR
from tests.helpers.clock import Clock
from tests.helpers.waits import wait_for


def user_schedule(
    home: Path, model: Path, name: str = "tiny", max_tokens: int = 8, bundled: Path = BUNDLED_DIR
) -> Path:
    """The bundled month-end review (from `bundled`, another install's schedules if given), as a user's
    schedule that writes with the tiny model, one answer of `max_tokens` (a run's length is set by it)."""
    text = (bundled / "month-end.toml").read_text()
    text = text.replace('name = "month-end"', f'name = "{name}"').replace('"sample-data/', f'"{bundled}/sample-data/')
    text = text.replace("max_tokens = 160", f'name = "{model}"\nnarrative = "single"\nmax_tokens = {max_tokens}')
    text = text.replace('output = "reports/month-end"', f'output = "reports/{name}"')
    path = home / "schedules" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def nightshift(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`nightshift args...` on `home`, as a user runs it: its exit status, stdout and stderr."""
    return subprocess.run([sys.executable, "-m", "nightshift.app.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "NIGHTSHIFT_HOME": str(home)}, timeout=timeout)  # fmt: skip


def serve(home: Path, *options: str) -> subprocess.Popen:
    """`nightshift serve [options]` on `home`, once it answers on its socket (a killed service's socket may still
    be there)."""
    process = subprocess.Popen([sys.executable, "-m", "nightshift.app.cli", "serve", *options],
                               env={**os.environ, "NIGHTSHIFT_HOME": str(home)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip

    def answers() -> bool:
        assert process.poll() is None, process.stderr.read()
        return (request("ping") or {}).get("pid") == process.pid

    wait_for(answers, 120, "the service to answer on its socket", every=0.1)
    return process


def states(home: Path) -> list[tuple[int, str, str]]:
    with sqlite3.connect(home / "runs.sqlite") as db:
        return db.execute("SELECT id, review, state FROM runs ORDER BY id").fetchall()


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def start(schedules, names) -> Service:
    """A service (not working) on the schedules `names`, its scheduler checked once."""
    service = Service({name: schedules[name] for name in names}, work=False)
    service.start()
    service.scheduler.check_now()
    return service


def queued(review: str | None = None) -> list[str]:
    """Due times (UTC, ISO) of the queued scheduled runs, oldest first."""
    runs = sorted(RunQueue().recent(100), key=lambda run: run.id)
    return [run.due.astimezone(UTC).strftime("%Y-%m-%d %H:%M") for run in runs if review in (None, run.review)]


def step(service: Service, wall: Clock, until: datetime, every: timedelta) -> None:
    """Move the frozen wall clock to `until` in steps of `every`, the scheduler checked at each."""
    while wall.time < until:
        wall.set(min(wall.time + every, until))
        service.scheduler.check_now()
