"""`nightshift serve`: fires schedules, queues their runs, and works through the queue one run at a time.

APScheduler 3 keeps the schedules' next fire times in a SQLite job store, so
a run that fell due while the machine was off is found on start and queued
once if it is still within the schedule's grace. APScheduler sleeps on a
monotonic clock, which stops during a suspend; a watchdog wakes it every
`WATCHDOG_S` seconds so a run that fell due during a sleep or after a clock
jump starts within a minute.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from apscheduler.events import EVENT_JOB_EXECUTED, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.executors.base import BaseExecutor
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler

from nightshift.app.daemon import clock
from nightshift.app.daemon.control import ControlServer
from nightshift.app.daemon.lock import InstanceLock
from nightshift.app.daemon.runs import RunQueue
from nightshift.app.daemon.work import execute
from nightshift.app.models import open_for_generation
from nightshift.app.paths import data_dir
from nightshift.app.review.index import read_index
from nightshift.app.review.schedule import Schedule, load_schedules
from nightshift.engine import Model

log = logging.getLogger("nightshift.serve")
WATCHDOG_S = 20
JUMP_S = 30  # wall time running ahead of monotonic time by more than this: a suspend or a clock jump


def record_due_run(review: str, due: datetime) -> None:
    """The scheduled job: a schedule fell due, so its run joins the queue (once per due time).

    `due` is stored as None with the job; QueueExecutor passes the fire time.
    """
    run_id = RunQueue().enqueue(review, due=due, origin="schedule")
    log.info(
        "%s fell due at %s: %s", review, due.isoformat(), f"queued as run {run_id}" if run_id else "already queued"
    )


class QueueExecutor(BaseExecutor):
    """Runs a due job at once in the scheduler's thread (it only queues a run), honouring its grace time."""

    def _do_submit_job(self, job, run_times: list[datetime]) -> None:
        events = []
        for run_time in run_times:
            late = clock.now() - run_time
            if job.misfire_grace_time is not None and late > timedelta(seconds=job.misfire_grace_time):
                log.warning("%s: the run due at %s was missed by %s, beyond its grace; skipped", job.id, run_time, late)
                events.append(JobExecutionEvent(EVENT_JOB_MISSED, job.id, job._jobstore_alias, run_time))
                continue
            try:
                job.func(*job.args, **{**job.kwargs, "due": run_time})
            except Exception as exc:  # any failure: APScheduler logs it with its traceback
                self._run_job_error(job.id, exc, exc.__traceback__)
                return
            events.append(JobExecutionEvent(EVENT_JOB_EXECUTED, job.id, job._jobstore_alias, run_time))
        self._run_job_success(job.id, events)


class ReviewScheduler(BackgroundScheduler):
    """A BackgroundScheduler that counts its passes over the job store, so callers can wait for one."""

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.passes = 0
        self.passed = threading.Condition()

    def _process_jobs(self):
        wait = super()._process_jobs()
        with self.passed:
            self.passes += 1
            self.passed.notify_all()
        return wait

    def check_now(self, timeout: float = 10.0) -> None:
        """Look for due jobs now and return once that pass is over."""
        with self.passed:
            target = self.passes + 1
            self.wakeup()
            self.passed.wait_for(lambda: self.passes >= target, timeout)


class Service:
    """The scheduler, the worker thread, the watchdog and the control socket of one data dir."""

    watchdog_s: float = WATCHDOG_S

    def __init__(self, schedules: dict[str, Schedule] | None = None, work: bool = True):
        self.home = data_dir()
        self.lock = InstanceLock()
        self.schedules = schedules
        self.from_files = schedules is None  # read from the schedule folders, and read again by `reload`
        self.work = work
        self.queue: RunQueue | None = None
        self.stopping = threading.Event()
        self.wake_worker = threading.Event()
        self.running: tuple[int, threading.Event] | None = None  # the run being worked on and its cancel event
        self.threads: list[threading.Thread] = []
        self.models: dict[Path, Model] = {}
        self.scheduler: ReviewScheduler | None = None
        self.control: ControlServer | None = None

    def start(self) -> None:
        self.lock.acquire()
        self.queue = RunQueue()
        for run_id in self.queue.recover():
            log.warning("a run was interrupted when the service stopped; queued again as run %s", run_id)
        if self.from_files:
            self._read_schedules()
        self.scheduler = ReviewScheduler(
            jobstores={"default": SQLAlchemyJobStore(url=f"sqlite:///{self.home / 'scheduler.sqlite'}")},
            executors={"default": QueueExecutor()},
            job_defaults={"coalesce": True, "max_instances": 1},
            timezone="UTC",
        )
        self.scheduler.start(paused=True)
        self._sync_jobs()
        self.scheduler.resume()
        self.control = ControlServer(self.handle)
        self.control.start()
        self._thread(self._watchdog, "watchdog")
        if self.work:
            self._thread(self._worker, "worker")
        log.info("serving %d schedule(s) from %s", len(self.schedules), self.home)

    def _thread(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _read_schedules(self) -> None:
        self.schedules, errors = load_schedules()
        for error in errors:
            log.error("schedule not loaded: %s", error)

    def reload(self) -> None:
        """Read the schedule files again (SIGHUP, or a run of a review this service has not seen yet)."""
        if self.from_files:
            self._read_schedules()
            self._sync_jobs()

    def _sync_jobs(self) -> None:
        """One job per schedule. An unchanged job is kept as stored, so a run missed while off is still due."""
        stored = {job.id: job for job in self.scheduler.get_jobs()}
        for name, schedule in self.schedules.items():
            job = stored.pop(name, None)
            if (
                job is not None
                and repr(job.trigger) == repr(schedule.trigger)
                and job.misfire_grace_time == schedule.grace_seconds
            ):
                continue
            self.scheduler.add_job(
                record_due_run, schedule.trigger, args=[name], kwargs={"due": None}, id=name, name=schedule.title,
                misfire_grace_time=schedule.grace_seconds, replace_existing=True,
            )  # fmt: skip
            log.info("%s: %s (%s); next run %s", name, schedule.when, schedule.timezone, self.next_runs().get(name))
        for name in stored:
            self.scheduler.remove_job(name)
            log.info("%s: no schedule file any more; job removed", name)

    def next_runs(self) -> dict[str, str | None]:
        return {
            job.id: job.next_run_time.isoformat() if job.next_run_time else None for job in self.scheduler.get_jobs()
        }

    def _watchdog(self) -> None:
        wall, steady = time.time(), time.monotonic()
        while not self.stopping.wait(self.watchdog_s):
            jump = (time.time() - wall) - (time.monotonic() - steady)
            if abs(jump) > JUMP_S:
                log.warning(
                    "the clock moved %+.0f s more than the time slept (suspend or clock change); rechecking", jump
                )
            wall, steady = time.time(), time.monotonic()
            self.scheduler.wakeup()
            self.wake_worker.set()

    def _worker(self) -> None:
        while not self.stopping.is_set():
            run = self.queue.claim_next(os.getpid())
            if run is None:
                self.wake_worker.wait(2.0)
                self.wake_worker.clear()
                continue
            log.info("run %s: %s started", run.id, run.review)
            self.running = (run.id, threading.Event())
            if self.stopping.is_set():
                self.running[1].set()
            finished = execute(self.queue, run, self.running[1], log.info, self._model)
            self.running = None
            log.info("run %s: %s %s %s", run.id, run.review, finished.state, finished.report or finished.error or "")

    def _model(self, path: Path) -> Model:
        """One engine: the model stays loaded between runs that use it."""
        if path not in self.models:
            for previous in self.models.values():
                previous.close()  # a streamed store's reader threads
            self.models.clear()
            self.models[path] = open_for_generation(path)
        return self.models[path]

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """A control-socket request: jobs, run, run_status, cancel, pause, resume, reports, ping."""
        command = request.get("command")
        if command == "ping":
            return {"ok": True, "pid": os.getpid()}
        if command == "jobs":
            return {"ok": True, "runs": [run.to_dict() for run in self.queue.recent(int(request.get("limit", 30)))],
                    "next_runs": self.next_runs()}  # fmt: skip
        if command == "run":
            review = str(request.get("review"))
            if review not in self.schedules:
                self.reload()
            if review not in self.schedules:
                return {"ok": False, "error": f"no review named {review!r} in this service"}
            as_of = date.fromisoformat(request["as_of"]) if request.get("as_of") else None
            run_id = self.queue.enqueue(review, as_of, origin="manual")
            self.wake_worker.set()
            return {"ok": True, "id": run_id}
        if command == "run_status":
            run = self.queue.get(int(request.get("id", 0)))
            return {"ok": run is not None, "run": run.to_dict() if run else None, "error": "no such run"}
        if command == "reports":
            return {"ok": True, "reports": [entry.to_dict() for entry in read_index()]}
        if command == "cancel":
            running = self.running
            if running is None or running[0] != int(request.get("id", 0)):
                return {"ok": False, "error": f"run {request.get('id')} is not running"}
            running[1].set()
            return {"ok": True}
        if command in ("pause", "resume"):
            review = str(request.get("review"))
            if review not in self.schedules:
                return {"ok": False, "error": f"no review named {review!r} in this service"}
            (self.scheduler.pause_job if command == "pause" else self.scheduler.resume_job)(review)
            return {"ok": True, "next_runs": self.next_runs()}
        return {"ok": False, "error": f"unknown command {command!r}"}

    def stop(self) -> None:
        self.stopping.set()
        if (running := self.running) is not None:
            running[1].set()
        self.wake_worker.set()
        if self.control is not None:
            self.control.stop()
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        for thread in self.threads:
            thread.join(timeout=30)
        self.lock.release()
