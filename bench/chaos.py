"""Chaos benchmark: what users do to `nightshift serve` and beside it, with every run checked exactly once.

    sudo .venv/bin/python -m bench.chaos --model MODEL_DIR --runs 1000 --minutes 60 [--schedules 6] [--seed 1]

On a fresh data dir (a tmpfs of its own when run as root, so the disk can be filled; otherwise no disk faults),
with `--schedules` schedules that fire every minute (`tick0`, `tick1`, ...: the service's own scheduler queues
their runs) and one review run by hand (`fg`), all written by MODEL_DIR (use a tiny model: the service is
measured, not the model). At random moments, until `--runs` runs have been asked for or `--minutes` have passed:

- `nightshift review run fg --as-of DATE` from another process, a new date each (so each invocation's runs are
  told apart): while the service is down (it runs in that process, and the service may start beside it) and
  while it is up (it joins the service's queue and is followed);
- `serve` stopped (SIGKILL, SIGTERM, SIGINT) and started again, after a pause in which foreground runs start;
- a foreground run killed (SIGKILL: the service queues it again);
- the data dir filled to the last byte for 1-4 s, then freed;
- a flood of idle and garbage connections on the control socket (`ping` must still be answered).

After every kill, `PRAGMA integrity_check` of runs.sqlite and scheduler.sqlite. At every step `jobs` is sampled
and checked against the processes: a run it shows running is held by a live process (the service or a
foreground run). At the end the schedules are paused, the queue drains, and every run is checked:
each due time a schedule fell due at while the service was up, and each foreground date, has exactly one run
that ended done (or failed, with its reason), any others interrupted, and one outcome in the report index; one
PDF and one index entry per done run; nothing queued or running; both databases intact. A foreground run killed
before it asked for a run, or refused with its reason before it had one (the disk full), is counted apart. This script reads the databases only through
connections it opens and closes at once (one it held would hide lost locks). Prints each event and one JSON
line; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import suppress
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from bench.race import NEVER_DUE, integrity, read_rows
from bench.soak import write_schedule
from nightshift.app.commands.jobs import format_runs
from nightshift.app.daemon import control
from nightshift.app.daemon.runs import Run
from nightshift.engine.errors import NightshiftError

FIRST_AS_OF = date(2001, 1, 1)  # foreground run k reviews the day FIRST_AS_OF + k days
UP_BEFORE_S, UP_AFTER_S = 3.0, 45.0  # a fire time counts as expected if the service was up this long around it
# Actions at each step, by weight: mostly waiting; a stop of the service every ~12 steps.
ACTIONS = {"wait": 14, "foreground": 4, "kill": 1, "term": 1, "int": 1, "kill foreground": 1, "flood": 1, "disk": 2}


class Chaos:
    """The data dir, the service and foreground runs under test, the faults done and what was seen."""

    def __init__(self, home: Path, logs: Path, rng: random.Random, disk: bool, schedules: int):
        self.home, self.logs, self.rng, self.disk, self.schedules = home, logs, rng, disk, schedules
        self.env = {**os.environ, "NIGHTSHIFT_HOME": str(home)}
        self.service: subprocess.Popen | None = None
        self.up: list[list[float]] = []  # [started, stopped] wall times of each service
        self.foreground: dict[int, subprocess.Popen] = {}  # foreground runs not reaped yet, by pid
        self.dates: dict[int, date] = {}  # every foreground run's as-of date, by pid
        self.never_asked: set[date] = set()  # foreground runs killed before they queued or claimed a run
        self.refused: dict[date, str] = {}  # foreground runs refused before they had a run (disk full), and why
        self.exits: Counter[str] = Counter()  # foreground runs' outcomes as their processes said
        self.events: Counter[str] = Counter()
        self.untrue: list[str] = []  # samples where `jobs` said what was not so
        self.damaged: list[str] = []  # integrity checks that did not say ok
        self.samples = 0
        self.filler = home / "filler"
        self.outputs: dict[int, Path] = {}  # each process's output file

    def say(self, text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)

    def nightshift(self, name: str, *args: str) -> subprocess.Popen:
        """A `nightshift` command whose output goes to logs/NAME (outside the data dir, which may be full)."""
        with open(self.logs / name, "w") as output:
            process = subprocess.Popen([sys.executable, "-m", "nightshift.app.cli", *args], env=self.env,
                                       stdout=output, stderr=subprocess.STDOUT)  # fmt: skip
        self.outputs[process.pid] = self.logs / name
        return process

    def said(self, process: subprocess.Popen) -> str:
        return self.outputs[process.pid].read_text(errors="replace")

    def alive(self) -> bool:
        return self.service is not None and self.service.poll() is None

    def start(self) -> None:
        """`nightshift serve`, once it answers `ping` with its own pid (a start that fails is tried again)."""
        while True:
            self.service = self.nightshift(f"serve-{self.events['starts'] + self.events['failed starts']}", "serve")
            deadline = time.monotonic() + 120
            while self.service.poll() is None and time.monotonic() < deadline:
                with suppress(NightshiftError):
                    if (control.request("ping", timeout=5) or {}).get("pid") == self.service.pid:
                        self.events["starts"] += 1
                        self.up.append([time.time(), float("inf")])
                        return
                time.sleep(0.1)
            self.events["failed starts"] += 1
            self.say(f"serve did not come up (exit {self.service.poll()}); freeing the disk and trying again")
            self.service.kill()
            self.service.wait()
            self.filler.unlink(missing_ok=True)

    def stop(self, signum: signal.Signals) -> None:
        """Stop the service with `signum`; foreground runs start during a pause; then it starts again."""
        self.up[-1][1] = time.time()
        self.service.send_signal(signum)
        try:
            code = self.service.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.service.send_signal(signal.SIGUSR1)  # every thread's stack, into its log, before it is killed
            deadline = time.monotonic() + 5
            while "most recent call first" not in self.said(self.service) and time.monotonic() < deadline:
                time.sleep(0.1)
            self.untrue.append(f"serve did not stop within 120 s of {signum.name}; its log ends (thread stacks "
                               f"from SIGUSR1): {self.said(self.service)[-6000:]}")  # fmt: skip
            self.service.kill()
            code = self.service.wait()
        self.events[f"serve {signum.name}"] += 1
        if code not in (0, -signal.SIGKILL) or "Traceback" in self.said(self.service):
            self.untrue.append(f"serve exited {code} at {signum.name}: {self.said(self.service)[-800:]}")
        self.say(f"{signum.name}: serve exited {code}")
        if signum == signal.SIGKILL:
            self.check_integrity("serve killed")
        self.sample()
        for _ in range(self.rng.choice((0, 0, 1, 2))):
            self.start_foreground("before serve")
            time.sleep(self.rng.uniform(0, 3))
        time.sleep(self.rng.uniform(0, 5))  # the foreground runs go on as the service starts beside them
        self.start()

    def start_foreground(self, when: str) -> None:
        as_of = FIRST_AS_OF + timedelta(days=len(self.dates))
        process = self.nightshift(f"fg-{len(self.dates)}", "review", "run", "fg", "--as-of", as_of.isoformat())
        self.foreground[process.pid] = process
        self.dates[process.pid] = as_of
        self.events[f"foreground runs started {when}"] += 1

    def kill_foreground(self) -> None:
        live = [process for process in self.foreground.values() if process.poll() is None]
        if not live:
            return
        self.rng.choice(live).kill()
        self.events["foreground runs killed"] += 1
        self.check_integrity("foreground run killed")

    def reap(self) -> None:
        """Foreground runs that have exited: their outcome as they said it (the queue's is checked at the end)."""
        for pid, process in list(self.foreground.items()):
            if process.poll() is None:
                continue
            err = self.said(process)
            if "Traceback" in err:
                self.untrue.append(f"review run (pid {pid}) printed a traceback: {err[-800:]}")
            outcome = "done" if process.returncode == 0 else "killed" if process.returncode < 0 else "error"
            had_run = re.search(r"\brun \d+", err) is not None  # it says its run's number once it has one
            if outcome == "killed" and not had_run:  # killed before it asked for a run: none to do
                self.never_asked.add(self.dates[pid])
            if outcome == "error" and not had_run:  # refused with its reason before it had a run: none to do
                self.refused[self.dates[pid]] = _reason(err)
            self.exits[outcome if outcome != "error" else f"error: {_reason(err)}"] += 1
            del self.foreground[pid]

    def check_integrity(self, after: str) -> None:
        self.events["integrity checks"] += 1
        for name in ("runs.sqlite", "scheduler.sqlite"):
            if (found := integrity(self.home / name)) not in ("ok", "missing"):
                self.damaged.append(f"{name} after {after}: {found[:300]}")

    def flood(self) -> None:
        """300 idle connections and 20 garbage requests; the service must still answer `ping`."""
        held = []
        for number in range(320):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.setblocking(False)
            try:
                client.connect(str(self.home / "nightshift.sock"))
                if number % 16 == 0:
                    client.send(b"\x00{{not json" * 100 + b"\n")
            except OSError:
                self.events["flood connections refused"] += 1
                client.close()
                continue
            held.append(client)
        started = time.monotonic()
        try:
            answered = (control.request("ping", timeout=20) or {}).get("pid") == self.service.pid
        except NightshiftError as exc:
            answered = False
            self.say(f"flood: ping failed: {exc}")
        self.events["floods"] += 1
        self.events["floods answered"] += answered
        self.say(f"flood of {len(held)} connections: ping answered {answered} after {time.monotonic() - started:.1f} s")
        for client in held:
            client.close()

    def fill_disk(self) -> None:
        """The data dir's file system filled to the last byte for 1-4 s (sampled meanwhile), then freed."""
        handle = os.open(self.filler, os.O_WRONLY | os.O_CREAT, 0o600)
        with suppress(OSError):
            for block in (1 << 20, 4096, 1):
                while os.write(handle, b"\0" * block):
                    pass
        os.close(handle)
        self.events["disk fills"] += 1
        time.sleep(self.rng.uniform(1, 4))
        self.sample()
        self.filler.unlink()

    def runs(self) -> list[Run]:
        rows = read_rows(self.home / "runs.sqlite", "SELECT * FROM runs ORDER BY id")
        names = [column[1] for column in read_rows(self.home / "runs.sqlite", "PRAGMA table_info(runs)")]
        return [Run.from_row(dict(zip(names, row))) for row in rows]

    def sample(self) -> None:
        """`jobs` as the command prints it, checked against the processes: running means held by a live one."""
        self.samples += 1
        holders = self.live()
        try:
            jobs = control.jobs(1000, timeout=30) if self.alive() else None
            runs = jobs.runs if jobs is not None else self.runs()
        except (NightshiftError, OSError) as exc:
            self.events["jobs unanswered"] += 1
            self.say(f"jobs: {exc}")
            return
        holders |= self.live()  # alive before or after `jobs` was read (format_runs checks the owner itself)
        by_id = {run.id: run for run in runs}
        for line in format_runs(runs):
            run_id, state = line.split()[:2]
            if state == "running" and by_id[int(run_id)].pid not in holders:
                self.untrue.append(f"jobs showed run {run_id} running, held by pid {by_id[int(run_id)].pid}; "
                                   f"live: {sorted(holders)}")  # fmt: skip

    def live(self) -> set[int]:
        """The pids of the service and the foreground runs alive now."""
        processes = [*self.foreground.values(), *([self.service] if self.service is not None else [])]
        return {process.pid for process in processes if process.poll() is None}

    def settled(self) -> bool:
        return not self.foreground and all(run.state not in ("queued", "running") for run in self.runs())


def _reason(err: str) -> str:
    """A foreground run's error line, without its run's own numbers and paths, to count alike ones together."""
    line = next((line for line in reversed(err.splitlines()) if "error:" in line), err.strip()[-200:])
    return " ".join(word for word in line.split("error:", 1)[-1].split() if not any(c.isdigit() for c in word))[:120]


def expected_dues(up: list[list[float]], schedules: int, until: float) -> list[tuple[str, datetime]]:
    """Every (schedule, fire time) at which the service was up from UP_BEFORE_S before to UP_AFTER_S after."""
    dues = []
    for started, stopped in up:
        first = datetime.fromtimestamp(started + UP_BEFORE_S, UTC).replace(second=0, microsecond=0)
        fire = first + timedelta(minutes=1)
        while fire.timestamp() + UP_AFTER_S <= min(stopped, until):
            dues += [(f"tick{number}", fire) for number in range(schedules)]
            fire += timedelta(minutes=1)
    return dues


def check(chaos: Chaos, until: float) -> dict[str, object]:
    """Exactly once per due time and foreground date; a PDF and an index entry per done run; intact databases."""
    runs = chaos.runs()
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        key = (run.review, run.due) if run.review != "fg" else ("fg", run.as_of)
        groups.setdefault(key, []).append(run)
    dates = set(chaos.dates.values()) - chaos.never_asked - set(chaos.refused)
    expected = {*expected_dues(chaos.up, chaos.schedules, until), *(("fg", as_of) for as_of in dates)}
    lost = sorted(f"{review} {when}" for review, when in expected if (review, when) not in groups)
    index = chaos.home / "reports" / "index.json"
    entries = json.loads(index.read_text()) if index.exists() else []
    outcomes = Counter(entry.get("run") for entry in entries)  # a report or a failure written, by run id
    twice, stuck, failed = [], [], Counter()
    for (review, when), these in groups.items():
        states = Counter(run.state for run in these)
        written = sum(outcomes[run.id] for run in these)  # an attempt that wrote its outcome and was run again
        if states["done"] + states["failed"] > 1 or written > 1:
            twice.append(f"{review} {when}: {dict(states)}, {written} outcomes in the report index")
        elif states["done"] + states["failed"] == 0 or set(states) - {"done", "failed", "interrupted"}:
            stuck.append(f"{review} {when}: {dict(states)}")
        failed.update(_reason(f"error: {run.error}") for run in these if run.state == "failed")
    done = [run for run in runs if run.state == "done"]
    pdfs = sorted(str(path) for path in (chaos.home / "reports").glob("*/*.pdf"))
    indexed = sorted(entry["path"] for entry in entries if entry.get("state", "done") == "done")
    problems = []
    if sorted(run.report for run in done) != pdfs or indexed != pdfs:
        problems.append(f"{len(done)} done runs, {len(pdfs)} PDFs, {len(indexed)} index entries of reports")
    if len(set(pdfs)) != len(pdfs):
        problems.append("a report appears twice")
    chaos.check_integrity("the end")
    log = (chaos.home / "nightshift.log").read_text(errors="replace").splitlines()
    tracebacks = ["\n".join(log[n - 2 : n + 12]) for n, line in enumerate(log) if line.startswith("Traceback")]
    return {"runs": len(groups), "expected": len(expected), "scheduled": sum(key[0] != "fg" for key in groups),
            "foreground": len(chaos.dates), "killed_before_asking": len(chaos.never_asked),
            "refused": dict(Counter(chaos.refused.values())), "done": len(done), "failed": sum(failed.values()),
            "interrupted": sum(run.state == "interrupted" for run in runs), "rows": len(runs), "pdfs": len(pdfs),
            "lost": lost, "twice": twice, "stuck": stuck, "damaged": chaos.damaged, "failed_reasons": dict(failed),
            "problems": problems, "tracebacks_in_log": tracebacks[:5]}  # fmt: skip


def chaos(home: Path, logs: Path, model: Path, runs: int, minutes: float, seed: int, disk: bool,
          schedules: int) -> dict:  # fmt: skip
    for number in range(schedules):
        write_schedule(home, model, 8, f"tick{number}", "* * * * *", single=True)
    write_schedule(home, model, 8, "fg", NEVER_DUE, single=True)
    rng = random.Random(seed)
    run = Chaos(home, logs, rng, disk, schedules)
    started, loads = time.monotonic(), [os.getloadavg()[0]]
    actions = [action for action in ACTIONS if disk or action != "disk"]
    weights = [ACTIONS[action] for action in actions]
    run.start()
    try:
        while time.monotonic() - started < minutes * 60:
            asked = len(expected_dues(run.up, schedules, time.time())) + len(run.dates)
            if asked >= runs:
                break
            action = rng.choices(actions, weights)[0]
            time.sleep(rng.uniform(0.5, 4.0))
            if action in ("kill", "term", "int"):
                run.stop({"kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT}[action])
            elif action == "foreground":
                run.start_foreground("while serve runs")
            elif action == "kill foreground":
                run.kill_foreground()
            elif action == "flood":
                run.flood()
            elif action == "disk":
                run.fill_disk()
            run.reap()
            run.sample()
            loads.append(os.getloadavg()[0])
        until = time.time()
        run.say(f"{(time.monotonic() - started) / 60:.0f} minutes: no more faults; schedules paused; draining")
        for number in range(schedules):
            control.request("pause", review=f"tick{number}")
        deadline = time.monotonic() + 3600
        while not run.settled() and time.monotonic() < deadline:
            time.sleep(2)
            run.reap()
            run.sample()
    finally:
        run.service.send_signal(signal.SIGTERM)
        run.service.wait(timeout=120)
        for process in run.foreground.values():
            process.kill()
    figures = check(run, until)
    return {**figures, "seed": seed, "disk_faults": disk, "schedules": schedules, "seconds": round(time.monotonic() -
            started), "load_average": {"mean": round(sum(loads) / len(loads), 1), "max": round(max(loads), 1)},
            "events": dict(run.events), "foreground_exits": dict(run.exits), "jobs_samples": run.samples,
            "jobs_untrue": run.untrue}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="model directory (a tiny one)")
    parser.add_argument("--runs", type=int, default=1000, help="runs to ask for: due times and foreground runs (1000)")
    parser.add_argument("--minutes", type=float, default=60, help="ask for none after this many minutes (60)")
    parser.add_argument("--schedules", type=int, default=6, help="schedules firing every minute (6)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tmpfs-mb", type=int, default=256, help="size of the data dir's tmpfs when root (256)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        home, logs = Path(scratch) / "home", Path(scratch) / "logs"
        home.mkdir(mode=0o700)
        logs.mkdir()
        disk = (
            os.geteuid() == 0
            and not subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={args.tmpfs_mb}m,mode=0700", "tmpfs", str(home)]
            ).returncode
        )
        os.environ["NIGHTSHIFT_HOME"] = str(home)
        try:
            figures = chaos(home, logs, args.model.resolve(), args.runs, args.minutes, args.seed, disk,
                            args.schedules)  # fmt: skip
        finally:
            if disk:
                subprocess.run(["umount", "-l", str(home)], check=False)
    print(json.dumps(figures))
    bad = ("lost", "twice", "stuck", "damaged", "problems", "jobs_untrue", "tracebacks_in_log")
    return 1 if any(figures[key] for key in bad) else 0


if __name__ == "__main__":
    sys.exit(main())
