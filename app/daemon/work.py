"""Carrying out one queued run: shared by the service's worker and by `nightshift review run` without a service."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, date
from functools import partial
from pathlib import Path

from nightshift.app.daemon import clock
from nightshift.app.daemon.lock import engine_lock
from nightshift.app.daemon.runs import QueueError, Run, RunProgress, RunQueue
from nightshift.app.models import open_for_generation, resolve_model
from nightshift.app.review.errors import ReviewInterrupted
from nightshift.app.review.index import add_failure, clip
from nightshift.app.review.report import remove_partial_reports
from nightshift.app.review.runner import as_of_for, run_review
from nightshift.app.review.schedule import Schedule, find_schedule
from nightshift.app.review.window import window_containing
from nightshift.engine import GenerationStats, Model, NightshiftError

log = logging.getLogger("nightshift.work")
PROGRESS_EVERY_S = 1.0
TEXT_KEPT = 4000  # characters of the text being written kept with the progress (the dashboard shows it)


def run_progress(stats: GenerationStats, max_tokens: int, text: str) -> RunProgress:
    """The figures of a generation so far as the queue keeps them: rounded, with the end of the text."""
    streamed = bool(stats.drive_bytes)  # a streamed store's figures; a model held in memory has none
    return RunProgress(
        prompt_tokens=stats.prompt_tokens, prompt_done=stats.prompt_done, generated_tokens=stats.generated_tokens,
        time_to_first_token=round(stats.time_to_first_token, 2), elapsed=round(stats.elapsed, 2),
        decode_tokens_per_s=round(stats.decode_tokens_per_s, 2), max_tokens=max_tokens, text=text[-TEXT_KEPT:],
        drive_bytes=dict(stats.drive_bytes),
        cache_hits=stats.cache_hits if streamed else None,
        prefetch_recall=round(stats.prefetch_recall, 3) if streamed else None,
        read_amplification=round(stats.prefill_read_amplification, 3) if streamed else None,
        last_landed=(stats.last_landed or None) if streamed else None, finish_reason=stats.finish_reason,
    )  # fmt: skip


class Cancel(threading.Event):
    """A run's stop signal. `again`: the service is stopping, so the run is queued again; a user's cancel is not."""

    again = False

    def stop(self, again: bool) -> None:
        self.again = again
        self.set()


class Unsettled(NightshiftError):
    """A run ended but the run queue could not record how (disk full, read-only, locked).

    `settle` records it: the service's worker calls it again until the queue can be written, so the
    outcome (a report written, a failure's reason, an interruption) is neither lost nor done twice.
    """

    def __init__(self, run: Run, settle: Callable[[], object], cause: Exception):
        super().__init__(f"run {run.id} ({run.review}) ended but the run queue could not record it: {cause}")
        self.settle = settle


def _progress_writer(queue: RunQueue, run_id: int, max_tokens: int) -> Callable[[GenerationStats, str], None]:
    """Store live figures in the queue at most once a second (the dashboard and `jobs` read them).

    Figures that cannot be stored (the queue's disk full or locked) are skipped, said once: the run goes on.
    """
    last = [0.0]
    failing = [False]

    def write(stats: GenerationStats, text: str) -> None:
        now = time.monotonic()
        if now - last[0] < PROGRESS_EVERY_S and stats.generated_tokens and stats.finish_reason is None:
            return
        last[0] = now
        try:
            queue.set_progress(run_id, run_progress(stats, max_tokens, text))
            failing[0] = False
        except QueueError as exc:
            if not failing[0]:
                log.warning("run %s: live figures not stored (the run goes on): %s", run_id, exc)
            failing[0] = True

    return write


def _failed(queue: RunQueue, run: Run, reason: str, schedule: Schedule | None, as_of: date | None) -> None:
    """Record the failure in the queue and the report index (an index that cannot be written is logged)."""
    if not queue.finish(run.id, "failed", error=reason):
        return  # not running any more: already ended by someone else
    try:
        window = window_containing(schedule.period, as_of) if schedule and as_of else None
    except NightshiftError:
        window = None  # the as-of date itself was the problem; the reason says so
    try:
        add_failure(run.review, reason, run.id, schedule.title if schedule else None, as_of, window,
                    schedule.timezone if schedule else UTC)  # fmt: skip
    except (NightshiftError, OSError) as exc:
        log.error("run %s (%s) failed and the report index could not record it: %s", run.id, run.review, exc)


def execute(
    queue: RunQueue, run: Run, cancel: threading.Event | None = None, say: Callable[[str], None] = log.info,
    load_model: Callable[[Path], Model] = open_for_generation, show: Callable[[GenerationStats], None] | None = None,
) -> Run:  # fmt: skip
    """Carry out a claimed run; it ends done (with its report), failed (with the reason) or interrupted.

    Done and failed runs get a report index entry; an interrupted one does not (see app/review/index.py).
    An interrupted run is queued again when `cancel` is a `Cancel` stopped with `again`. When the queue
    cannot record the outcome, `Unsettled` carries it.
    """
    schedule: Schedule | None = None
    as_of: date | None = None
    try:
        schedule = find_schedule(run.review)
        as_of = run.as_of or as_of_for(schedule, run.due or clock.now(), use_now=run.due is not None)
        model_dir = resolve_model(schedule.generation.model)
        with engine_lock(waiting=lambda: say("waiting for another review to finish generating")):
            for leftover in remove_partial_reports(schedule.output):  # PDFs are written only under this lock
                say(f"removed {leftover}, a report left half-written by a process that was killed")
            record = _progress_writer(queue, run.id, schedule.generation.tokens_at_most)

            def progress(stats: GenerationStats, text: str) -> None:
                record(stats, text)
                if show is not None:
                    show(stats)

            entry = run_review(schedule, as_of, model_dir, progress, cancel, say, load_model, run.id)
    except ReviewInterrupted as exc:
        again = isinstance(cancel, Cancel) and cancel.again
        outcome: Callable[[], object] = partial(queue.interrupt, run.id, str(exc), again)
    except NightshiftError as exc:
        say(f"run {run.id} ({run.review}) failed: {clip(str(exc), 500)}")
        outcome = partial(_failed, queue, run, str(exc), schedule, as_of)
    except Exception as exc:  # a bug: recorded so the queue moves on, with the traceback in the log
        log.exception("run %s (%s) failed", run.id, run.review)
        outcome = partial(_failed, queue, run, f"internal error: {exc!r}; see the log", schedule, as_of)
    else:
        outcome = partial(queue.finish, run.id, "done", report=entry.path)
    try:
        outcome()
    except QueueError as exc:
        raise Unsettled(run, outcome, exc) from exc
    return queue.get(run.id)
