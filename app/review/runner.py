"""Run one review end to end: sources -> checks -> prompt -> model -> PDF -> report index.

Used by `nightshift review run` in the foreground and by the scheduler
service's worker; both pass a `progress` callback to show live figures.
"""

from __future__ import annotations

import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from nightshift.app.models import open_for_generation
from nightshift.app.review.charts import bar_chart
from nightshift.app.review.checks import REQUIRED, SEVERITIES, CheckContext, CheckResult, Step, run_checks
from nightshift.app.review.errors import ReviewError, ReviewInterrupted
from nightshift.app.review.index import IndexEntry, add_to_index
from nightshift.app.review.narrative import (
    FACTS,
    FACTS_DIR,
    PROMPTS_DIR,
    Narrative,
    Progress,
    Prompt,
    SharedBatch,
    build_prompt,
    by_severity,
    shown_narrative,
    write_narrative,
)
from nightshift.app.review.report import REPORTS_DIR, render_html, write_pdf
from nightshift.app.review.schedule import Schedule
from nightshift.app.review.sources import Cancel, Table
from nightshift.app.review.window import Window, window_containing
from nightshift.engine.generation import ChatBatch, GenerationStats, LanguageModel
from nightshift.engine.store.gguf_import import sha256_of

Say = Callable[[str], None]


def last_due(schedule: Schedule, now: datetime, within: timedelta = timedelta(days=400)) -> datetime | None:
    """The schedule's most recent fire time at or before `now` (and no earlier than `within` before it)."""
    fire, last = None, None
    start = now - within
    while True:
        fire = schedule.trigger.get_next_fire_time(fire, fire or start)
        if fire is None or fire > now:
            return last
        last = fire


def as_of_for(schedule: Schedule, now: datetime, explicit: date | None = None, use_now: bool = False) -> date:
    """The date whose period a run reviews: explicit, else the pinned one, else now or the last due run."""
    if explicit is not None:
        return explicit
    if schedule.as_of is not None:
        return schedule.as_of
    local = now.astimezone(schedule.timezone)
    due = None if use_now else last_due(schedule, local)
    return (due or local).date()


@dataclass
class Checked:
    """A review's deterministic half: the period, the rows read and what the checks found."""

    window: Window
    previous: Window
    tables: dict[str, Table]
    result: CheckResult


def run_checks_for(schedule: Schedule, as_of: date, step: Step | None = None, cancel: Cancel | None = None) -> Checked:
    """Load every source and run every check; `step`, if given, is told each one's name and seconds as it ends.

    `cancel` is polled while sources load (a SQLite query too) and after each check (a check is one
    vectorised pass, seconds even at 10^7 rows): once it returns True the run stops there.
    """
    window = window_containing(schedule.period, as_of)
    previous = window.previous()
    tables = {}
    for name, source in schedule.sources.items():
        started = time.perf_counter()
        tables[name] = source.load(previous.start, window.end, cancel)
        if step is not None:
            step(f"load {name}", time.perf_counter() - started)
    _one_currency_per_check(schedule.checks, tables)

    def checked(name: str, seconds: float) -> None:
        if step is not None:
            step(name, seconds)
        if cancel is not None and cancel():
            raise ReviewInterrupted(f"{schedule.name}: stopped after {name} (the run was cancelled)")

    result = run_checks(schedule.checks, CheckContext(tables, window, previous, schedule.materiality), checked)
    return Checked(window, previous, tables, result)


def _one_currency_per_check(checks: list[dict[str, Any]], tables: dict[str, Table]) -> None:
    """Refuse a check over tables in two currencies: a file may state its own (a camt.053's Ccy), undeclared."""
    for number, config in enumerate(checks, start=1):
        named = [config[key] for key in (*REQUIRED[config["type"]], "compare") if key in config]
        known = {name: tables[name].currency for name in named if tables[name].currency}
        if len(set(known.values())) > 1:
            shown = ", ".join(f"{name} in {currency}" for name, currency in known.items())
            raise ReviewError(f"check {number} ({config['type']}) compares {shown}: amounts in two currencies are "
                              "never compared; point it at sources of one currency")  # fmt: skip


@dataclass(frozen=True)
class SourceFile:
    """A data file a review read: the digest and count of the bytes and rows read, rows inside the period, notes."""

    source: str
    path: str
    sha256: str
    rows: int
    rows_in_period: int
    notes: tuple[str, ...] = ()  # how it was read where the schedule did not say (a detected encoding)


@dataclass(frozen=True)
class TemplateFile:
    name: str
    sha256: str  # the first 12 hex digits


@dataclass(frozen=True)
class Provenance:
    """Where a report's figures came from: the model and its settings, the generation's figures, every file read.

    The report prints it, so a reader can tell which data, templates and model produced the text.
    """

    model: str
    max_tokens: int  # per answer: the one answer (single) or each part's (split)
    temp: float
    seed: int
    stats: GenerationStats
    files: list[SourceFile]
    templates: list[TemplateFile]
    schedule: str
    schedule_sha256: str
    host: str
    batch: ChatBatch | None = None  # split: the batch (its width, each part's tokens and tok/s)
    shared: SharedBatch | None = None  # generated with other runs' reviews: which, and the rates


@dataclass(frozen=True)
class Headline:
    """The report's first table: findings by severity, the amount they flag, and rows per source in the period."""

    findings: int
    by_severity: dict[str, int]
    flagged_amount: Decimal  # summed exactly, as the findings' amounts are
    rows: dict[str, int]


def _file_digest(path: Path) -> str:
    return sha256_of(path)[:12]


def source_files(checked: Checked) -> list[SourceFile]:
    """Each source's file as it was read (its hash taken while reading: a file changed since keeps the old one)."""
    window = checked.window
    return [
        SourceFile(name, str(table.origin), table.sha256, table.rows_read,
                   len(table.between(window.start, window.end)), table.notes)
        for name, table in checked.tables.items()
    ]  # fmt: skip


def _provenance(schedule: Schedule, checked: Checked, model: Path | str, narrative: Narrative) -> Provenance:
    settings = schedule.generation
    files = source_files(checked)
    templates = [
        TemplateFile(f"prompts/{schedule.prompt_template}", _file_digest(PROMPTS_DIR / schedule.prompt_template)),
        TemplateFile(f"prompts/{FACTS}", _file_digest(FACTS_DIR / FACTS)),
        TemplateFile(f"reports/{schedule.report_template}", _file_digest(REPORTS_DIR / schedule.report_template)),
        TemplateFile("reports/report.css", _file_digest(REPORTS_DIR / "report.css")),
    ]  # fmt: skip
    return Provenance(str(model), settings.answer_tokens, settings.temp, settings.seed, narrative.stats, files,
                      templates, str(schedule.file), _file_digest(schedule.file), platform.node(),
                      narrative.batch, narrative.shared)  # fmt: skip


def _headline(checked: Checked) -> Headline:
    findings = checked.result.findings
    return Headline(
        findings=checked.result.total_findings,
        by_severity=by_severity(findings),
        flagged_amount=sum((abs(f.amount) for f in findings if f.amount is not None and f.check == "match"), Decimal(0)),
        rows={name: len(table.between(checked.window.start, checked.window.end)) for name, table in checked.tables.items()},
    )  # fmt: skip


def build_report_context(schedule: Schedule, checked: Checked, prompt: Prompt | None, narrative: Narrative,
                         provenance: Provenance, created: datetime) -> dict[str, Any]:  # fmt: skip
    """Everything the report template shows; the model's sentences pass the gate here and get their figures
    placed (`prompt` None: the narrative was skipped, and the report's is the template's own)."""
    headline = _headline(checked)
    result = checked.result
    shown = shown_narrative(narrative, prompt, result.findings, checked.window.label, checked.previous.label,
                            schedule.generation.grounding)  # fmt: skip
    charts = [
        bar_chart(table.chart, checked.window.label, checked.previous.label if any(b for _, _, b in table.chart) else None)
        if table.chart else None
        for table in checked.result.tables
    ]  # fmt: skip
    return {
        "schedule": schedule, "window": checked.window, "previous": checked.previous,
        "findings": checked.result.findings, "tables": list(zip(checked.result.tables, charts)),
        "narrative": shown, "headline": headline, "runs": result.runs,
        "provenance": provenance, "created": created, "severities": SEVERITIES,
    }  # fmt: skip


@dataclass
class Prepared:
    """A review up to its prompt: what the model is asked, and what its report needs besides the text."""

    schedule: Schedule
    as_of: date
    checked: Checked
    prompt: Prompt
    started: float  # time.monotonic() when the review began (its report says how long it took)


def prepare_review(schedule: Schedule, as_of: date, cancel: threading.Event | None = None,
                   say: Say = lambda message: None) -> Prepared:  # fmt: skip
    """The checks and the prompt of `schedule` for the period containing `as_of`."""
    started = time.monotonic()
    checked = run_checks_for(schedule, as_of, cancel=None if cancel is None else cancel.is_set)
    say(f"{schedule.name}: {checked.window.label}: {len(checked.result.findings)} finding(s); writing the narrative")
    settings = schedule.generation
    prompt = build_prompt(schedule.prompt_template, schedule.title, checked.window.label, checked.result,
                          settings.prompt_findings, settings.narrative, settings.batch_width,
                          settings.repetition_penalty)  # fmt: skip
    return Prepared(schedule, as_of, checked, prompt, started)


def open_model(
    schedule: Schedule, model_dir: Path, load_model: Callable[..., LanguageModel] = open_for_generation
) -> LanguageModel:
    """The review's model; a budget other than auto is the schedule's own, and the loader opens it with it."""
    budget = schedule.generation.memory_budget
    return load_model(model_dir) if budget == "auto" else load_model(model_dir, memory_budget=budget)


def report_review(prepared: Prepared, narrative: Narrative, model: Path, cancel: threading.Event | None = None,
                  say: Say = lambda message: None, run_id: int | None = None) -> IndexEntry:  # fmt: skip
    """The PDF and its index entry once the narrative is written; a run cancelled meanwhile ends here, unwritten."""
    schedule = prepared.schedule
    if cancel is not None and cancel.is_set():
        # The engine notices a cancel between tokens, so one asked for while the prompt was read ends at the first.
        when = "reading the prompt" if narrative.stats.generated_tokens <= 1 else "writing"
        raise ReviewInterrupted(f"{schedule.name}: stopped while the model was {when}; no report was written")
    say(f"{schedule.name}: {narrative.stats.generated_tokens} tokens written; laying out the report")
    return write_report(schedule, prepared.as_of, prepared.checked, prepared.prompt, narrative, model,
                        prepared.started, run_id)  # fmt: skip


def run_review(
    schedule: Schedule, as_of: date, model_dir: Path, progress: Progress | None = None,
    cancel: threading.Event | None = None, say: Say = lambda message: None,
    load_model: Callable[..., LanguageModel] = open_for_generation, run_id: int | None = None,
) -> IndexEntry:  # fmt: skip
    """Run `schedule` for the period containing `as_of`; returns the report's index entry (with `path`)."""
    prepared = prepare_review(schedule, as_of, cancel, say)
    model = open_model(schedule, model_dir, load_model)
    settings = schedule.generation
    narrative = write_narrative(model, prepared.prompt, settings.answer_tokens, settings.temp, settings.seed,
                                progress, cancel)  # fmt: skip
    return report_review(prepared, narrative, model.path, cancel, say, run_id)


def write_report(schedule: Schedule, as_of: date, checked: Checked, prompt: Prompt | None, narrative: Narrative,
                 model: Path | str, started: float, run_id: int | None = None) -> IndexEntry:  # fmt: skip
    """The PDF and its index entry, from the checks and the narrative (the checks benchmark calls it with none)."""
    created = datetime.now(UTC).astimezone(schedule.timezone)
    provenance = _provenance(schedule, checked, model, narrative)
    context = build_report_context(schedule, checked, prompt, narrative, provenance, created)
    target = schedule.output / f"{schedule.name}-{checked.window.start:%Y-%m-%d}-{created:%Y%m%dT%H%M%S}.pdf"
    write_pdf(render_html(schedule.report_template, context), target)
    summary: Headline = context["headline"]
    return add_to_index(IndexEntry(
        state="done", run=run_id, as_of=as_of.isoformat(), review=schedule.name, title=schedule.title,
        period=checked.window.label, start=checked.window.start.isoformat(), end=checked.window.end.isoformat(),
        created=created.isoformat(timespec="seconds"), path=str(target),
        findings=summary.findings, by_severity=summary.by_severity,
        replaced_sentences=len(context["narrative"].gated.refused), seconds=round(time.monotonic() - started, 1),
    ))  # fmt: skip
