"""`nightshift review list|run`: the reviews that are scheduled, and running one now."""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING

from nightshift.app.commands import say
from nightshift.app.commands.jobs import progress_line
from nightshift.app.progress import Heartbeat, live
from nightshift.engine.errors import NightshiftError

if TYPE_CHECKING:
    from nightshift.app.daemon.runs import RunProgress
    from nightshift.engine.generation import GenerationStats

EXIT_INTERRUPTED = 130
POLL_S = 2.0


def cmd_list(args: argparse.Namespace) -> int:
    from nightshift.app.review.schedule import load_schedules

    schedules, errors = load_schedules()
    now = datetime.now(UTC)
    for name, schedule in sorted(schedules.items()):
        fire = schedule.trigger.get_next_fire_time(None, now)
        pinned = f", pinned to {schedule.as_of}" if schedule.as_of else ""
        print(
            f"{name:<12} {schedule.when:<42} {schedule.period}{pinned}; next {fire:%Y-%m-%d %H:%M %Z} "
            f"({schedule.business_days})  {schedule.file}"
        )
    for error in errors:
        say(f"error: {error}")
    if not schedules and not errors:
        say("no schedules found")
    return 0


def _as_of(args: argparse.Namespace, name: str) -> date:
    from nightshift.app.review.runner import as_of_for
    from nightshift.app.review.schedule import find_schedule

    return as_of_for(find_schedule(name), datetime.now(UTC), args.as_of, args.now)


def _run_in_service(args: argparse.Namespace, as_of: date) -> int | None:
    """Queue the run in the running service and follow it; None when no service runs."""
    from nightshift.app.daemon.control import queue_run, run_status

    run_id = queue_run(args.name, as_of)
    if run_id is None:
        return None
    say(f"queued as run {run_id} in the running service")
    if args.no_wait:
        return 0
    # Reading a long prompt can take a minute on a CPU with no new figure: the heartbeat keeps a timer going.
    with live(say) as beat:
        while (run := run_status(run_id)) is not None and run.state not in ("done", "failed", "interrupted"):
            if run.state == "running" and run.progress:
                _note(beat, run.progress)
            time.sleep(POLL_S)
    if run is None:
        raise NightshiftError(f"the service stopped before run {run_id} ended; it stays in the queue and runs when "
                              "`nightshift serve` starts again (`nightshift jobs` shows it)")  # fmt: skip
    return _outcome(run.state, run.report, run.error)


def _note(beat: Heartbeat, figures: GenerationStats | RunProgress) -> None:
    """The run's figures as the heartbeat's status; once tokens come, the line carries its own time."""
    beat.note(progress_line(figures), timed=not figures.generated_tokens)


def _outcome(state: str, report: str | None, error: str | None) -> int:
    if state != "done":
        raise NightshiftError(f"the review {state}: {error}")
    print(report)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from nightshift.app.daemon.runs import RunQueue
    from nightshift.app.daemon.work import Unsettled, execute
    from nightshift.app.paths import writable_data_dir

    as_of = _as_of(args, args.name)
    in_service = _run_in_service(args, as_of)
    if in_service is not None:
        return in_service
    writable_data_dir()  # the run, its report and the index are written there: a data dir that cannot be, said now
    queue = RunQueue()
    run = queue.begin(args.name, as_of, os.getpid())
    say(f"run {run.id}: {args.name} as of {as_of} (no service running: running here)")
    try:
        with live(say) as beat:
            finished = execute(queue, run, say=beat.say, show=lambda figures: _note(beat, figures))
    except Unsettled as exc:  # ended, but the queue could not record it (disk full)
        ended = exc.pending.get(run.id)
        kept = "; the report index has how it ended, and `nightshift serve` records it from there"
        raise NightshiftError(f"{exc}{kept if ended and ended.state != 'interrupted' else ''}") from None
    except KeyboardInterrupt:
        queue.finish(run.id, "interrupted", error="interrupted by the user")
        say("interrupted")
        return EXIT_INTERRUPTED
    return _outcome(finished.state, finished.report, finished.error)


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date; write YYYY-MM-DD") from None


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = "Reviews are schedules (TOML) in schedules/ and in the data dir's schedules/."
    actions = parser.add_subparsers(dest="review_command", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="list reviews and their next run", description="List reviews.")
    listing.set_defaults(run=cmd_list)
    run = actions.add_parser(
        "run", help="run a review now and print the report's path",
        description="Run review NAME now and print the PDF's path. By default it reviews the period of its "
        "latest scheduled run; --now reviews the period containing today, --as-of the one containing DATE "
        "(a schedule that pins `as_of`, like the bundled samples, keeps its period unless --as-of is given). "
        "With the service running, the run joins its queue; otherwise it runs in this process.",
    )  # fmt: skip
    run.add_argument("name", metavar="NAME", help="the review's name (see `nightshift review list`)")
    when = run.add_mutually_exclusive_group()
    when.add_argument("--now", action="store_true", help="review the period containing today")
    when.add_argument("--as-of", type=_date, metavar="DATE", help="review the period containing DATE (YYYY-MM-DD)")
    run.add_argument("--no-wait", action="store_true", help="with the service running, queue and return at once")
    run.set_defaults(run=cmd_run)
