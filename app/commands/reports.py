"""`nightshift reports list|open`: the reports written so far, from the index in the data dir."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from nightshift.app.commands import say
from nightshift.engine.errors import NightshiftError, did_you_mean

if TYPE_CHECKING:
    from nightshift.app.review.index import IndexEntry


def _reports() -> list[IndexEntry]:
    from nightshift.app.daemon.control import reports
    from nightshift.app.review.index import read_index

    entries = reports()
    return entries if entries is not None else read_index()


def cmd_list(args: argparse.Namespace) -> int:
    reports = _reports()
    if not reports:
        say("no reports yet; run one with `nightshift review run month-end --now`")
    for report in reports:
        start = f"{report.id:>4}  {report.created}  {report.review:<12} {report.period or '-':<14} "
        if report.failed:
            print(f"{start}FAILED (run {report.run}, as of {report.as_of or '-'}): {report.reason}")
            continue
        gone = "  (file missing)" if report.missing else ""
        print(f"{start}{report.findings:>3} findings ({report.by_severity['high']} high)  {report.path}{gone}")
    return 0


def cmd_open(args: argparse.Namespace) -> int:
    entries = _reports()
    reports = [r for r in entries if not r.failed]
    if not reports:
        raise NightshiftError("no reports yet; run one with `nightshift review run month-end --now`")
    wanted = args.report
    if wanted == "latest":
        report = reports[-1]
    else:
        matches = [r for r in entries if str(r.id) == wanted] or [r for r in reports if r.review == wanted]
        if not matches:
            reviews = {r.review for r in reports}
            raise NightshiftError(f"no report {wanted!r}{did_you_mean(wanted, reviews)}; give an id or review name "
                                  "from `nightshift reports list`")  # fmt: skip
        report = matches[-1]
    if report.failed:
        raise NightshiftError(f"entry {report.id} is a failed run, with no report: {report.reason}")
    if report.missing:
        raise NightshiftError(f"report {report.id} was at {report.path}, which no longer exists")
    print(report.path)
    if args.print_only:
        return 0
    from nightshift.app.viewer import open_pdf

    problem = open_pdf(Path(report.path))
    if problem is not None:
        raise NightshiftError(f"nothing opened: {problem} (the path above is the report; --print-only only prints it)")
    say(f"opened report {report.id} in the PDF viewer")
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = "List and open reports."
    actions = parser.add_subparsers(dest="reports_command", metavar="ACTION", required=True)
    listing = actions.add_parser(
        "list",
        help="list reports and failed runs, oldest first",
        description="List reports, and runs that failed with their reason, oldest first.",
    )
    listing.set_defaults(run=cmd_list)
    opening = actions.add_parser(
        "open", help="print a report's path and open it in the PDF viewer",
        description="Print the report's path, then open it with $NIGHTSHIFT_PDF_VIEWER or the desktop's PDF "
        "viewer; when nothing opened (no viewer, no display) it says why and exits 1.",
    )  # fmt: skip
    opening.add_argument("report", nargs="?", default="latest", help="report id, review name or `latest` (default)")
    opening.add_argument("--print-only", action="store_true", help="only print the path")
    opening.set_defaults(run=cmd_open)
