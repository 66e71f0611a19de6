"""Cache policy variants the engine does not ship, against Belady on the trained-routing traces (no timing).

    .venv/bin/python -m bench.cache_variants TRACE [--layers 12] [--experts 128] [--chunk 512]

The engine's policies are replayed on its own class (bench/trained_routing.py); this asks what else could
close the gap to Belady before any of it goes into the engine: one score per (layer, expert) that each lookup
raises by its weight and that halves every 1/decay calls of its layer (decay 0: plain counts, LRFU otherwise;
the engine's `lrfu` is decay 0.1 with row-share weights), the lowest score evicted, a newcomer admitted only if
it scores at least its victim's, and on top of that: a lookup weighing 1 or the share of the chunk's rows that
chose the expert; a quota per layer (evict in the newcomer's own layer once it holds its share); the next
layer's guess protected from eviction; experts never seen before not admitted (one-off bypass). On one review
run (the month-end single narrative) of the trace laid on the bench geometry, and on i.i.d. random routing of
the same texts. A numpy model of the cache: its `decay 0.1, shares` row equals the engine's `lrfu` replay.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from bench.trained_routing import RUN, SHARES, Routing, random_like, trained
from nightshift.engine.bench.cache_sim import belady
from nightshift.engine.store import routing_trace

NEVER = np.inf
VARIANTS = {  # label -> (decay, row shares, per-layer quota, protect the guess, bypass one-offs)
    "counts (no decay)": (0.0, False, False, False, False),
    "decay 0.02": (0.02, False, False, False, False),
    "decay 0.05": (0.05, False, False, False, False),
    "decay 0.1": (0.1, False, False, False, False),
    "decay 0.2": (0.2, False, False, False, False),
    "decay 0.5": (0.5, False, False, False, False),
    "decay 0.1, shares (the engine's lrfu)": (0.1, True, False, False, False),
    "decay 0.1, shares, per-layer quota": (0.1, True, True, False, False),
    "decay 0.1, shares, guess protected": (0.1, True, False, True, False),
    "decay 0.1, shares, one-offs bypassed": (0.1, True, False, False, True),
}


def steps(routing: Routing, index: int, chunk: int, guess: np.ndarray | None):
    """Text `index`'s layer calls: (layer, experts, row shares, next layer's guess or None)."""
    text, prompt = routing.texts[index], routing.prompts[index]
    for start in range(0, prompt, chunk):
        rows = text[start : min(prompt, start + chunk)]
        for layer in range(routing.layers):
            experts, counts = np.unique(rows[:, layer], return_counts=True)
            yield layer, experts, counts / len(rows), None
    for t in range(prompt, len(text)):
        for layer in range(routing.layers):
            ahead = guess[t, layer + 1] if guess is not None and layer + 1 < routing.layers else None
            yield layer, np.sort(text[t, layer]), np.ones(routing.k), ahead


def hit_rate(calls: list, layers: int, experts: int, budget: int, variant: tuple) -> float:
    decay, shares, quota, protect, bypass = variant
    score, stamp, clock = np.zeros((layers, experts)), np.zeros((layers, experts)), np.zeros(layers)
    held, seen = np.zeros((layers, experts), bool), np.zeros((layers, experts), bool)
    hits = lookups = 0
    for layer, chosen, weights, ahead in calls:
        clock[layer] += 1
        hit = held[layer, chosen]
        hits, lookups = hits + int(hit.sum()), lookups + len(chosen)
        score[layer, chosen] = score[layer, chosen] * 2.0 ** (-decay * (clock[layer] - stamp[layer, chosen]))
        score[layer, chosen] += weights if shares else 1.0
        stamp[layer, chosen] = clock[layer]
        new = ~seen[layer, chosen]
        seen[layer, chosen] = True
        for expert in chosen[~hit & ~new] if bypass else chosen[~hit]:
            if held.sum() >= budget:
                now = score * 2.0 ** (-decay * (clock[:, None] - stamp))
                room = np.where(held, now, NEVER)
                room[layer, chosen[hit]] = NEVER  # what this call uses stays
                if quota and held[layer].sum() >= budget / layers:
                    room[np.arange(layers) != layer] = NEVER
                if protect and ahead is not None:
                    room[layer + 1, ahead] = NEVER
                victim = np.unravel_index(np.argmin(room), room.shape)
                if not np.isfinite(room[victim]) or room[victim] > now[layer, expert]:
                    continue
                held[victim] = False
            held[layer, expert] = True
    return hits / lookups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=512)
    args = parser.parse_args(argv)
    routing, guesses = trained(routing_trace.load(args.trace), args.experts, args.layers)
    guess = next(iter(guesses.values()))
    run = routing.text(RUN)
    for label, case, ahead in (("trained", routing, guess[run]), ("i.i.d. random", random_like(routing), None)):
        calls = list(steps(case, run, args.chunk, ahead))
        total = case.layers * case.experts
        bounds = {s: belady(case.calls(run, args.chunk), dict.fromkeys(range(1, case.layers + 1), 1), int(s * total))
                  for s in SHARES}  # fmt: skip
        print(f"\n{label}, {RUN}: hit rate (share of Belady)\n\n| variant | "
              + " | ".join(f"{s:.0%}" for s in SHARES) + " |\n|---|" + "---|" * len(SHARES))  # fmt: skip
        print("| Belady | " + " | ".join(f"{b.hit_rate:.1%}" for b in bounds.values()) + " |")
        for name, variant in VARIANTS.items():
            rates = [hit_rate(calls, case.layers, case.experts, int(s * total), variant) for s in SHARES]
            cells = [f"{r:.1%} ({r / bounds[s].hit_rate:.1%})" for r, s in zip(rates, SHARES)]
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
