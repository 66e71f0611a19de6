"""Carrying out queued runs: shared by the service's worker (a batch of runs due together) and by
`nightshift review run` without a service (one run)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, date
from functools import partial
from pathlib import Path
from typing import Any

from nightshift.app.daemon import clock
from nightshift.app.daemon.lock import engine_lock
from nightshift.app.daemon.runs import QueueError, Run, RunProgress, RunQueue
from nightshift.app.models import open_for_generation, resolve_model
from nightshift.app.review.errors import ReviewInterrupted
from nightshift.app.review.index import add_failure, clip
from nightshift.app.review.narrative import Narrative, NarrativeJob, check_fits, write_narrative, write_narratives
from nightshift.app.review.report import remove_partial_reports
from nightshift.app.review.runner import Prepared, as_of_for, open_model, prepare_review, report_review
from nightshift.app.review.schedule import Schedule, find_schedule
from nightshift.app.review.window import window_containing
from nightshift.engine.errors import NightshiftError
from nightshift.engine.generation import GenerationStats, LanguageModel

Shared = dict[str, Any]  # a batched run's RunProgress fields: batch, batch_sequences, batch_tokens_per_s
log = logging.getLogger("nightshift.work")
PROGRESS_EVERY_S = 1.0
TEXT_KEPT = 4000  # characters of the text being written kept with the progress (the dashboard shows it)


def run_progress(stats: GenerationStats, max_tokens: int, text: str, shared: Shared | None = None) -> RunProgress:
    """The figures of a generation so far as the queue keeps them: rounded, with the end of the text.

    A batch's `max_tokens` is its answers' limits summed (its real plan), not the schedule's bound.
    """
    streamed = bool(stats.drive_bytes)  # a streamed store's figures; a model held in memory has none
    cached = streamed and stats.cache_budget > 0
    return RunProgress(
        prompt_tokens=stats.prompt_tokens, prompt_done=stats.prompt_done, generated_tokens=stats.generated_tokens,
        time_to_first_token=round(stats.time_to_first_token, 2), elapsed=round(stats.elapsed, 2),
        decode_tokens_per_s=round(stats.decode_tokens_per_s, 2),
        max_tokens=sum(a.max_tokens for a in stats.answers) or max_tokens, text=text[-TEXT_KEPT:],
        drive_bytes=dict(stats.drive_bytes),
        cache_hits=stats.cache_hits if streamed else None,
        prefetch_recall=round(stats.prefetch_recall, 3) if streamed else None,
        read_amplification=round(stats.prefill_read_amplification, 3) if streamed else None,
        last_landed=(stats.last_landed or None) if streamed else None, finish_reason=stats.finish_reason,
        answers=[replace(answer) for answer in stats.answers],
        cache_budget=stats.cache_budget if cached else None, cache_used=stats.cache_used if cached else None,
        cache_hit_rate=round(stats.cache_hit_rate, 4) if cached else None, peak_memory_bytes=stats.peak_memory_bytes,
        **(shared or {}),
    )  # fmt: skip


class Cancel(threading.Event):
    """A run's stop signal. `again`: the service is stopping, so the run is queued again; a user's cancel is not."""

    again = False

    def stop(self, again: bool) -> None:
        self.again = again
        self.set()


@dataclass(frozen=True)
class Outcome:
    """How a run ended: `state` (done, failed or interrupted) and `detail`, its report's path or the reason."""

    state: str
    detail: str | None


class Unsettled(NightshiftError):
    """A run ended but the run queue could not record how (disk full, read-only, locked).

    `settle` records it: the service's worker calls it again until the queue can be written, so the
    outcome (a report written, a failure's reason, an interruption) is neither lost nor done twice.
    `pending`: how each of those runs ended, by id, for `jobs` to show meanwhile.
    """

    def __init__(self, run: Run, settle: Callable[[], object], cause: Exception, pending: dict[int, Outcome]):
        super().__init__(f"run {run.id} ({run.review}) ended but the run queue could not record it: {cause}")
        self.settle = settle
        self.pending = pending


def _progress_writer(
    queue: RunQueue, run_id: int, max_tokens: int, shared: Shared | None = None
) -> Callable[[GenerationStats, str], None]:
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
            queue.set_progress(run_id, run_progress(stats, max_tokens, text, shared))
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


def batch_key(schedule: Schedule) -> tuple | None:
    """Runs whose schedules give the same key can generate as one batch: the same model, opened the same way,
    greedy, with the same tokens per answer. None: this run generates alone (it samples)."""
    settings = schedule.generation
    if settings.temp != 0:
        return None
    return (resolve_model(settings.model), settings.memory_budget, settings.answer_tokens)


@dataclass
class _Member:
    """One run of a batch: what is known of it so far and, once it has ended, how (`outcome` records it)."""

    queue: RunQueue
    run: Run
    cancel: threading.Event | None
    schedule: Schedule | None = None
    as_of: date | None = None
    prepared: Prepared | None = None
    outcome: Callable[[], object] | None = None  # records how it ended in the queue
    told: Outcome | None = None  # how it ended
    recorded: bool = False

    def ended(self, error: BaseException) -> None:
        """The run ends here because of `error`: interrupted (queued again if so asked), or failed."""
        run = self.run
        if isinstance(error, ReviewInterrupted):
            again = isinstance(self.cancel, Cancel) and self.cancel.again
            self.outcome = partial(self.queue.interrupt, run.id, str(error), again)
            self.told = Outcome("interrupted", str(error))
            return
        if isinstance(error, NightshiftError):
            log.info("run %s (%s) failed: %s", run.id, run.review, clip(str(error), 500))
            reason = str(error)
        else:  # a bug: recorded so the queue moves on, with the traceback in the log
            log.error("run %s (%s) failed", run.id, run.review, exc_info=error)
            reason = f"internal error: {error!r}; see the log"
        self.outcome = partial(_failed, self.queue, run, reason, self.schedule, self.as_of)
        self.told = Outcome("failed", clip(reason, 500))

    @contextmanager
    def attempt(self) -> Iterator[None]:
        """A step of this run: whatever it raises ends this run alone."""
        try:
            yield
        except Exception as error:
            self.ended(error)


def execute(
    queue: RunQueue, run: Run, cancel: threading.Event | None = None, say: Callable[[str], None] = log.info,
    load_model: Callable[[Path], LanguageModel] = open_for_generation, show: Callable[[GenerationStats], None] | None = None,
) -> Run:  # fmt: skip
    """Carry out one claimed run (`execute_batch` of one)."""
    return execute_batch(queue, [run], [cancel], say, load_model, show)[0]


def execute_batch(
    queue: RunQueue, runs: list[Run], cancels: list[threading.Event | None], say: Callable[[str], None] = log.info,
    load_model: Callable[[Path], LanguageModel] = open_for_generation, show: Callable[[GenerationStats], None] | None = None,
) -> list[Run]:  # fmt: skip
    """Carry out claimed runs, generating together those with the same `batch_key`; each is still its own run.

    Each run's checks, prompt and report are its own, and each ends on its own: done (with its report),
    failed (with the reason) or interrupted. Done and failed runs get a report index entry; an interrupted
    one does not (see app/review/index.py). An interrupted run is queued again when its cancel is a
    `Cancel` stopped with `again`. A run cancelled while the batch generates leaves it at the next token,
    recorded at once; the others go on. When the queue cannot record an outcome, `Unsettled` carries every
    outcome not yet recorded.
    """
    members = [_Member(queue, run, cancel) for run, cancel in zip(runs, cancels, strict=True)]
    with engine_lock(waiting=lambda: say("waiting for another review to finish generating")):
        for member in members:
            with member.attempt():
                _prepare(member, say)
        groups: dict[object, list[_Member]] = {}
        for member in members:
            if member.outcome is None:
                with member.attempt():
                    key = batch_key(member.schedule)
                    groups.setdefault(key if key is not None else ("alone", member.run.id), []).append(member)
        for group in groups.values():
            _generate(queue, group, say, load_model, show)
    for member in members:
        _settle(member)
    unsettled = [member for member in members if not member.recorded]
    if unsettled:
        settle = partial(_settle_all, unsettled)
        try:
            settle()
        except QueueError as exc:
            raise Unsettled(unsettled[0].run, settle, exc, {m.run.id: m.told for m in unsettled if m.told}) from exc
    return [queue.get(run.id) for run in runs]


def _settle(member: _Member) -> None:
    """Record a run's outcome now if the queue can take it (else `execute_batch` raises `Unsettled` for it)."""
    if member.recorded or member.outcome is None:
        return
    try:
        member.outcome()
        member.recorded = True
    except QueueError:
        pass


def _settle_all(members: list[_Member]) -> None:
    for member in members:
        if not member.recorded:
            member.outcome()
            member.recorded = True


def _prepare(member: _Member, say: Callable[[str], None]) -> None:
    """The run's schedule, period, checks and prompt (a report half-written by a killed process removed)."""
    run = member.run
    member.schedule = find_schedule(run.review)
    member.as_of = run.as_of or as_of_for(member.schedule, run.due or clock.now(), use_now=run.due is not None)
    for leftover in remove_partial_reports(member.schedule.output):  # PDFs are written only under the engine lock
        say(f"removed {leftover}, a report left half-written by a process that was killed")
    member.prepared = prepare_review(member.schedule, member.as_of, member.cancel, say)


def _generate(queue: RunQueue, group: list[_Member], say: Callable[[str], None],
              load_model: Callable[[Path], LanguageModel], show: Callable[[GenerationStats], None] | None) -> None:  # fmt: skip
    """The group's narratives (one batch when several, with their own figures stored) and then each report."""
    first = group[0]
    try:
        model = open_model(first.schedule, resolve_model(first.schedule.generation.model), load_model)
    except Exception as error:
        for member in group:
            member.ended(error)
        return
    from nightshift.engine.cpu_blas import SLOW_BLAS  # known once MLX is loaded, which opening the model did

    if SLOW_BLAS:
        say(SLOW_BLAS)
    settings = first.schedule.generation
    if len(group) == 1:
        with first.attempt():
            record = _watched(_progress_writer(queue, first.run.id, settings.tokens_at_most), show)
            narrative = write_narrative(model, first.prepared.prompt, settings.answer_tokens, settings.temp,
                                        settings.seed, record, first.cancel)  # fmt: skip
            _report(first, narrative, model, say)
        return
    shared: Shared = {"batch": [m.run.id for m in group], "batch_sequences": 0, "batch_tokens_per_s": 0.0}
    bound = sum(member.schedule.generation.tokens_at_most for member in group)
    jobs = []
    for member in group:
        with member.attempt():
            check_fits(model, member.prepared.prompt, settings.answer_tokens)
            jobs.append(NarrativeJob(member.prepared.prompt, settings.answer_tokens, (member.run.id, member.run.review),
                                     _watched(_progress_writer(queue, member.run.id, bound, shared), show),
                                     member.cancel, partial(_left, member)))  # fmt: skip
    shared["batch_sequences"] = sum(len(job.conversations) for job in jobs)
    shared["batch"] = [job.member[0] for job in jobs]
    say(
        f"runs {', '.join(str(job.member[0]) for job in jobs)}: {shared['batch_sequences']} answers generate as one batch"
    )
    together = [member for member in group if member.outcome is None]
    try:
        narratives = write_narratives(model, jobs) if jobs else []
    except Exception as error:
        for member in together:
            member.ended(error)
        return
    for member, narrative in zip(together, narratives, strict=True):
        if narrative is None:
            continue  # it left the batch: recorded already
        with member.attempt():
            _store_own_figures(queue, member, narrative, shared)
            _report(member, narrative, model, say)


def _left(member: _Member) -> None:
    """A run cancelled mid-batch: recorded as interrupted now, while the others go on."""
    member.ended(ReviewInterrupted(f"{member.run.review}: stopped while the model was writing in a batch with "
                                   "other runs (they go on); no report was written"))  # fmt: skip
    _settle(member)


def _store_own_figures(queue: RunQueue, member: _Member, narrative: Narrative, shared: Shared) -> None:
    """The run's own figures once the batch has ended, beside the batch's rate (a store that fails is said)."""
    own = narrative.shared
    figures = run_progress(narrative.stats, member.schedule.generation.tokens_at_most, narrative.text,
                           {**shared, "batch_tokens_per_s": round(own.decode_tokens_per_s, 2)})  # fmt: skip
    figures = replace(figures, decode_tokens_per_s=round(own.own_tokens_per_s, 2))
    try:
        queue.set_progress(member.run.id, figures)
    except QueueError as exc:
        log.warning("run %s: its own figures were not stored: %s", member.run.id, exc)


def _report(member: _Member, narrative: Narrative, model: LanguageModel, say: Callable[[str], None]) -> None:
    entry = report_review(member.prepared, narrative, model.path, member.cancel, say, member.run.id)
    member.outcome = partial(member.queue.finish, member.run.id, "done", report=entry.path)
    member.told = Outcome("done", entry.path)


def _watched(record: Callable[[GenerationStats, str], None],
             show: Callable[[GenerationStats], None] | None) -> Callable[[GenerationStats, str], None]:  # fmt: skip
    """The queue's progress record, and the foreground's display when there is one."""
    if show is None:
        return record

    def progress(stats: GenerationStats, text: str) -> None:
        record(stats, text)
        show(stats)

    return progress
