"""`nightshift dashboard` (and `nightshift` alone, in a terminal): the live Textual dashboard."""

from __future__ import annotations

import argparse
import sys

from nightshift.app.commands import say

EXIT_NO_TERMINAL = 2  # a usage error, as a command line a command cannot run with


def cmd_dashboard(args: argparse.Namespace) -> int:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        say("error: the dashboard needs a terminal (its input and output are not one); for figures in a pipe "
            "use `nightshift jobs`, `nightshift reports list` or `nightshift drives watch`")  # fmt: skip
        return EXIT_NO_TERMINAL
    from nightshift.app.tui.app import Dashboard

    Dashboard().run()
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Live tokens/s, per-drive read throughput, memory and the running job with its text; the job "
        "queue (run a review now, pause or resume a schedule, cancel the running job); reports; benchmark runs. "
        "It attaches to `nightshift serve` when one runs, and offers to start the scheduler in-process otherwise. "
        "Press ? inside for the keys. Set NIGHTSHIFT_PDF_VIEWER to choose the program that opens reports."
    )
    parser.set_defaults(run=cmd_dashboard)
