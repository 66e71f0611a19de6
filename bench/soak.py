"""Soak benchmark: many scheduled runs back to back through the real service, with the clock stepped.

    .venv/bin/python -m bench.soak --model MODEL_DIR --runs 200

Starts the scheduler service (scheduler, worker, control socket) in this
process on a fresh data dir, with one schedule: the bundled daily review over
the sample data, written by MODEL_DIR (use a tiny model: the point is the
service, not the model). The wall clock the service and APScheduler read is
moved to each next fire time, so a day passes per run; every due run must be
queued once and finish before the clock moves on. After each run it records
the process's resident memory and open file descriptors. Prints a table and
one JSON line of figures to record: whether memory and descriptors stay flat
is read from those figures, not asserted on time.

    .venv/bin/python -m bench.soak --model MODEL_DIR --dashboard 30 [--max-tokens N]

With `--dashboard MINUTES` it soaks the dashboard instead (issue [24]): a real `nightshift serve` on a fresh
data dir runs the daily review with MODEL_DIR (the default model for a real load) again and again, and the
dashboard (its real feed, headless through Textual's test driver at 160x50; MODEL_DIR linked into the data dir's
models folder, so the device of a streamed store's experts is a drive row, as out of the box) is attached the
whole time. Every half second it records how old each part of what the dashboard shows is (app/tui/ages.py: the
latest snapshot, the drive samples, the queue) and whether the screen said STALE. Prints the oldest figure seen
while the service ran, how many samples were past 5 s, and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import apscheduler.schedulers.base
import psutil

from nightshift.app.daemon import clock
from nightshift.app.daemon.runs import RunQueue
from nightshift.app.daemon.service import Service
from nightshift.app.paths import data_dir
from nightshift.app.review.schedule import BUNDLED_DIR, load_schedules

START = datetime(2026, 10, 28, 12, 0, tzinfo=UTC)  # inside the sample data's pinned period
WARM_UP = 5  # runs before the baseline: the model, fonts and caches load during the first ones


@dataclass
class Sample:
    run: int
    state: str
    seconds: float
    rss_bytes: int
    open_fds: int


@dataclass
class SoakResult:
    samples: list[Sample] = field(default_factory=list)

    def figures(self) -> dict[str, object]:
        """Counts, and memory and descriptors after the warm-up against the end (the flatness to read)."""
        done = sum(sample.state == "done" for sample in self.samples)
        base = self.samples[min(WARM_UP, len(self.samples) - 1)]
        last = self.samples[-1]
        return {
            "runs": len(self.samples), "done": done, "host": platform.node(),
            "rss_mb_after_warm_up": round(base.rss_bytes / 2**20, 1), "rss_mb_end": round(last.rss_bytes / 2**20, 1),
            "rss_mb_max": round(max(s.rss_bytes for s in self.samples) / 2**20, 1),
            "fds_after_warm_up": base.open_fds, "fds_end": last.open_fds,
            "fds_max": max(s.open_fds for s in self.samples),
            "seconds_per_run": round(sum(s.seconds for s in self.samples) / len(self.samples), 2),
        }  # fmt: skip


@contextmanager
def stepped_clock(start: datetime) -> Iterator[list[datetime]]:
    """Wall time for the service and APScheduler that moves only when the caller sets `holder[0]`."""
    holder = [start]

    class SteppedDatetime(datetime):
        @classmethod
        def now(cls, tz=None):
            return holder[0].astimezone(tz) if tz else holder[0].replace(tzinfo=None)

    saved = (apscheduler.schedulers.base.datetime, clock.now)
    apscheduler.schedulers.base.datetime, clock.now = SteppedDatetime, lambda: holder[0]
    try:
        yield holder
    finally:
        apscheduler.schedulers.base.datetime, clock.now = saved


def write_schedule(home: Path, model: Path | None, max_tokens: int, name: str = "soak", when: str | None = None,
                   single: bool = False) -> None:  # fmt: skip
    """The bundled daily review as a user schedule `name` in `home`, written by `model` (None: the default model),
    firing `when` in UTC if given (a crontab line); `single`: one answer of `max_tokens`, not the split narrative."""
    text = (BUNDLED_DIR / "daily.toml").read_text().replace('"sample-data/', f'"{BUNDLED_DIR}/sample-data/')
    text = text.replace('name = "daily"', f'name = "{name}"').replace(
        'output = "reports/daily"', f'output = "reports/{name}"'
    )
    model_line = f'name = "{model}"\n' if model else ""
    single_line = '\nnarrative = "single"' if single else ""
    text = text.replace("max_tokens = 120", f"{model_line}max_tokens = {max_tokens}{single_line}")
    if when is not None:
        text = text.replace('when = "every business day at 18:30"', f'when = "{when}"')
        text = text.replace('timezone = "Europe/London"', 'timezone = "UTC"')
    folder = home / "schedules"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.toml").write_text(text)


def soak(model: Path, runs: int, max_tokens: int = 4, timeout_s: float = 300.0) -> SoakResult:
    """Run `runs` scheduled daily reviews back to back in a service on the current NIGHTSHIFT_HOME."""
    write_schedule(data_dir(), model, max_tokens)
    schedules, errors = load_schedules()
    if errors:
        raise errors[0]
    process, result = psutil.Process(), SoakResult()
    with stepped_clock(START) as now:
        service = Service({"soak": schedules["soak"]})
        service.start()
        try:
            queue = RunQueue()
            for number in range(1, runs + 1):
                started = time.monotonic()
                due = service.scheduler.get_job("soak").next_run_time
                now[0] = due.astimezone(UTC) + timedelta(seconds=1)
                service.scheduler.check_now()
                service.wake_worker.set()
                run = _wait_finished(queue, number, started + timeout_s)
                _wait_idle(service, started + timeout_s)  # the run is recorded before the worker lets go of it
                result.samples.append(Sample(number, run, time.monotonic() - started,
                                             process.memory_info().rss, _open_fds(process)))  # fmt: skip
        finally:
            service.stop()
    return result


def _wait_finished(queue: RunQueue, run_id: int, deadline: float) -> str:
    """The state of run `run_id` once it has finished ('missing' or 'timeout' when it never does)."""
    while time.monotonic() < deadline:
        run = queue.get(run_id)
        if run is not None and run.state not in ("queued", "running"):
            return run.state
        time.sleep(0.02)
    return "missing" if queue.get(run_id) is None else "timeout"


def _wait_idle(service: Service, deadline: float) -> None:
    """Until the worker has returned from the run (its files closed), so a sample sees no half-finished run."""
    while service.running and time.monotonic() < deadline:
        time.sleep(0.02)


def _open_fds(process: psutil.Process) -> int:
    return process.num_fds() if hasattr(process, "num_fds") else len(process.open_files())


AGE_LIMIT_S = 5.0  # issue [24]: no figure older than this while the service runs
SAMPLE_EVERY_S = 0.5


def dashboard_soak(model: Path, minutes: float, max_tokens: int) -> dict[str, object]:
    """The dashboard attached to a real service running reviews for `minutes`: the ages of what it showed."""
    import asyncio

    from nightshift.app.daemon.control import queue_run, request
    from nightshift.app.tui.app import Dashboard

    write_schedule(data_dir(), model, max_tokens)
    (data_dir() / "models").mkdir(parents=True, exist_ok=True)
    (data_dir() / "models" / model.name).symlink_to(model)  # in the models folder: the dashboard shows its drive
    service = subprocess.Popen([sys.executable, "-m", "nightshift.app.cli", "serve"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while (request("ping") or {}).get("pid") != service.pid:
        if service.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the service did not start")
        time.sleep(0.2)
    ages: list[tuple[float, float, float, float, bool]] = []  # (at, snapshot, drives, queue, STALE shown)

    async def watch() -> None:
        app = Dashboard()
        async with app.run_test(size=(160, 50)):
            started = time.monotonic()
            while time.monotonic() - started < minutes * 60:
                await asyncio.sleep(SAMPLE_EVERY_S)
                if app.service is None:
                    continue
                if app.service.running and not any(r.state in ("queued", "running") for r in app.service.jobs.runs):
                    await asyncio.to_thread(queue_run, "soak")  # always a review running or waiting
                now = app.ages(app.clock())
                banner = app.screen.query("#banner")
                stale = bool(banner) and "STALE" in banner.first().text
                ages.append((time.monotonic() - started, now.snapshot, now.drives or 0.0, now.service or 0.0, stale))

    try:
        asyncio.run(watch())
    finally:
        service.terminate()
        service.wait(timeout=120)
    oldest = [max(snapshot, drives, queue) for _, snapshot, drives, queue, _ in ages]
    runs = RunQueue().recent(limit=10_000)
    return {
        "minutes": minutes, "samples": len(ages), "oldest_s": round(max(oldest, default=0.0), 2),
        "samples_over_5_s": sum(age > AGE_LIMIT_S for age in oldest), "stale_shown": sum(a[4] for a in ages),
        "oldest_drives_s": round(max((a[2] for a in ages), default=0.0), 2),
        "oldest_queue_s": round(max((a[3] for a in ages), default=0.0), 2),
        "runs_done": sum(run.state == "done" for run in runs), "runs_failed": sum(run.state == "failed" for run in runs),
        "host": platform.node(),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, required=True, help="model directory (a tiny one: the service is measured)"
    )
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--dashboard", type=float, metavar="MINUTES", help="soak the dashboard instead (see above)")
    args = parser.parse_args()
    if args.dashboard:
        with tempfile.TemporaryDirectory() as home:
            os.environ["NIGHTSHIFT_HOME"] = home
            figures = dashboard_soak(args.model.resolve(), args.dashboard, args.max_tokens)
        print(f"oldest figure while the service ran: {figures['oldest_s']} s; samples past {AGE_LIMIT_S:.0f} s: "
              f"{figures['samples_over_5_s']} of {figures['samples']}; STALE shown in {figures['stale_shown']}")  # fmt: skip
        print(json.dumps(figures))
        return
    with tempfile.TemporaryDirectory() as home:
        os.environ["NIGHTSHIFT_HOME"] = home
        result = soak(args.model.resolve(), args.runs, args.max_tokens)
    print(f"{'run':>5}{'state':>10}{'seconds':>9}{'RSS MB':>9}{'fds':>6}")
    for sample in result.samples:
        if sample.run in (1, 2, WARM_UP, WARM_UP + 1) or sample.run % 25 == 0 or sample.run == len(result.samples):
            print(
                f"{sample.run:>5}{sample.state:>10}{sample.seconds:>9.2f}{sample.rss_bytes / 2**20:>9.1f}{sample.open_fds:>6}"
            )
    print(json.dumps(result.figures()))


if __name__ == "__main__":
    main()
