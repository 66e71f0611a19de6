"""Routing traces of real runs, and what any cache policy could reach on them (docs/results.md, [13]).

`record` makes a trace from a text prompt (a review's own text, say) and sampled decode, so two runs differ as
two real uses would:

    .venv/bin/python -m bench.cache_traces record STORE --text FILE --out TRACE [--prompt-tokens 400]
        [--tokens 96] [--temp 0.7] [--seed 0]

`bounds` asks whether any policy can reach Belady on a trace: it replays one run's trace (`--test`) with a
profile learned from other runs (`--train`, as a store's profile would be), beside the static oracle
(the best fixed set, knowing the test run's own frequencies) and Belady, cold and warm started:

    .venv/bin/python -m bench.cache_traces bounds STORE --train TRACE... --test TRACE --catalogue CAT

The replays are engine/bench/cache_sim.py's, on the engine's own cache class.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from nightshift.engine.bench.cache_sim import BELADY, Call, load_trace, save_trace, sweep
from nightshift.engine.instruments.probes import Instruments
from nightshift.engine.moe.held import held_sizes
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.warm import RoutingProfile, counts_of
from nightshift.engine.runtime import open_model


def record(store: Path, text: str, prompt_tokens: int, tokens: int, temp: float, seed: int) -> list[Call]:
    """The routing of one real run: the first `prompt_tokens` of `text` read as one prompt, then `tokens`
    sampled at `temp` (greedy on a synthetic model soon repeats itself; a review's does not). Routing does not
    depend on the cache, so the run uses the default budget: once every expert is held it runs at in-RAM speed."""
    instruments = Instruments(routing=[])
    model = open_model(store, stream=StreamSettings(), instruments=instruments)
    try:
        prompt = model.tokenizer.encode(text)[:prompt_tokens]
        for _ in model.generate_tokens(prompt, max_tokens=tokens, temp=temp, seed=seed):
            pass
        model.stream.call_counts()  # resident calls, if any, into the log
        return [Call(*call) for call in instruments.routing]
    finally:
        model.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record a routing trace from a real run")
    rec.add_argument("store", type=Path)
    rec.add_argument("--text", type=Path, required=True, help="a text file whose first tokens are the prompt")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--prompt-tokens", type=int, default=400)
    rec.add_argument("--tokens", type=int, default=96)
    rec.add_argument("--temp", type=float, default=0.7)
    rec.add_argument("--seed", type=int, default=0)
    bounds = sub.add_parser("bounds", help="policies with a profile from other runs against the bounds")
    bounds.add_argument("store", type=Path)
    bounds.add_argument("--train", type=Path, nargs="+", required=True, help="traces the profile is learned from")
    bounds.add_argument("--test", type=Path, required=True, help="the trace replayed")
    bounds.add_argument("--catalogue", type=Path, required=True)
    bounds.add_argument("--shares", type=float, nargs="+", default=[0.05, 0.1, 0.25, 0.5])
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.command == "bounds":
        return show_bounds(args, argv)
    calls = record(args.store, args.text.read_text(), args.prompt_tokens, args.tokens, args.temp, args.seed)
    save_trace(calls, args.out)
    print(f"{len(calls)} layer calls ({sum(c.rows > 1 for c in calls)} of many rows) in {args.out}")
    return 0


def show_bounds(args: argparse.Namespace, argv: list[str]) -> int:
    """`bounds`: the table, each cell's share of Belady from the same start, recorded in the catalogue."""
    from nightshift.engine.instruments.catalogue import Catalogue, Run
    from nightshift.engine.store.manifest import read_manifest

    manifest = read_manifest(args.store)
    sizes = held_sizes(manifest.layers)
    profile = RoutingProfile()
    for path in args.train:
        profile = profile.merged(counts_of((call.layer, call.experts) for call in load_trace(path)))
    calls = load_trace(args.test)
    table = sweep(calls, sizes, manifest.expert_bytes, tuple(args.shares), profile=profile)
    names = list(next(iter(table.values())))
    print("| budget | " + " | ".join(names) + " |")
    for share, row in table.items():
        print(f"| {share:.0%} | " + " | ".join(f"{row[name].hit_rate:.1%}" for name in names) + " |")
    figures = {f"{name} {share:g}": round(r.hit_rate, 4) for share, row in table.items() for name, r in row.items()}
    for share, row in table.items():
        for name, found in row.items():
            bound = row[BELADY + (" + warm" if name.endswith("+ warm") else "")]
            figures[f"{name} {share:g} of belady"] = round(found.hits / bound.hits, 4) if bound.hits else 1.0
    run = Run(
        kind="cache-bounds",
        model=args.store.name,
        config={"train": [str(p) for p in args.train], "test": str(args.test), "calls": len(calls)},
        figures=figures,
        verdict="measured",
        command=shlex.join(["python", "-m", "bench.cache_traces", *argv]),
        note="replays of recorded traces (no timing)",
    )
    print(f"recorded run {Catalogue(args.catalogue).record(run, [])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
