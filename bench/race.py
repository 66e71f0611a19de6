"""The race of issue [20]: a foreground `review run`, `serve` started beside it, and a schedule firing during the run.

    .venv/bin/python -m bench.race --model MODEL_DIR --repeat 20

Each repetition, on a fresh data dir with two schedules written by MODEL_DIR (`fore`, which never falls due
during the race, and `tick`, every minute): this script holds the engine lock, as another review generating
would; starts `nightshift review run fore` in its own process (its run claimed, then waiting for the lock);
starts `nightshift serve` beside it; waits until the service's own schedule fires at the next whole minute and
queues `tick`'s run, then pauses `tick` (one due run per race); lets go of the lock; waits until the foreground process has exited and the service
has worked off its queue; stops the service (SIGTERM). Then it checks: the foreground run done exactly once, the
scheduled run done exactly once (any other attempt `interrupted`), one PDF and one report index entry each, both
processes' exit codes, no traceback in their output or the log, and `PRAGMA integrity_check` of runs.sqlite and
scheduler.sqlite. Prints a line per repetition and one JSON line; exits 1 if any check failed.

This script reads the queue only through connections it opens and closes at once: a connection it held open would
hide the fault it looks for (a third process holding the file keeps the other two from deleting its -wal and -shm).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import closing, suppress
from datetime import datetime
from pathlib import Path

from bench.soak import write_schedule
from nightshift.app.daemon import control
from nightshift.engine.errors import NightshiftError

NEVER_DUE = "0 3 1 1 *"  # 03:00 on 1 January: the foreground review's schedule never fires during a race
FIRE_WAIT_S = 75  # the service's schedule fires at the next whole minute after it starts


def read_rows(path: Path, sql: str) -> list[tuple]:
    """Rows of `sql` from the SQLite file at `path` ([] while it or its table is not made yet), through a connection
    closed at once."""
    if not path.exists():
        return []
    with closing(sqlite3.connect(f"{path.as_uri()}?mode=rw", uri=True, timeout=30)) as db:
        try:
            return db.execute(sql).fetchall()
        except sqlite3.OperationalError as exc:
            if str(exc).startswith("no such table"):
                return []
            raise


def integrity(path: Path) -> str:
    try:
        return " ".join(row[0] for row in read_rows(path, "PRAGMA integrity_check")) or "missing"
    except sqlite3.Error as exc:
        return str(exc)


def wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {seconds:.0f} s waiting until {what}")
        time.sleep(0.2)


class Race:
    """One repetition on data dir `home`: its processes, what they printed and what the checks found."""

    def __init__(self, home: Path, model: Path, max_tokens: int):
        self.home = home
        self.queue = home / "runs.sqlite"
        self.env = {**os.environ, "NIGHTSHIFT_HOME": str(home)}
        self.due: datetime | None = None  # when `tick` fell due, once it has
        write_schedule(home, model, max_tokens, "fore", NEVER_DUE)
        write_schedule(home, model, max_tokens, "tick", "* * * * *")
        self.problems: list[str] = []

    def runs(self, review: str) -> list[tuple[str, str | None]]:
        """(state, due) of each run of `review`, oldest first."""
        return [(state, due) for name, state, due in read_rows(self.queue, "SELECT review, state, due FROM runs "
                                                               "ORDER BY id") if name == review]  # fmt: skip

    def settled(self) -> bool:
        return not read_rows(self.queue, "SELECT id FROM runs WHERE state IN ('queued', 'running')")

    def nightshift(self, *args: str, output: int = subprocess.PIPE) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "nightshift.app.cli", *args], env=self.env,
                                stdout=output, stderr=output, text=True)  # fmt: skip

    def serve(self) -> subprocess.Popen:
        """`nightshift serve`, once it answers `ping` with its own pid (its output is in the log)."""
        service = self.nightshift("serve", output=subprocess.DEVNULL)
        wait_until(lambda: service.poll() is not None or (control.request("ping") or {}).get("pid") == service.pid,
                   120, "serve answers")  # fmt: skip
        if service.poll() is not None:
            raise NightshiftError(f"serve exited {service.returncode} at start")
        return service

    def run(self, timeout_s: float) -> dict[str, object]:
        started = time.monotonic()
        fore = service = None
        with open(self.home / "engine.lock", "a") as engine:
            fcntl.flock(engine, fcntl.LOCK_EX)  # another review generating: `fore` claims its run and waits
            try:
                fore = self.nightshift("review", "run", "fore")
                wait_until(lambda: self.runs("fore") == [("running", None)], 120, "the foreground run is claimed")
                service = self.serve()
                wait_until(lambda: bool(self.runs("tick")), FIRE_WAIT_S, "the service's schedule queues its run")
                control.request("pause", review="tick")  # no second due run during this race
                self.due = datetime.fromisoformat(self.runs("tick")[0][1])
            except (TimeoutError, NightshiftError, sqlite3.Error) as exc:
                self.problems.append(f"before the foreground run went on: {exc}")
            finally:
                fcntl.flock(engine, fcntl.LOCK_UN)
        try:
            out, err = fore.communicate(timeout=timeout_s) if fore else ("", "")
            if fore and fore.returncode != 0:
                self.problems.append(f"review run exited {fore.returncode}: {err.strip()[-500:]}")
            if service is not None:
                wait_until(self.settled, timeout_s, "the service has worked off its queue")
        except (subprocess.TimeoutExpired, TimeoutError, sqlite3.Error) as exc:
            self.problems.append(f"after the foreground run went on: {exc}")
            out, err = "", ""
        finally:
            self._stop(fore, service)
        self._check(err)
        return {"due": self.due.isoformat() if self.due else None, "fore": [state for state, _ in self._runs_or_none("fore")],
                "tick": [state for state, _ in self._runs_or_none("tick")], "report": out.strip(),
                "seconds": round(time.monotonic() - started), "problems": self.problems}  # fmt: skip

    def _stop(self, fore: subprocess.Popen | None, service: subprocess.Popen | None) -> None:
        if fore is not None and fore.poll() is None:
            fore.kill()
            fore.wait()
        if service is not None:
            service.send_signal(signal.SIGTERM)
            try:
                code = service.wait(timeout=120)
            except subprocess.TimeoutExpired:
                service.kill()
                code = service.wait()
            if code != 0:
                self.problems.append(f"serve exited {code} at SIGTERM")

    def _runs_or_none(self, review: str) -> list[tuple[str, str | None]]:
        try:
            return self.runs(review)
        except sqlite3.Error as exc:
            return [(f"unreadable: {exc}", None)]

    def _check(self, fore_stderr: str) -> None:
        """Exactly once each, one PDF and one index entry each, no traceback, both databases intact."""
        for name in ("runs.sqlite", "scheduler.sqlite"):
            if (found := integrity(self.home / name)) != "ok":
                self.problems.append(f"{name} integrity_check: {found[:300]}")
        expected = {"fore": None, "tick": self.due}
        for review, due in expected.items():
            runs = self._runs_or_none(review)
            states = Counter(state for state, _ in runs)
            if states["done"] != 1 or set(states) - {"done", "interrupted"}:
                self.problems.append(f"{review}: runs {[state for state, _ in runs]}, not done exactly once")
            if due is not None and any(datetime.fromisoformat(when or "1970-01-01T00:00:00+00:00") != due
                                       for _, when in runs):  # fmt: skip
                self.problems.append(f"{review}: a run with another due time than {due.isoformat()}")
            pdfs = sorted(str(path) for path in (self.home / "reports" / review).glob("*.pdf"))
            if len(pdfs) != 1:
                self.problems.append(f"{review}: {len(pdfs)} PDFs")
            index = self.home / "reports" / "index.json"
            entries = json.loads(index.read_text()) if index.exists() else []
            indexed = sorted(entry.get("path") for entry in entries if entry["review"] == review)
            if indexed != pdfs:
                self.problems.append(f"{review}: index entries {indexed} against PDFs {pdfs}")
        log = (
            (self.home / "nightshift.log").read_text(errors="replace")
            if (self.home / "nightshift.log").exists()
            else ""
        )
        for who, text in (("review run", fore_stderr), ("serve's log", log)):
            if "Traceback" in text or "Logging error" in text:
                self.problems.append(f"{who} printed a traceback")


def race(home: Path, model: Path, max_tokens: int = 8, timeout_s: float = 600) -> dict[str, object]:
    """One repetition on the (empty or missing) data dir `home`; NIGHTSHIFT_HOME is pointed there meanwhile."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    saved = os.environ.get("NIGHTSHIFT_HOME")
    os.environ["NIGHTSHIFT_HOME"] = str(home)  # for this process's `ping` of the service
    try:
        return Race(home, model, max_tokens).run(timeout_s)
    finally:
        if saved is None:
            del os.environ["NIGHTSHIFT_HOME"]
        else:
            os.environ["NIGHTSHIFT_HOME"] = saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="model directory both reviews are written by")
    parser.add_argument("--repeat", type=int, default=20, help="repetitions, each on a fresh data dir (20)")
    parser.add_argument("--max-tokens", type=int, default=8, help="the reviews' max_tokens (8)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a repetition's runs may take (900)")
    args = parser.parse_args()
    results = []
    for number in range(1, args.repeat + 1):
        with tempfile.TemporaryDirectory() as scratch:
            result = race(Path(scratch) / "home", args.model.resolve(), args.max_tokens, args.timeout)
        results.append(result)
        verdict = "clean" if not result["problems"] else "; ".join(result["problems"])
        print(f"{time.strftime('%H:%M:%S')} {number:>3}  fore {result['fore']}  tick {result['tick']}  "
              f"{result['seconds']} s  {verdict}", flush=True)  # fmt: skip
    problems = [problem for result in results for problem in result["problems"]]
    print(json.dumps({"repetitions": len(results), "clean": sum(not result["problems"] for result in results),
                      "model": str(args.model), "max_tokens": args.max_tokens,
                      "seconds": sum(result["seconds"] for result in results), "problems": problems}))  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    with suppress(KeyboardInterrupt):
        sys.exit(main())
