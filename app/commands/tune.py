"""`nightshift model tune MODEL`: calibrate a store's streaming settings on this machine's drives.

What it measures and how it chooses is in engine/bench/tune.py; the choice is written to the store's
tuning.json, which `generate`, reviews, the service and the benchmarks then use unless a flag overrides.
Every trial is also recorded in the run catalogue (kind `tune`), losses included.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import replace

from nightshift.app.commands import say
from nightshift.app.commands.runs import catalogue
from nightshift.app.commands.stream_flags import comma_list, sources_from


def cmd_tune(args: argparse.Namespace) -> int:
    from nightshift.engine.bench.tune import tune
    from nightshift.engine.errors import NightshiftError
    from nightshift.engine.instruments.catalogue import Run
    from nightshift.engine.moe.settings import StreamSettings
    from nightshift.engine.moe.tuning import describe_tuning

    store, drives, ceilings = sources_from(args)
    if args.repeats < 1 or args.tokens < 1:
        raise NightshiftError("--repeats and --tokens must be at least 1")
    say(f"tuning {store.name}: {args.tokens} tokens per trial, at most {args.minutes:g} minutes")
    record = tune(store, drives, ceilings, args.tokens, 60 * args.minutes, say, args.use_drives, args.repeats)
    command = shlex.join(["nightshift", *args.invocation])
    ids = []
    for trial in record["trials"]:
        settings = replace(StreamSettings(cache_bytes=0, use_drives=args.use_drives), **trial["changes"])
        run = Run(
            kind="tune",
            model=store.name,
            config={**settings.as_dict(), "tokens": args.tokens, "step": trial["step"], "label": trial["label"]},
            figures={"tokens_per_s": trial["tokens_per_s"], "bytes_per_token": trial["bytes_per_token"],
                     "recall_per_layer": trial["recall_per_layer"], "seconds": trial["seconds"]},
            verdict="measured" if trial["proven"] else "did not fire",
            drives={},
            counters=trial["counters"],
            command=command,
            note=f"model tune step {trial['step']}: {trial['label']}; timed on this machine, side by side",
        )  # fmt: skip
        ids.append(catalogue().record(run))
    for name in record["skipped"]:
        say(f"not measured (time budget): {name}; run again with more --minutes to include it")
    say(f"cache policy: {record['cache_policy']['why']}")
    say(describe_tuning(store, args.use_drives))
    say(
        f"defaults {record['defaults_tokens_per_s']:.3f} tok/s, tuned {record['tuned_tokens_per_s']:.3f} tok/s "
        f"side by side; {record['seconds']:.0f} s in all; written to {record['path']}; "
        f"trials recorded as runs {ids[0]}-{ids[-1]}"
    )
    return 0


def register(actions: argparse._SubParsersAction) -> None:
    tune = actions.add_parser(
        "tune",
        help="calibrate a store's streaming settings on these drives (a few minutes)",
        description="Measure short decodes side by side to choose prefetch on or off (and per layer), prefetch "
        "limit and threads, demand threads per drive, split reads and the cache policy for this store on "
        "these drives; written to the store's tuning.json and used by generate, reviews and benchmarks "
        "unless a flag overrides (benchmarks: --no-tuning).",
    )
    tune.add_argument("model", metavar="MODEL", help="model name or store directory")
    tune.add_argument("--drives", help="drives.toml whose roots replace the store's (e.g. the rig's)")
    tune.add_argument("--ceilings", help="drive_ceilings.json from `drives probe` (dispatcher's starting estimates)")
    tune.add_argument(
        "--use-drives",
        type=comma_list(str),
        default=(),
        help="tune for reading from these drives only, comma-separated (default: all the store's drives)",
    )
    tune.add_argument("--tokens", type=int, default=6, help="tokens timed per trial (6)")
    tune.add_argument(
        "--repeats", type=int, default=1, help="runs per configuration, alternating; each rate the median (1)"
    )
    tune.add_argument(
        "--minutes", type=float, default=5.0, help="time budget; steps that would not fit are skipped (5)"
    )
    tune.set_defaults(run=cmd_tune)
