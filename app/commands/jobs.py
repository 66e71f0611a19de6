"""`nightshift jobs`: what is scheduled, waiting, running and done, from the service or from the data dir."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any


def _progress(run: dict[str, Any]) -> str:
    progress = run.get("progress") or {}
    if run["state"] != "running" or not progress:
        return ""
    if not progress["generated_tokens"]:
        return f"reading the {progress['prompt_tokens']}-token prompt"
    return (f"{progress['generated_tokens']} tokens, {progress['decode_tokens_per_s']:.1f} tok/s, "
            f"{progress['elapsed']:.0f} s")  # fmt: skip


def format_runs(runs: list[dict[str, Any]]) -> list[str]:
    lines = []
    for run in runs:
        detail = run.get("report") or run.get("error") or _progress(run)
        when = run.get("due") or run.get("created")
        lines.append(f"{run['id']:>4}  {run['state']:<11} {run['review']:<14} {run['origin']:<8} {when}  {detail}")
    return lines


def scheduled_without_service() -> dict[str, str | None]:
    """Next fire times computed from the schedule files (what the service would do)."""
    from nightshift.app.review.schedule import load_schedules

    now = datetime.now(UTC)
    schedules, _ = load_schedules()
    return {name: (fire.isoformat() if (fire := s.trigger.get_next_fire_time(None, now)) else None)
            for name, s in schedules.items()}  # fmt: skip


def cmd_jobs(args: argparse.Namespace) -> int:
    from nightshift.app.daemon.control import request
    from nightshift.app.daemon.runs import RunQueue

    reply = request("jobs", limit=args.limit)
    if reply is None:
        print("service: not running (start it with `nightshift serve`)")
        runs, next_runs = [run.as_dict() for run in RunQueue().recent(args.limit)], scheduled_without_service()
    else:
        print("service: running")
        runs, next_runs = reply["runs"], reply["next_runs"]
    for name, when in sorted(next_runs.items(), key=lambda item: item[1] or ""):
        print(f"   -  scheduled   {name:<14} next     {when}")
    for line in format_runs(runs):
        print(line)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    jobs = commands.add_parser(
        "jobs", help="list scheduled, queued, running and finished review runs",
        description="Scheduled reviews with their next run, then runs: queued, running (with live tokens/s), "
        "done (with the report), failed (with the reason) or interrupted. Works with or without the service.",
    )  # fmt: skip
    jobs.add_argument("--limit", type=int, default=30, help="how many runs to show (30)")
    jobs.set_defaults(run=cmd_jobs)
