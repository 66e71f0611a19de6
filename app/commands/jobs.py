"""`nightshift jobs`: what is scheduled, waiting, running and done, from the service or from the data dir."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nightshift.app.daemon.runs import Run, RunProgress
    from nightshift.engine.generation import GenerationStats


def progress_line(figures: GenerationStats | RunProgress) -> str:
    """A generation's progress on one line: the prompt being read, then tokens, rate and time; a batch's
    from its answers (which prompt is read, the tokens it can still reach)."""
    from nightshift.app.batch_progress import batched, reading, tokens_at_most

    if batched(figures):
        answers = figures.answers
        part = reading(answers)
        if not figures.generated_tokens:
            which = f"answer {part[0]} of {len(answers)}, " if part else "all read, "
            return f"reading the prompts: {which}{figures.prompt_done}/{figures.prompt_tokens} tokens"
        return (f"{figures.generated_tokens} of at most {tokens_at_most(answers)} tokens in {len(answers)} answers, "
                f"{figures.decode_tokens_per_s:.1f} tok/s, {figures.elapsed:.0f} s")  # fmt: skip
    if not figures.generated_tokens:
        return f"reading the {figures.prompt_tokens}-token prompt"
    if figures.generated_tokens == 1:
        return f"first token after {figures.elapsed:.0f} s"
    return f"{figures.generated_tokens} tokens, {figures.decode_tokens_per_s:.1f} tok/s, {figures.elapsed:.0f} s"


DETAIL_SHOWN = 300  # characters of a run's error shown on its line


def format_runs(runs: list[Run]) -> list[str]:
    """One line a run. A run still marked running whose process is gone shows as what it is: interrupted."""
    from nightshift.app.daemon.runs import gone_reason
    from nightshift.app.review.index import clip

    lines = []
    for run in runs:
        state, live = run.state, progress_line(run.progress) if run.state == "running" and run.progress else ""
        detail = run.report or run.error or live
        if run.progress and (batch := run.progress.batch_line()) and run.state in ("running", "done"):
            detail = f"{detail} · {batch}"  # which runs generated together, and the rates
        if run.orphaned:
            state, detail = "interrupted", f"{gone_reason(run.pid)}; `nightshift serve` queues it again"
        when = run.due.isoformat() if run.due else run.created
        detail = " ".join((clip(detail, DETAIL_SHOWN) or "").split())
        lines.append(f"{run.id:>4}  {state:<11} {run.review:<14} {run.origin:<8} {when}  {detail}")
    return lines


def cmd_jobs(args: argparse.Namespace) -> int:
    from nightshift.app.daemon.control import jobs, jobs_without_service

    queue = jobs(args.limit)
    if queue is None:
        print("service: not running (start it with `nightshift serve`)")
        queue = jobs_without_service(args.limit)
    else:
        print("service: running")
    for notice in queue.notices():
        print(f"note: {notice}")
    for name, when in sorted(queue.next_runs.items(), key=lambda item: item[1] or ""):
        print(f"   -  scheduled   {name:<14} next     {when}")
    for line in format_runs(queue.runs):
        print(line)
    return 0


LIMIT_MAX = 1_000_000


def _count(text: str) -> int:
    """A --limit: a whole number of runs from 1 to LIMIT_MAX."""
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= LIMIT_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of runs; give 1 to {LIMIT_MAX:,}")
    return count


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Scheduled reviews with their next run, then runs: queued, running (with live tokens/s), "
        "done (with the report), failed (with the reason) or interrupted. Works with or without the service."
    )
    parser.add_argument("--limit", type=_count, default=30, help="how many runs to show (30)")
    parser.set_defaults(run=cmd_jobs)
