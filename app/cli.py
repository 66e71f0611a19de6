"""`nightshift ...`: sub-commands grouped by what users do, one module each in app/commands/.

Only the chosen command's module is imported, and it imports the engine, MLX, Textual or
WeasyPrint inside the functions that need them: `nightshift --help`, `review list` or `jobs`
start in a fraction of a second instead of loading the whole engine (bench/startup.py measures it).

Errors users can meet (`NightshiftError`) print one clear message and exit 1;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection
from importlib import import_module

from nightshift.app.commands import say
from nightshift.app.paths import data_dir, ensure_data_dir
from nightshift.engine.errors import NightshiftError

# Command -> its one-line help, in the order `--help` lists them. Each is app/commands/<command>.py,
# whose `register(parser)` fills in its description, arguments and actions.
COMMANDS: dict[str, str] = {
    "model": "prepare and list models",
    "generate": "answer a prompt with a model, streaming tokens",
    "cluster": "run one model's layers over several hosts (mlx.distributed)",
    "drives": "show drives and measure their read ceilings",
    "rig": "a throttled multi-drive test rig on one disk (root)",
    "review": "list and run day-, week- and month-end reviews",
    "serve": "run the scheduler service for scheduled reviews",
    "jobs": "list scheduled, queued, running and finished review runs",
    "reports": "list and open review reports",
    "dashboard": "open the live Textual dashboard",
    "bench": "run the engine benchmarks (recorded in `nightshift runs`)",
    "runs": "list, compare and export recorded benchmark runs",
    "verify": "promotion gate: a configuration must reproduce the tokens of record",
}

EXIT_ERROR = 1


def build_parser(registered: Collection[str] = COMMANDS) -> argparse.ArgumentParser:
    """Every command listed with its help; the `registered` ones also get their arguments (their modules imported)."""
    parser = argparse.ArgumentParser(
        prog="nightshift",
        description="Unattended reviews of your own numbers by a large MoE model streamed from your SSDs. "
        f"Data dir: {data_dir()} (set NIGHTSHIFT_HOME to move it).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_line in COMMANDS.items():
        command = commands.add_parser(name, help=help_line)
        if name in registered:
            import_module(f"nightshift.app.commands.{name}").register(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # `nightshift` alone, in a terminal: the dashboard.
    asked = argv or (["dashboard"] if sys.stdin.isatty() and sys.stdout.isatty() else [])
    chosen = next((word for word in asked if not word.startswith("-")), None)
    parser = build_parser([chosen] if chosen in COMMANDS else [])
    args = parser.parse_args(asked)
    args.invocation = argv  # what was asked, as typed: benchmarks record it as the command that reproduces them
    if not getattr(args, "run", None):
        parser.print_help()
        return 0
    try:
        ensure_data_dir()  # owner-only from the first command that runs, whichever it is
        return args.run(args)
    except NightshiftError as exc:
        say(f"error: {exc}")
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
