"""`nightshift verify --model STORE [settings]`: the promotion gate.

A store's prompt of record has its greedy tokens recorded once, from the model held
fully in RAM (the reference). A streaming configuration may become a default only if
it reproduces those tokens exactly; every check is recorded in the run catalogue.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from nightshift.app.commands import say
from nightshift.app.commands.runs import catalogue
from nightshift.app.commands.stream_flags import add_stream_arguments, settings_from, sources_from
from nightshift.app.paths import verify_record

STEPS = 32
EXIT_MISMATCH = 1


def reference_tokens(store: Path, again: bool) -> list[int]:
    """The recorded greedy tokens of the prompt of record (computed in RAM and saved if missing or `again`)."""
    from nightshift.engine.bench.decode import greedy_of_record

    path = verify_record(store.name)
    if path.is_file() and not again:
        return json.loads(path.read_text())["tokens"]
    say(f"recording the prompt of record's {STEPS} greedy tokens from {store.name} held in RAM")
    tokens = greedy_of_record(store, None, STEPS)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps({"store": str(store), "steps": STEPS, "tokens": tokens}) + "\n")
    os.replace(tmp, path)
    return tokens


def cmd_verify(args: argparse.Namespace) -> int:
    from nightshift.engine.bench.decode import first_difference, greedy_of_record
    from nightshift.engine.instruments.catalogue import Run

    store, drives, _ = sources_from(args)
    settings = settings_from(args)
    expected = reference_tokens(store, args.record)
    got = greedy_of_record(store, settings, STEPS, drives)
    where = first_difference(expected, got)
    verdict = "pass" if where is None else "fail"
    run = Run(
        kind="verify",
        model=store.name,
        config=settings.as_dict(),
        verdict=verdict,
        figures={"tokens": len(got), "first_difference": where},
        command=f"nightshift verify --model {args.model}",
    )
    run_id = catalogue().record(run)
    if where is None:
        say(f"pass: this configuration reproduces the {len(expected)} tokens of record exactly (run {run_id})")
        return 0
    say(
        f"fail: token {where} differs ({expected[where : where + 4]} expected, {got[where : where + 4]} produced); "
        f"this configuration may not become a default (run {run_id})"
    )
    return EXIT_MISMATCH


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n")[1].replace("\n", " ")
    add_stream_arguments(parser)
    parser.add_argument("--record", action="store_true", help="record the reference tokens again (in RAM)")
    parser.set_defaults(run=cmd_verify)
