"""Chaos benchmark: scheduled runs through a real `nightshift serve` that is killed, flooded and starved of disk.

    .venv/bin/python -m bench.chaos --model MODEL_DIR --runs 200 [--minutes 45] [--seed 1] [--tmpfs-mb 48]

Starts `nightshift serve` as a child process on a fresh data dir (a small tmpfs
of its own when run as root, so the disk can be filled; otherwise no disk
faults) with one schedule, the bundled daily review written by MODEL_DIR (use a
tiny model: the service is measured, not the model). Due runs are recorded a few
at a time the way the scheduler's job records them (`record_due_run`, some
twice, as a restarted service would), at about the pace the service works them
off. Between them, at random points: SIGKILL,
SIGTERM or SIGINT of the service (started again at once), the data dir filled
to the last byte and freed a few seconds later, a flood of idle and garbage
connections on the control socket. At every step `jobs` is sampled and checked
against the processes: a run it shows running is held by the live service.

At the end: every due run done exactly once (or failed, with its reason), one
PDF and one index entry per done run, nothing queued or running. With
`--minutes`, no due run is recorded and no fault done after that time (as many
as fit), so the queue can drain. Prints each event
and one JSON line of figures; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.soak import write_schedule
from nightshift.app.commands.jobs import format_runs
from nightshift.app.daemon import control
from nightshift.app.daemon.runs import RunQueue
from nightshift.app.daemon.service import record_due_run
from nightshift.app.review.index import read_index
from nightshift.engine.errors import NightshiftError

FIRST_DUE = datetime(2026, 10, 30, 17, 30, tzinfo=UTC)
ACTIONS = ("wait",) * 25 + ("kill", "term", "int", "flood", "disk")  # a fault every ~6 steps; a stop every ~10


class Chaos:
    """The service under test, the faults done to it and what was seen."""

    def __init__(self, home: Path, rng: random.Random, disk: bool):
        self.home, self.rng, self.disk = home, rng, disk
        self.service: subprocess.Popen | None = None
        self.events: Counter[str] = Counter()
        self.untrue: list[str] = []  # samples where `jobs` said what was not so
        self.samples = 0
        self.filler = home / "filler"

    def say(self, text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)

    def start(self) -> None:
        """`nightshift serve`, once it answers `ping` with its own pid (a start that fails is tried again)."""
        while True:
            self.service = subprocess.Popen([sys.executable, "-m", "nightshift.app.cli", "serve"],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            deadline = time.monotonic() + 120
            while self.service.poll() is None and time.monotonic() < deadline:
                with suppress(NightshiftError):
                    if (control.request("ping", timeout=5) or {}).get("pid") == self.service.pid:
                        self.events["starts"] += 1
                        return
                time.sleep(0.1)
            self.events["failed starts"] += 1
            self.say(f"serve did not come up (exit {self.service.poll()}); freeing the disk and trying again")
            self.service.kill()
            self.service.wait()
            self.filler.unlink(missing_ok=True)

    def signal(self, signum: signal.Signals) -> None:
        self.service.send_signal(signum)
        try:
            code = self.service.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.untrue.append(f"serve did not stop within 120 s of {signum.name}")
            self.service.kill()
            code = self.service.wait()
        self.events[signum.name] += 1
        self.say(f"{signum.name}: serve exited {code}")
        self.sample()
        self.start()

    def flood(self) -> None:
        """300 idle connections and 20 garbage requests; the service must still answer `ping`."""
        path = str(self.home / "nightshift.sock")
        held = []
        for number in range(320):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.setblocking(False)
            try:
                client.connect(path)
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
        self.say("disk full")
        time.sleep(self.rng.uniform(1, 4))
        self.sample()
        self.filler.unlink()
        self.say("disk freed")

    def sample(self) -> None:
        """`jobs` as the command prints it, checked against the processes: running means held by the live service."""
        self.samples += 1
        alive = self.service is not None and self.service.poll() is None
        try:
            jobs = control.jobs(1000, timeout=30) if alive else None
            runs = jobs.runs if jobs is not None else RunQueue().recent(1000)
        except NightshiftError as exc:
            self.events["jobs unanswered"] += 1
            self.say(f"jobs: {exc}")
            return
        for line in format_runs(runs):
            run_id, state = line.split()[:2]
            if state == "running":
                held_by = RunQueue().get(int(run_id)).pid
                if not (alive and held_by == self.service.pid):
                    self.untrue.append(f"jobs showed run {run_id} running, held by pid {held_by}; serve alive {alive}")

    def settled(self) -> bool:
        return all(run.state not in ("queued", "running") for run in RunQueue().recent(100_000))


def check(home: Path, dues: list[datetime]) -> dict[str, object]:
    """Exactly once per due run; one PDF and one index entry per done run; nothing left waiting."""
    runs = RunQueue().recent(100_000)
    problems, failed_reasons = [], Counter()
    for due in dues:
        these = [run for run in runs if run.due == due]
        states = Counter(run.state for run in these)
        if states["done"] + states["failed"] != 1 or set(states) - {"done", "failed", "interrupted"}:
            problems.append(f"due {due.isoformat()}: {dict(states)}")
        failed_reasons.update(run.error.split(":")[0][:80] for run in these if run.state == "failed")
    done = [run for run in runs if run.state == "done"]
    pdfs = sorted(str(path) for path in (home / "reports" / "soak").glob("*.pdf"))
    indexed = sorted(entry.path for entry in read_index() if not entry.failed)
    if sorted(run.report for run in done) != pdfs or indexed != pdfs:
        problems.append(f"{len(done)} done runs, {len(pdfs)} PDFs, {len(indexed)} index entries")
    if len(set(pdfs)) != len(pdfs):
        problems.append("a report appears twice")
    return {"due": len(dues), "done": len(done), "failed": sum(r.state == "failed" for r in runs),
            "interrupted": sum(r.state == "interrupted" for r in runs), "runs_in_queue": len(runs), "pdfs": len(pdfs),
            "failed_reasons": dict(failed_reasons), "problems": problems}  # fmt: skip


def chaos(home: Path, model: Path, runs: int, seed: int, disk: bool, max_tokens: int,
          minutes: float | None) -> dict[str, object]:  # fmt: skip
    write_schedule(home, model, max_tokens)
    rng = random.Random(seed)
    run = Chaos(home, rng, disk)
    dues = [FIRST_DUE + timedelta(days=number) for number in range(runs)]
    recorded = 0
    started = time.monotonic()
    run.start()
    try:
        while recorded < len(dues) or not run.settled():
            if minutes is not None and time.monotonic() - started > minutes * 60 and recorded < len(dues):
                run.say(f"{minutes} minutes passed: {recorded} due runs recorded; letting the queue drain")
                dues = dues[:recorded]
            if recorded < len(dues) and rng.random() < 0.5:
                for due in dues[recorded : recorded + rng.randint(1, 2)]:
                    with suppress(NightshiftError):  # the queue full with the disk: recorded at the next step
                        record_due_run("soak", due)
                        recorded += 1
                        if rng.random() < 0.2:
                            record_due_run("soak", due)  # recorded again, as a restarted service would
            action = rng.choice(ACTIONS if disk else tuple(a for a in ACTIONS if a != "disk"))
            action = action if minutes is None or time.monotonic() - started < minutes * 60 else "wait"
            time.sleep(rng.uniform(0.5, 4.0))
            if action in ("kill", "term", "int"):
                run.signal({"kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT}[action])
            elif action == "flood":
                run.flood()
            elif action == "disk":
                run.fill_disk()
            run.sample()
            if time.monotonic() - started > 3 * 3600:
                run.untrue.append("gave up after 3 hours")
                break
    finally:
        run.service.send_signal(signal.SIGTERM)
        run.service.wait(timeout=120)
    figures = check(home, dues[:recorded])
    return {**figures, "seed": seed, "disk_faults": disk, "seconds": round(time.monotonic() - started),
            "events": dict(run.events), "jobs_samples": run.samples, "jobs_untrue": run.untrue}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="model directory (a tiny one)")
    parser.add_argument("--runs", type=int, default=200, help="due runs to record (200)")
    parser.add_argument("--minutes", type=float, help="record no due run after this many minutes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--tmpfs-mb", type=int, default=48, help="size of the data dir's tmpfs when root (48)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch) / "home"
        home.mkdir(mode=0o700)
        disk = (
            os.geteuid() == 0
            and not subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={args.tmpfs_mb}m,mode=0700", "tmpfs", str(home)]
            ).returncode
        )
        os.environ["NIGHTSHIFT_HOME"] = str(home)
        try:
            figures = chaos(home, args.model.resolve(), args.runs, args.seed, disk, args.max_tokens, args.minutes)
        finally:
            if disk:
                subprocess.run(["umount", "-l", str(home)], check=False)
    print(json.dumps(figures))
    return 1 if figures["problems"] or figures["jobs_untrue"] else 0


if __name__ == "__main__":
    sys.exit(main())
