"""A decode step's experts on one CPU stream against several, side by side on one model in one process.

The model is opened once (the store in RAM, or streamed with `--streamed`); each pair decodes the same
prompt with `NIGHTSHIFT_CPU_STREAMS=1` and with the count under test, back to back, which goes first
alternating, and the ratio is taken per pair (a shared 2-core VM spreads rounds apart by +-10 %). The
median carries a seeded bootstrap 95 % interval. The variant is recorded only if its counters prove the split
ran (`split_calls` for a call over a stack of experts, `spread_experts` for experts run as they land), and
both sides must give the same tokens: the split computes each expert with the same kernel on the same bits.

    python -m bench.cpu_streams STORE --catalogue CAT [--streams 2] [--pairs 8]
        [--prompt-tokens 100] [--tokens 17] [--streamed]
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from bench.cpu_prefill import TEXT
from bench.resident import median_interval, one_round, spread
from nightshift.engine.cpu_streams import ENV
from nightshift.engine.instruments.assertions import Proof
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.instruments.probes import Instruments
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import Model, open_model

SPLIT = ("split_calls", "spread_experts")  # the counters that prove the split ran


def with_streams(model: Model, instruments: Instruments, streams: int, prompt: list[int], tokens: int) -> dict:
    """One generation with `streams` CPU streams, and what the split did during it (`instruments`: the model's)."""
    os.environ[ENV] = str(streams)
    before = instruments.counts()
    figures = one_round(model, prompt, tokens)
    return figures | {name: instruments.counts()[name] - before[name] for name in SPLIT}


def pairs(model: Model, instruments: Instruments, streams: int, prompt: list[int], tokens: int, count: int) -> dict:
    """Per pair, the decode rate with `streams` over the rate with one; the split's counters summed; whether
    every generation gave the same tokens."""
    ratios, split, tokens_seen = [], dict.fromkeys(SPLIT, 0), set()
    for i in range(count):
        order = (1, streams) if i % 2 == 0 else (streams, 1)
        runs = {n: with_streams(model, instruments, n, prompt, tokens) for n in order}
        ratios.append(runs[streams]["decode_tok_s"] / runs[1]["decode_tok_s"])
        split = {name: split[name] + runs[streams][name] for name in split}
        tokens_seen |= {tuple(r["tokens"]) for r in runs.values()}
    return {"ratios": ratios, "split": split, "tokens_identical": len(tokens_seen) == 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("--catalogue", type=Path, required=True)
    parser.add_argument("--streams", type=int, default=2, help="CPU streams of the variant (the baseline: 1)")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=17, help="tokens each generation decodes")
    parser.add_argument("--streamed", action="store_true", help="stream the store (its tuned settings) instead")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.streams < 2 or args.pairs < 1 or args.tokens < 2:
        parser.error("--streams must be 2 or more, --pairs 1 or more, --tokens 2 or more")
    instruments = Instruments()
    model = open_model(args.store, stream=StreamSettings() if args.streamed else None, instruments=instruments)
    try:
        unit = model.tokenizer.encode(TEXT)
        prompt = (unit * (args.prompt_tokens // len(unit) + 1))[: args.prompt_tokens]
        with_streams(model, instruments, 1, prompt, 2)  # builds the kernels (and, streamed, reads the experts)
        result = pairs(model, instruments, args.streams, prompt, args.tokens, args.pairs)
    finally:
        model.close()
    low, high = median_interval(result["ratios"])
    figures = {**spread("decode_vs_one_stream", result["ratios"]), "decode_vs_one_stream low": low,
               "decode_vs_one_stream high": high, "pairs": args.pairs, "tokens_identical": result["tokens_identical"]}  # fmt: skip
    print(figures, result["split"])
    said = (
        "below-target" if not result["tokens_identical"] else "win" if low > 1 else "loss" if high < 1 else "unresolved"
    )
    counter = "spread_experts" if args.streamed else "split_calls"
    run = Run(
        kind="cpu-streams",
        model=args.store.name,
        config={"streams": args.streams, "baseline_streams": 1, "streamed": args.streamed,
                "prompt_tokens": args.prompt_tokens, "tokens": args.tokens},
        figures=figures,
        counters=result["split"],
        verdict=said,
        command=shlex.join(["python", "-m", "bench.cpu_streams", *argv]),
        note="adjacent pairs, which goes first alternating; ratios within the run",
    )  # fmt: skip
    print(f"recorded run {Catalogue(args.catalogue).record(run, [Proof('cpu streams', counter)])} ({said})")
    return 0 if result["tokens_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
