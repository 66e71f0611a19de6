"""`nightshift ...`: sub-commands grouped by what users do, one module each in app/commands/.

Only the chosen command's module is imported, and it imports the engine, MLX, Textual or
WeasyPrint inside the functions that need them: `nightshift --help`, `review list` or `jobs`
start in a fraction of a second instead of loading the whole engine (bench/startup.py measures it).

Errors users can meet (`NightshiftError`) print one clear message and exit 1;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Collection
from importlib import import_module
from typing import NoReturn

from nightshift.app.commands import say
from nightshift.app.paths import data_dir, doc, ensure_data_dir
from nightshift.engine.errors import NightshiftError, did_you_mean

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
EXIT_USAGE = 2  # as argparse exits for a command line it cannot take
# argparse's words for a value of the wrong type name the function that parsed it ("invalid _positive_int
# value"); said in the user's words instead.
KINDS = {"int": "a whole number", "float": "a number"}
INVALID = re.compile(r"invalid (?P<kind>\S+) value: (?P<value>.+)$")
CHOICE = re.compile(r"argument (?P<what>\S+): invalid choice: (?P<value>'[^']*') \(choose from (?P<choices>.*)\)$")


class Parser(argparse.ArgumentParser):
    """argparse with messages in the user's words: a near-miss command, action or option gets a suggestion
    (`nightshift reveiw` -> did you mean 'review'?), and a value of the wrong type says what was expected
    instead of naming the function that parsed it. Sub-commands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {self.user_words(message)}\n")

    def user_words(self, message: str) -> str:
        if found := CHOICE.search(message):
            word = found["value"].strip("'")
            choices = [choice.strip("'") for choice in found["choices"].split(", ")]
            what = "command" if found["what"] == "COMMAND" else found["what"].lower()
            return f"unknown {what} {word!r}{did_you_mean(word, choices)} (choose from {', '.join(choices)})"
        if found := INVALID.search(message):
            kind = KINDS.get(found["kind"], "a valid value")
            return f"{message[: found.start()]}{found['value']} is not {kind}"
        if message.startswith("unrecognized arguments: "):
            given = message.removeprefix("unrecognized arguments: ").split()
            options = [option for action in self._every_action() for option in action.option_strings]
            hints = "".join(did_you_mean(word.split("=")[0], options) for word in given if word.startswith("-"))
            return f"{message}{hints}"
        return message

    def _every_action(self) -> list[argparse.Action]:
        """This parser's arguments and those of every sub-command under it."""
        found = list(self._actions)
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    found.extend(child._every_action() if isinstance(child, Parser) else child._actions)
        return found


def build_parser(registered: Collection[str] = COMMANDS) -> argparse.ArgumentParser:
    """Every command listed with its help; the `registered` ones also get their arguments (their modules imported)."""
    parser = Parser(
        prog="nightshift",
        description="Unattended reviews of your own numbers by a large MoE model streamed from your SSDs. "
        f"Data dir: {data_dir()} (set NIGHTSHIFT_HOME to move it). Docs: {doc('')}",
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
