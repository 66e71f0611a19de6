"""The expert cache against Belady as a run goes on: `lrfu`'s share of Belady's hits in windows of passes (no timing).

    .venv/bin/python -m bench.cache_warmup STORE TRACE... [--shares 0.1,0.25,0.5] [--passes 1,2,5,17,33,65]

A trace of a streamed run (nightshift's own, as `bench.streaming_peers --traces` or `bench.cache_traces` write
it) is its layer calls in order: the prompt's pass, then one pass a decode token, each a call of every MoE
layer. Each window [a, b) of passes (`--passes` are the bounds; pass 0 is the prompt's) gets the hits of `lrfu`
(the engine's cache, replayed) and of Belady, and their ratio; the first line is the prompt's union of experts per
layer against the experts a layer's share of the budget holds. Both are prefix-exact: a window's hits are those
of the replay over the passes up to its end, less those up to its start (`lrfu` is online; Belady's optimum over
a longer run is also optimal over each of its prefixes). Sizes as the engine counts them (engine/moe/held.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nightshift.engine.bench.cache_sim import belady, load_trace, replay
from nightshift.engine.moe.held import held_sizes
from nightshift.engine.moe.settings import LRFU
from nightshift.engine.store.manifest import read_manifest


def windows(calls: list, layers: int, sizes: dict[int, int], budget: int, bounds: list[int]) -> list[tuple]:
    """Per window of passes [a, b): (a, b, lookups, lrfu hits, Belady hits)."""
    at = [min(b * layers, len(calls)) for b in bounds]
    ours = [replay(calls[:end], sizes, budget, LRFU).hits for end in at]
    best = [belady(calls[:end], sizes, budget).hits for end in at]
    rows = []
    for i in range(len(at) - 1):
        lookups = sum(len(call.experts) for call in calls[at[i] : at[i + 1]])
        rows.append((bounds[i], bounds[i + 1], lookups, ours[i + 1] - ours[i], best[i + 1] - best[i]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("store", type=Path, help="the store the traces were recorded on (its expert sizes)")
    parser.add_argument("traces", type=Path, nargs="+")
    parser.add_argument("--shares", default="0.1,0.25,0.5", help="budgets as shares of the store's expert bytes")
    parser.add_argument("--passes", default="0,1,2,5,17,33,65", help="window bounds in passes (0: the prompt's)")
    args = parser.parse_args()
    manifest = read_manifest(args.store)
    sizes, layers = held_sizes(manifest.layers), len(manifest.layers)
    for path in args.traces:
        calls = load_trace(path)
        passes = -(-len(calls) // layers)
        bounds = sorted({b for b in map(int, args.passes.split(",")) if b < passes} | {passes})
        union = [len(call.experts) for call in calls[:layers]]
        print(f"{path.name}: {len(calls)} layer calls, {passes} passes; the prompt's pass ({calls[0].rows} rows) "
              f"uses {sum(union) / layers:.1f} experts a layer ({min(union)}-{max(union)})")  # fmt: skip
        for share in (float(s) for s in args.shares.split(",")):
            budget = int(share * manifest.expert_bytes)
            held = budget / sum(sizes.values())
            cells = [f"{a}-{b - 1}: {ours / n:.1%} / {best / n:.1%} ({ours / best:.2f})" if best else f"{a}-{b - 1}: -"
                     for a, b, n, ours, best in windows(calls, layers, sizes, budget, bounds)]  # fmt: skip
            print(f"| {share:.0%} ({held:.1f} experts a layer) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
