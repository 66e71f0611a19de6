"""`nightshift runs list|show|compare|export`: the catalogue of recorded benchmark runs (losses included)."""

from __future__ import annotations

import argparse
import json
import sys

from nightshift.app.commands import say
from nightshift.app.paths import catalogue_file


def catalogue():
    from nightshift.engine.instruments.catalogue import Catalogue

    return Catalogue(catalogue_file())


def _headline(figures: dict) -> str:
    keys = ("tokens_per_s", "roofline_fraction", "ms_per_token")
    return "  ".join(f"{k}={figures[k]:.3g}" for k in keys if isinstance(figures.get(k), (int, float)))


def cmd_list(args: argparse.Namespace) -> int:
    runs = catalogue().runs(kind=args.kind, limit=args.limit)
    if not runs:
        say(f"no runs recorded yet in {catalogue_file()}; `nightshift bench decode` records one")
        return 0
    for run in runs:
        print(
            f"{run.id}\t{run.recorded_at}\t{run.kind}\t{run.verdict}\t{run.fingerprint}\t{run.model}\t"
            f"{_headline(run.figures)}"
        )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    print(json.dumps(asdict(catalogue().get(args.id)), indent=1, sort_keys=True))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from nightshift.engine.instruments.catalogue import compare as compare_runs

    cat = catalogue()
    a, b = cat.get(args.a), cat.get(args.b)
    print(f"figure\trun {a.id} ({a.verdict})\trun {b.id} ({b.verdict})\tratio")
    for key, x, y, ratio in compare_runs(a, b):
        print(f"{key}\t{x}\t{y}\t{'' if ratio is None else f'{ratio:.3f}'}")
    changed = sorted(k for k in set(a.config) | set(b.config) if a.config.get(k) != b.config.get(k))
    for key in changed:
        print(f"config {key}\t{a.config.get(key)}\t{b.config.get(key)}\t")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    sys.stdout.write(catalogue().export(args.format))
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "The run catalogue: every timed run with its configuration, "
        "figures, proving counters and verdict; runs that lost are kept."
    )
    sub = parser.add_subparsers(dest="runs_command", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="recorded runs, newest first")
    listing.add_argument("--kind", help="only runs of this kind (decode, ab, ladder, verify)")
    listing.add_argument("--limit", type=int, default=50, help="most runs to list (50)")
    listing.set_defaults(run=cmd_list)
    show = sub.add_parser("show", help="one run in full (JSON)")
    show.add_argument("id", type=int)
    show.set_defaults(run=cmd_show)
    comp = sub.add_parser("compare", help="two runs side by side: figures, ratio B/A, differing settings")
    comp.add_argument("a", type=int)
    comp.add_argument("b", type=int)
    comp.set_defaults(run=cmd_compare)
    export = sub.add_parser("export", help="every run, as JSON or CSV on stdout")
    export.add_argument("--format", choices=("json", "csv"), default="json")
    export.set_defaults(run=cmd_export)
