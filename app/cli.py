"""`nightshift ...`: sub-commands grouped by what users do, one module each in app/commands/.

Errors users can meet (`NightshiftError`) print one clear message and exit 1;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys

from nightshift.app.commands import (
    bench,
    dashboard,
    drives,
    generate,
    jobs,
    model,
    reports,
    review,
    rig,
    runs,
    say,
    serve,
    verify,
)
from nightshift.app.paths import data_dir
from nightshift.engine import NightshiftError

# Command groups, in the order `--help` lists them.
GROUPS = [model, generate, drives, rig, review, serve, jobs, reports, dashboard, bench, runs, verify]

EXIT_ERROR = 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nightshift",
        description="Unattended reviews of your own numbers by a large MoE model streamed from your SSDs. "
        f"Data dir: {data_dir()} (set NIGHTSHIFT_HOME to move it).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for group in GROUPS:
        group.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    args.invocation = argv  # what was asked, as typed: benchmarks record it as the command that reproduces them
    if args.command is None and sys.stdin.isatty() and sys.stdout.isatty():
        args = parser.parse_args(["dashboard"])  # `nightshift` alone, in a terminal: the dashboard
    if not getattr(args, "run", None):
        parser.print_help()
        return 0
    try:
        return args.run(args)
    except NightshiftError as exc:
        say(f"error: {exc}")
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
