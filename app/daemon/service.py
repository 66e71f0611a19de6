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
from collections.abc import Callable
from dataclasses import replace
from datetime import date, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from apscheduler.events import EVENT_JOB_EXECUTED, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.executors.base import BaseExecutor
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.exc import SQLAlchemyError

from nightshift.app.daemon import clock
from nightshift.app.daemon.control import ControlServer
from nightshift.app.daemon.lock import InstanceLock
from nightshift.app.daemon.notify import announce
from nightshift.app.daemon.rebuild import missed_due_runs, rebuild_queue, set_aside_if_damaged
from nightshift.app.daemon.runs import QueueError, Run, RunQueue
from nightshift.app.daemon.settings import load_settings
from nightshift.app.daemon.work import Cancel, Outcome, Unsettled, batch_key, execute_batch
from nightshift.app.models import open_for_review
from nightshift.app.paths import data_dir, private_folder
from nightshift.app.review.index import clip, read_index
from nightshift.app.review.schedule import Schedule, find_schedule, load_schedules
from nightshift.engine.errors import NightshiftError
from nightshift.engine.generation import LanguageModel
from nightshift.engine.instruments.database import create_database_file

if TYPE_CHECKING:
    from nightshift.engine.distributed.model import Cluster

log = logging.getLogger("nightshift.serve")
WATCHDOG_S = 20
JUMP_S = 30  # wall time running ahead of monotonic time by more than this: a suspend or a clock jump
IDLE_S = 2.0  # the worker looks at the queue at least this often
BACKOFF_S = (1.0, 60.0)  # the worker's wait after a failure of its own, doubling up to the second figure
STOP_WAIT_S = 30  # how long `stop` waits for the worker to end a run it was asked to stop
BATCH_POLL_S = 0.5  # while runs due within the batch window are awaited, the queue is looked at this often
RETRY_S = 5.0  # a due run the queue could not take, or a scheduler store that could not be written: tried again


def record_due_run(review: str, due: datetime) -> None:
    """The scheduled job: a schedule fell due, so its run joins the queue (once per due time).

    `due` is stored as None with the job; QueueExecutor passes the fire time.
    """
    run_id = RunQueue().enqueue(review, due=due, origin="schedule")
    log.info(
        "%s fell due at %s: %s", review, due.isoformat(), f"queued as run {run_id}" if run_id else "already queued"
    )


class QueueExecutor(BaseExecutor):
    """Runs a due job at once in the scheduler's thread (it only queues a run), honouring its grace time.

    A due run the queue cannot take (disk full, locked) is said in one line and kept in `unrecorded`: the
    scheduler sets its job back to that due time (`ReviewScheduler`), so it fires again until it is queued.
    """

    def __init__(self):
        super().__init__()
        self.unrecorded: dict[str, datetime] = {}  # job id -> the earliest due run of it not queued yet

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
            except QueueError as exc:
                log.error("%s: its run due at %s is not queued yet (tried again shortly): %s", job.id,
                          run_time.isoformat(), exc)  # fmt: skip
                self.unrecorded.setdefault(job.id, run_time)
                continue
            except Exception as exc:  # any other failure: APScheduler logs it with its traceback
                self._run_job_error(job.id, exc, exc.__traceback__)
                return
            events.append(JobExecutionEvent(EVENT_JOB_EXECUTED, job.id, job._jobstore_alias, run_time))
        self._run_job_success(job.id, events)


class ReviewScheduler(BackgroundScheduler):
    """A BackgroundScheduler that counts its passes over the job store, so callers can wait for one.

    A pass that fails (its store cannot be written: disk full) is said in one line and tried again shortly,
    where APScheduler's own thread would end. A job whose due run the queue could not take is set back to
    that due time in the store, so the next pass (or the next start, after a kill) fires it again.
    """

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.passes = 0
        self.passed = threading.Condition()

    def _process_jobs(self):
        try:
            wait = super()._process_jobs()
            if self._keep_unrecorded():
                wait = RETRY_S if wait is None else min(wait, RETRY_S)
        except Exception as exc:
            log.error("the scheduler's store could not be read or written (tried again in %.0f s): %s", RETRY_S,
                      clip(str(exc), 300))  # fmt: skip
            wait = RETRY_S
        with self.passed:
            self.passes += 1
            self.passed.notify_all()
        return wait

    def _keep_unrecorded(self) -> bool:
        """Set each job whose due run was not queued back to that due time (without waking the scheduler: the
        next pass is RETRY_S away); True if there was one."""
        unrecorded = self._lookup_executor("default").unrecorded
        kept = bool(unrecorded)
        for job_id, due in list(unrecorded.items()):
            with self._jobstores_lock:
                store = self._lookup_jobstore("default")
                if (job := store.lookup_job(job_id)) is not None:
                    job._modify(next_run_time=due)
                    store.update_job(job)
            del unrecorded[job_id]
        return kept

    def check_now(self, timeout: float = 10.0) -> None:
        """Look for due jobs now and return once that pass is over."""
        with self.passed:
            target = self.passes + 1
            self.wakeup()
            self.passed.wait_for(lambda: self.passes >= target, timeout)


class Service:
    """The scheduler, the worker thread, the watchdog and the control socket of one data dir.

    The worker never dies silently: a failure of its own (the queue's disk full, read-only or locked, no
    descriptors left) is logged, the run it held is recorded or queued again once the queue can be
    written, and it goes on after a pause. Should its thread end all the same, the watchdog starts a
    new one, says so in the log and counts it (`ping` and `jobs` carry the count and the last error).
    """

    watchdog_s: float = WATCHDOG_S

    def __init__(self, schedules: dict[str, Schedule] | None = None, work: bool = True, cluster: Cluster | None = None):
        self.home = data_dir()
        self.cluster = cluster  # serve --hosts: every model is opened over these hosts (engine/distributed)
        self.lock = InstanceLock()
        self.schedules = schedules
        self.from_files = schedules is None  # read from the schedule folders, and read again by `reload`
        self.work = work
        self.queue: RunQueue | None = None
        self.repairs: list[str] = []  # the data dir's SQLite files found damaged at the start, and what was done
        self.queue_rebuilt = False
        self.stopping = threading.Event()
        self.wake_worker = threading.Event()
        self.running: dict[int, Cancel] = {}  # the runs being worked on (one batch) and their cancel events
        self.settings = load_settings()  # [service] batch_window and batch_width
        self.unsettled: Callable[[], object] | None = None  # what the worker still has to record in the queue
        self.pending: dict[int, Outcome] = {}  # how those runs ended, shown by `jobs` until the queue has it
        self.threads: list[threading.Thread] = []
        self.worker: threading.Thread | None = None
        self.worker_restarts = 0
        self.worker_error: str | None = None  # the last failure the worker met, as said in the log
        self.schedule_errors: list[str] = []  # schedule files that did not load at the last (re)load
        self.models: dict[tuple[Path, str], LanguageModel] = {}  # (model, memory budget) -> the loaded model
        self.scheduler: ReviewScheduler | None = None
        self.control: ControlServer | None = None

    def start(self) -> None:
        self.lock.acquire()
        self.queue = self._checked_queue()
        self._recover()
        if self.from_files:
            self._read_schedules()
        store = private_folder(self.home / "scheduler.sqlite")
        self._repaired(set_aside_if_damaged(store, "the scheduler's store"))
        create_database_file(store)  # 0600 before SQLAlchemy's pool connects
        self.scheduler = ReviewScheduler(
            jobstores={"default": SQLAlchemyJobStore(url=f"sqlite:///{store}")},
            executors={"default": QueueExecutor()},
            job_defaults={"coalesce": True, "max_instances": 1},
            timezone="UTC",
        )
        try:
            self.scheduler.start(paused=True)
            kept = self._sync_jobs()
        except SQLAlchemyError as exc:
            raise NightshiftError(f"the scheduler's store {store} cannot be read or written: {clip(str(exc.orig or exc), 300)}; "
                                  f"check that the data dir {self.home} is yours, writable and has free space, or "
                                  "move the file aside (the schedules are read again from their files)") from None  # fmt: skip
        if self.queue_rebuilt:  # schedules whose jobs were stored before: their latest due run may be lost with it
            for run_id in missed_due_runs(self.queue, {name: self.schedules[name] for name in kept}):
                log.warning("a scheduled run missing from the rebuilt queue is queued again as run %s", run_id)
        self.scheduler.resume()
        self._thread(self._watchdog, "watchdog")
        if self.work:
            self.worker = self._thread(self._worker, "worker")
        # Last: a service that answers `ping` has every thread running (a client, or SIGUSR1's stacks, sees them).
        self.control = ControlServer(self.handle)
        self.control.start()
        log.info("serving %d schedule(s) from %s", len(self.schedules), self.home)

    def _thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        def body() -> None:
            try:
                target()
            except BaseException as exc:  # the thread ends here: said, and the watchdog sees it
                self._trouble(f"{name} thread died: {exc!r}")
                log.critical("the %s thread died", name, exc_info=True)

        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def _checked_queue(self) -> RunQueue:
        """The run queue after SQLite's quick check; a damaged one is kept aside and rebuilt (said in the log,
        and by `ping` and `jobs` for the dashboard)."""
        queue = None
        try:
            queue = RunQueue()
            damage = queue.damage()
        except QueueError as exc:
            if not exc.damaged:
                raise
            damage = str(exc.__cause__)
        if damage is None:
            return queue
        if queue is not None:
            queue.db.close()  # the file is moved aside: no connection of this process may stay on it
        self._repaired(rebuild_queue(data_dir() / "runs.sqlite", clip(damage, 300)))
        self.queue_rebuilt = True
        return RunQueue()

    def _repaired(self, what: str | None) -> None:
        """Say a repair in the log, and keep it for `ping` and `jobs` (the dashboard shows it)."""
        if what is not None:
            log.error("%s", what)
            self.repairs.append(what)

    def _recover(self, lost_by: int | None = None) -> None:
        """Interrupt and queue again the runs whose owner is gone (or lost by this process's dead worker)."""
        for run_id in self.queue.recover(lost_by):
            log.warning("a run's process ended in the middle of it; queued again as run %s", run_id)

    def _look_for_orphans(self) -> None:
        """`_recover`, with a queue that cannot be written said in the log (it is tried again later)."""
        try:
            self._recover()
        except NightshiftError as exc:
            log.error("could not look for runs whose process ended: %s", exc)

    def _read_schedules(self) -> None:
        """Read the schedule files; one that is broken now keeps its last good version, and the error is said."""
        loaded, errors = load_schedules()
        broken = {Path(str(error).split(":", 1)[0]) for error in errors}
        for name, schedule in (self.schedules or {}).items():
            if name not in loaded and schedule.file in broken:
                loaded[name] = schedule
                log.error("%s: its schedule file does not load; its last good version stays scheduled", name)
        self.schedules = loaded
        self.schedule_errors = [clip(str(error), 1000) for error in errors]
        for error in self.schedule_errors:
            log.error("schedule not loaded: %s", error)

    def reload(self) -> None:
        """Read the schedule files again (SIGHUP, or a run of a review this service has not seen yet)."""
        if self.from_files:
            self._read_schedules()
            self._sync_jobs()

    def reload_said(self) -> None:
        """`reload` from SIGHUP's thread: what keeps it from finishing is said in the log, never a thread's
        traceback on the terminal (the schedules as they were stay scheduled)."""
        try:
            self.reload()
        except NightshiftError as exc:
            log.error("reading the schedules again failed: %s", exc)
        except Exception:
            log.exception("reading the schedules again failed")

    def _sync_jobs(self) -> set[str]:
        """One job per schedule. An unchanged job is kept as stored, so a run missed while off is still due.

        Returns the schedules whose jobs were kept and are not paused (their latest due run may be missing).
        """
        stored = {job.id: job for job in self.scheduler.get_jobs()}
        kept = set()
        for name, schedule in self.schedules.items():
            job = stored.pop(name, None)
            if (
                job is not None
                and repr(job.trigger) == repr(schedule.trigger)
                and job.misfire_grace_time == schedule.grace_seconds
            ):
                if job.next_run_time is not None:
                    kept.add(name)
                continue
            self.scheduler.add_job(
                record_due_run, schedule.trigger, args=[name], kwargs={"due": None}, id=name, name=schedule.title,
                misfire_grace_time=schedule.grace_seconds, replace_existing=True,
            )  # fmt: skip
            log.info("%s: %s (%s); next run %s", name, schedule.when, schedule.timezone, self.next_runs().get(name))
        for name in stored:
            self.scheduler.remove_job(name)
            log.info("%s: no schedule file any more; job removed", name)
        return kept

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
            self.check_worker()
            self._look_for_orphans()  # a foreground `review run` that was killed: its run is queued here
            self.wake_worker.set()

    def check_worker(self) -> bool:
        """Start a new worker if the last one died (said in the log, counted); True if one was started."""
        if self.worker is None or self.worker.is_alive() or self.stopping.is_set():
            return False
        self.running = {}
        self.unsettled = partial(self._recover, os.getpid())  # the run the dead worker held, if any
        log.error("the worker thread had died (%s); started a new one (restart %d)", self.worker_error,
                  self.worker_restarts + 1)  # fmt: skip
        self.worker = self._thread(self._worker, "worker")
        self.worker_restarts += 1  # counted last: whoever sees the count also sees the log line
        return True

    def _worker(self) -> None:
        pause = BACKOFF_S[0]
        while not self.stopping.is_set():
            try:
                if self.unsettled is not None:
                    self.unsettled()
                    self.unsettled, self.pending = None, {}
                    log.info("the queue can be written again; what the worker held is recorded")
                if not self._work_one():
                    self.wake_worker.wait(IDLE_S)
                    self.wake_worker.clear()
                pause = BACKOFF_S[0]
                continue
            except Unsettled as exc:
                self.unsettled, self.pending = exc.settle, exc.pending
                self._trouble(str(exc))
            except Exception as exc:  # the queue unwritable, the disk full, no descriptors: said, tried again
                self.unsettled = self.unsettled or partial(self._recover, os.getpid())
                self._trouble(repr(exc))
            self.running = {}
            log.error("the worker failed (trying again in %.0f s): %s", pause, self.worker_error)
            self.stopping.wait(pause)
            pause = min(pause * 2, BACKOFF_S[1])

    def _trouble(self, what: str) -> None:
        """Keep the worker's latest failure, with its time (`jobs` shows it after the cause has cleared too)."""
        self.worker_error = f"{clock.now():%Y-%m-%d %H:%M:%S %Z}: {clip(what, 1000)}"

    def _work_one(self) -> bool:
        """Claim the next queued run and those to batch with it, and carry them out; False when none waits."""
        run = self.queue.claim_next(os.getpid())
        if run is None:
            return False
        runs = [run, *self._batch_with(run)]
        self.running = {run.id: Cancel() for run in runs}
        if self.stopping.is_set():
            for cancel in self.running.values():
                cancel.stop(again=True)
        together = f" in a batch of {len(runs)} runs" if len(runs) > 1 else ""
        for run in runs:
            log.info("run %s: %s started%s", run.id, run.review, together)
        finished = execute_batch(self.queue, runs, list(self.running.values()), log.info, self._model)
        self.running = {}
        for run in finished:
            log.info("run %s: %s %s %s", run.id, run.review, run.state,
                     clip(run.report or run.error or "", 500))  # fmt: skip
            announce(self.settings.notify, run)  # a report ready or a run failed: the desktop, the user's hook
        return True

    def _batch_with(self, first: Run) -> list[Run]:
        """Runs to generate with `first`: queued ones that can share its batch, and those falling due within the
        batch window, up to the batch width (in runs). A run that cannot share it stays queued for the next.

        The worker waits only while a schedule that could join is due within the window, so a run alone starts
        at once. Later runs that can join are taken before earlier ones that cannot.
        """
        key = self._key(first.review)
        width, window = self.settings.batch_width, self.settings.batch_window
        taken: list[Run] = []
        if key is None or width < 2:
            return taken
        deadline = time.monotonic() + window
        while not self.stopping.is_set():
            for run in self.queue.queued():
                if len(taken) + 1 >= width:
                    return taken
                if self._key(run.review) == key and (claimed := self.queue.claim(run.id, os.getpid())):
                    taken.append(claimed)
            left = deadline - time.monotonic()
            if left <= 0 or not self._due_within(key, left):
                return taken
            self.stopping.wait(min(left, BATCH_POLL_S))
        return taken

    @staticmethod
    def _key(review: str, schedule: Schedule | None = None) -> tuple | None:
        """`batch_key` of a review's schedule (read from its file unless given); None when it cannot be read or
        its model found (its run fails on its own turn, alone)."""
        try:
            return batch_key(schedule or find_schedule(review))
        except NightshiftError:
            return None

    def _due_within(self, key: tuple, seconds: float) -> bool:
        """Whether a schedule whose runs could join a batch of `key` falls due within `seconds` from now."""
        until = clock.now() + timedelta(seconds=seconds)
        return any(
            job.next_run_time is not None
            and job.next_run_time <= until
            and self._key(job.id, self.schedules.get(job.id)) == key
            for job in self.scheduler.get_jobs()
        )

    def health(self) -> dict[str, Any]:
        """What `ping` and `jobs` say of the worker, for `nightshift jobs` and the dashboard."""
        return {"worker_restarts": self.worker_restarts, "worker_error": self.worker_error,
                "schedule_errors": self.schedule_errors, "repairs": self.repairs,
                "hosts": self.cluster.describe() if self.cluster is not None else []}  # fmt: skip

    def _model(self, path: Path, memory_budget: str = "auto") -> LanguageModel:
        """One engine: the model stays loaded between runs that use it (with the same memory budget)."""
        if (path, memory_budget) not in self.models:
            for previous in self.models.values():
                previous.close()  # a streamed store's reader threads
            self.models.clear()
            self.models[(path, memory_budget)] = open_for_review(path, memory_budget, self.cluster)
        return self.models[(path, memory_budget)]

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """A control-socket request: jobs, run, run_status, cancel, pause, resume, reports, ping."""
        command = request.get("command")
        if command == "ping":
            return {"ok": True, "pid": os.getpid(), **self.health()}
        if command == "jobs":
            self._look_for_orphans()  # what the reply says of running runs is true: their processes are alive
            runs = [self._shown(run) for run in self.queue.recent(int(request.get("limit", 30)))]
            running = {run.id for run in runs if run.state == "running"}  # a batch's cancelled run leaves it at once
            cancelling = next(
                (i for i, cancel in self.running.copy().items() if cancel.is_set() and i in running), None
            )
            return {"ok": True, "runs": [run.to_dict() for run in runs], "next_runs": self.next_runs(),
                    "cancelling": cancelling,
                    **self.health()}  # fmt: skip
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
            run = self._shown(run) if run is not None else None
            return {"ok": run is not None, "run": run.to_dict() if run else None, "error": "no such run"}
        if command == "reports":
            return {"ok": True, "reports": [entry.to_dict() for entry in read_index()]}
        if command == "cancel":
            cancel = self.running.get(int(request.get("id", 0)))
            if cancel is None:
                return {"ok": False, "error": f"run {request.get('id')} is not running"}
            cancel.set()
            return {"ok": True}
        if command in ("pause", "resume"):
            review = str(request.get("review"))
            if review not in self.schedules:
                return {"ok": False, "error": f"no review named {review!r} in this service"}
            (self.scheduler.pause_job if command == "pause" else self.scheduler.resume_job)(review)
            return {"ok": True, "next_runs": self.next_runs()}
        return {"ok": False, "error": f"unknown command {command!r}"}

    def _shown(self, run: Run) -> Run:
        """`run` as `jobs` shows it: one the worker has ended but could not record yet (the queue's disk full) shows
        how it ended, not `running`."""
        outcome = self.pending.get(run.id)
        if outcome is None or run.state != "running":
            return run
        unrecorded = "not in the run queue yet: it cannot be written; recorded once it can"
        if outcome.state == "done":
            return replace(run, state="done", report=outcome.detail, error=unrecorded, progress=None)
        return replace(run, state=outcome.state, error=f"{outcome.detail} ({unrecorded})", progress=None)

    def stop(self) -> None:
        self.stopping.set()
        for cancel in self.running.copy().values():
            cancel.stop(again=True)  # interrupted and queued again (one still reading its prompt when the
            # wait below ends is left `running`; its process gone, the next start queues it again)
        self.wake_worker.set()
        if self.control is not None:
            self.control.stop()
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        deadline = time.monotonic() + STOP_WAIT_S  # one wait for all of them, not one per thread
        for thread in self.threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.worker is None or not self.worker.is_alive():
            for model in self.models.values():
                model.close()  # a streamed store's reader threads, before the interpreter exits under them
        self.lock.release()
