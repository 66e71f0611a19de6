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
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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


def write_schedule(home: Path, model: Path, max_tokens: int) -> None:
    """The bundled daily review as the data dir's only user schedule, written by `model`."""
    text = (BUNDLED_DIR / "daily.toml").read_text().replace('"sample-data/', f'"{BUNDLED_DIR}/sample-data/')
    text = text.replace('name = "daily"', 'name = "soak"').replace(
        'output = "reports/daily"', 'output = "reports/soak"'
    )
    text = text.replace("max_tokens = 120", f'name = "{model}"\nmax_tokens = {max_tokens}')
    folder = home / "schedules"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "soak.toml").write_text(text)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, required=True, help="model directory (a tiny one: the service is measured)"
    )
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=4)
    args = parser.parse_args()
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
