"""Replay routing traces against expert cache policies, with Belady's optimum as the bound.

A routing trace is what a real run looked up, in order: per streaming layer call (a prompt chunk or a
decode step), the layer and the sorted unique experts its rows selected (`Instruments.routing`).
The engine looks every one of them up in its cache, then keeps the misses once read; `replay` does the
same with the engine's own `ExpertCache` (sizes only, no tensors), so for a given trace its hit rate is
the engine's, whatever the drives. `belady` is the offline optimum for the same lookups: on a miss with
no room it evicts the resident used furthest in the future, or keeps nothing when the newcomer itself is
(an optimum that may refuse admission, as `lru-admit` and `frequency` may).

Traces are saved as JSON lines: {"layer": L, "experts": [...], "rows": R}. `record` makes one from a
text prompt (a review's own text, say) and sampled decode, so two runs differ as two real uses would:

    python -m nightshift.engine.bench.cache_sim record STORE --text FILE --out TRACE [--prompt-tokens 400]
        [--tokens 96] [--temp 0.7] [--seed 0]

`bounds` asks whether any policy can reach Belady on a trace: it replays one run's trace (`--test`) with a
profile learned from other runs (`--train`, as a store's profile would be), beside the static oracle
(the best fixed set, knowing the test run's own frequencies) and Belady, cold and warm started:

    python -m nightshift.engine.bench.cache_sim bounds STORE --train TRACE... --test TRACE --catalogue CAT
"""

from __future__ import annotations

import argparse
import heapq
import json
import shlex
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nightshift.engine.instruments.probes import Instruments
from nightshift.engine.moe.cache import ExpertCache
from nightshift.engine.moe.settings import CACHE_POLICIES, FREQUENCY, LRU_ADMIT, StreamSettings
from nightshift.engine.moe.warm import RoutingProfile, counts_of

BELADY = "belady"
STATIC = "static oracle"


@dataclass(frozen=True)
class Call:
    """One streaming layer call of a trace: its layer, unique experts (sorted) and rows."""

    layer: int
    experts: tuple[int, ...]
    rows: int


@dataclass(frozen=True)
class Replay:
    """One policy at one budget over one trace."""

    policy: str
    budget: int
    hits: int
    lookups: int
    bytes_read: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


def save_trace(calls: Iterable[Call], path: Path) -> int:
    """Write `calls` as JSON lines; returns how many."""
    count = 0
    with open(path, "w") as f:
        for call in calls:
            f.write(json.dumps({"layer": call.layer, "experts": list(call.experts), "rows": call.rows}) + "\n")
            count += 1
    return count


def load_trace(path: Path) -> list[Call]:
    with open(path) as f:
        return [Call(d["layer"], tuple(d["experts"]), d["rows"]) for d in map(json.loads, f) if d]


def replay(
    calls: list[Call],
    sizes: dict[int, int],
    budget: int,
    policy: str,
    profile: RoutingProfile | None = None,
    warm: bool = False,
) -> Replay:
    """The engine's cache under `policy` and `budget` over `calls`; sizes: bytes of one expert per layer.

    As `ExpertStream` does: look up each of a call's experts, then offer the cache the ones that missed.
    `profile`: a routing profile of other runs, seeding the cache's counts as the engine does; with `warm`,
    the cache starts filled with the profile's hottest experts (the warm start, as if it finished first).
    """
    cache: ExpertCache[None] = ExpertCache(budget, policy)
    if profile is not None:
        cache.prior(profile.prior())
        for key in profile.hottest(sizes, budget) if warm else ():
            cache.put(key, None, sizes[key[0]], warm=True)
    read = 0
    for call in calls:
        missing = [e for e in call.experts if (call.layer, e) not in cache]
        for expert in call.experts:
            cache.get((call.layer, expert))
        for expert in missing:
            cache.put((call.layer, expert), None, sizes[call.layer])
        read += len(missing) * sizes[call.layer]
    name = policy + (" + profile" if profile is not None else "") + (" + warm" if warm else "")
    return Replay(name, budget, cache.hits, cache.hits + cache.misses, read)


def static_oracle(calls: list[Call], sizes: dict[int, int], budget: int, warm: bool = False) -> Replay:
    """The best fixed set for this trace: the experts it looks up most, pinned within `budget` (read on first
    use, or held from the start with `warm`). When routing is stationary, no policy without knowledge of the
    future does better than the fixed set of the most probable experts; this is that set with the trace's own
    frequencies, so it bounds what any profile or online count can reach."""
    counts = counts_of((call.layer, call.experts) for call in calls)
    pinned = RoutingProfile(dict(counts)).hottest(sizes, budget)
    lookups = sum(counts.values())
    cold = 0 if warm else 1  # a pinned expert's first lookup reads it
    hits = sum(counts[key] - cold for key in pinned)
    missed = {key: counts[key] for key in counts} | {key: cold for key in pinned}
    read = sum(sizes[key[0]] * n for key, n in missed.items())
    return Replay(STATIC + (" + warm" if warm else ""), budget, hits, lookups, read)


def belady(calls: list[Call], sizes: dict[int, int], budget: int, warm: bool = False) -> Replay:
    """Belady's optimum for the lookups of `calls` within `budget` bytes (exact when experts are one size).

    `warm`: the optimum may also choose what the cache holds at the start (for free, as a warm start reads it
    before it is needed): the experts first needed soonest, which is what evicting the furthest next use
    from a cache holding everything leaves."""
    keys = [(call.layer, e) for call in calls for e in call.experts]
    never = len(keys)
    upcoming = [never] * len(keys)  # position of each lookup's key's next lookup
    last: dict[tuple[int, int], int] = {}
    for i in range(len(keys) - 1, -1, -1):
        upcoming[i] = last.get(keys[i], never)
        last[keys[i]] = i
    resident: dict[tuple[int, int], int] = {}  # key -> its next lookup
    heap: list[tuple[int, tuple[int, int]]] = []  # (-next lookup, key); stale entries skipped
    used = hits = read = 0
    for key, first in sorted(last.items(), key=lambda item: item[1]) if warm else ():
        if used + sizes[key[0]] <= budget:
            resident[key] = first
            heapq.heappush(heap, (-first, key))
            used += sizes[key[0]]
    for i, key in enumerate(keys):
        size = sizes[key[0]]
        if key in resident:
            hits += 1
        else:
            read += size
            if size > budget or upcoming[i] == never:
                continue
            while used + size > budget:
                far, victim = heap[0]
                if resident.get(victim) != -far:
                    heapq.heappop(heap)
                    continue
                if -far < upcoming[i]:  # every resident is needed before the newcomer: keep them
                    break
                heapq.heappop(heap)
                del resident[victim]
                used -= sizes[victim[0]]
            if used + size > budget:
                continue
            used += size
        resident[key] = upcoming[i]
        heapq.heappush(heap, (-upcoming[i], key))
    return Replay(BELADY + (" + warm" if warm else ""), budget, hits, len(keys), read)


def sweep(
    calls: list[Call],
    sizes: dict[int, int],
    expert_bytes: int,
    shares: tuple[float, ...],
    policies=CACHE_POLICIES,
    profile: RoutingProfile | None = None,
) -> dict[float, dict[str, Replay]]:
    """Every policy, the static oracle and Belady at each share of the store's expert bytes: {share: {name:
    Replay}}; with a routing profile of other runs, also each frequency policy seeded from it, cold and warm
    started, and the static oracle and Belady from a warm start (the bounds a warm start is held to)."""
    table = {}
    for share in shares:
        budget = int(share * expert_bytes)
        row = {policy: replay(calls, sizes, budget, policy) for policy in policies}
        for warm in (False, True) if profile is not None else ():
            for policy in (FREQUENCY, LRU_ADMIT):
                found = replay(calls, sizes, budget, policy, profile, warm)
                row[found.policy] = found
        for warm in (False, True) if profile is not None else (False,):
            for bound in (static_oracle(calls, sizes, budget, warm), belady(calls, sizes, budget, warm)):
                row[bound.policy] = bound
        table[share] = row
    return table


def best_policy(table: dict[float, dict[str, Replay]], shares=(0.10, 0.25, 0.50)) -> str:
    """The engine policy with the highest mean hit rate over `shares` (the budgets a streamed model runs at),
    from a cold start (whether to warm start is a setting of its own, chosen by measurement)."""
    policies = [p for p in next(iter(table.values())) if p in CACHE_POLICIES]
    return max(policies, key=lambda p: sum(table[s][p].hit_rate for s in shares if s in table))


def record(store: Path, text: str, prompt_tokens: int, tokens: int, temp: float, seed: int) -> list[Call]:
    """The routing of one real run: the first `prompt_tokens` of `text` read as one prompt, then `tokens`
    sampled at `temp` (greedy on a synthetic model soon repeats itself; a review's does not). Routing does not
    depend on the cache, so the run uses the default budget: once every expert is held it runs at in-RAM speed."""
    from nightshift.engine.runtime import open_model

    instruments = Instruments(routing=[])
    model = open_model(store, stream=StreamSettings(), instruments=instruments)
    try:
        prompt = model.tokenizer.encode(text)[:prompt_tokens]
        for _ in model.generate_tokens(prompt, max_tokens=tokens, temp=temp, seed=seed):
            pass
        model.stream.call_counts()  # resident calls, if any, into the log
        return [Call(layer, experts, rows) for layer, experts, rows in instruments.routing]
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
    sizes = {layer.layer: layer.file_bytes for layer in manifest.layers}
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
        command=shlex.join(["python", "-m", "nightshift.engine.bench.cache_sim", *argv]),
        note="replays of recorded traces (no timing)",
    )
    print(f"recorded run {Catalogue(args.catalogue).record(run, [])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
