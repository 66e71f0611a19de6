"""What a trained router's routing does for streaming, simulated on recorded traces (no timing).

    .venv/bin/python -m bench.trained_routing TRACE [--layers 12] [--experts 128] [--chunk 512] [--json OUT]

TRACE is a routing trace (bench/routing_traces.py). It is laid on the bench-scale replay store as
`nightshift model synth --routing` lays it (engine/store/routing_trace.py's `scale`: `--layers` MoE layers of
`--experts` experts), and on that geometry this prints, beside the same figures for i.i.d. uniform random
routing on the same texts (no locality at all: the worst case):

1. next-layer guess recall: the share of a decode token's experts that a guess named, for the guesses the
   trace holds (nightshift's: layer l's router on layer l-1's MoE input; two others), beside the blind
   guess (k/E), the previous token's own experts at the same layer, and the k experts of the layer most
   used by the other texts;
2. cache policy against Belady at 10/25/50 % of expert bytes: the engine's own `ExpertCache` under each
   policy (engine/bench/cache_sim.py), the static oracle and Belady, on one review run (the month-end single
   narrative: its prompt in chunks of `--chunk` rows, then one token a step), cold and with a routing
   profile learned from the other texts (as a store's profile would be), and on every text back to back;
3. the union of experts per decode step at batch widths 1/2/4/8: the month-end split narrative's chats (the
   batch the service decodes) and different texts (every review's single narrative and the plain texts),
   decoded together step by step, with the ceiling it sets on a batch's speed-up where reads bound it
   (width x k / union: the experts read per token at width 1 over those read per token at that width);
4. for the cache, the synthetic bench model's own recorded runs too (`--bench-traces`): its random routers.

Records the figures in the run catalogue (kind `routing-sim`) unless --no-record.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Iterable
from itertools import combinations
from pathlib import Path

import numpy as np

from nightshift.engine.bench.cache_sim import BELADY, Call, load_trace, sweep
from nightshift.engine.moe.warm import RoutingProfile, counts_of
from nightshift.engine.store import routing_trace

SHARES = (0.10, 0.25, 0.50)
WIDTHS = (1, 2, 4, 8)
RUN = "month-end single"  # the review run the cache is simulated on
BATCH = "month-end "
TRACES = Path(__file__).resolve().parent.parent / "docs" / "runs" / "traces"
BENCH_TRACES = [
    TRACES / "kimi-bench-review-a-780-calls.jsonl",
    TRACES / "kimi-bench-review-b-780-calls.jsonl",
]  # the month-end split narrative's chats: "month-end summary", "month-end F1", ...


class Routing:
    """Per-token expert sets of a trace's texts on the store's geometry: (tokens, layers, k) per text."""

    def __init__(self, names: list[str], texts: list[np.ndarray], prompts: list[int], experts: int, label: str):
        self.names, self.texts, self.prompts, self.experts, self.label = names, texts, prompts, experts, label

    @property
    def k(self) -> int:
        return self.texts[0].shape[-1]

    @property
    def layers(self) -> int:
        return self.texts[0].shape[1]

    def text(self, name: str) -> int:
        return self.names.index(name)

    def decode(self, index: int) -> np.ndarray:
        return self.texts[index][self.prompts[index] :]

    def calls(self, index: int, chunk: int) -> list[Call]:
        """The layer calls a run of text `index` makes: its prompt in chunks (each expert once), then one token a
        step; layers numbered from 1 as in the store (its layer 0 is dense)."""
        text, prompt, out = self.texts[index], self.prompts[index], []
        for start in range(0, prompt, chunk):
            rows = text[start : min(prompt, start + chunk)]
            for layer in range(self.layers):
                unique, counts = np.unique(rows[:, layer], return_counts=True)
                out.append(Call(layer + 1, tuple(unique.tolist()), len(rows), tuple(counts.tolist())))
        for row in text[prompt:]:
            out += [
                Call(layer + 1, tuple(sorted(row[layer].tolist())), 1, (1,) * self.k) for layer in range(self.layers)
            ]
        return out


def trained(trace: routing_trace.RoutingTrace, experts: int, layers: int) -> tuple[Routing, dict[str, list]]:
    """The trace on the store's geometry, and its guesses on it (same shape)."""
    scaled = routing_trace.scale(trace, experts, layers)
    split = [trace.rows(s) for s in range(trace.sequences)]
    guesses = {"nightshift's (layer l's router, layer l-1's MoE input)": [scaled.guessed[r] for r in split]}
    for name, label in (("guessed_next_norm", "layer l's router and norm, residual after l-1's attention"),
                        ("guessed_after", "layer l's router and norm, residual after layer l-1")):  # fmt: skip
        if name in trace.guesses:
            other = routing_trace.scale(_with_guess(trace, name), experts, layers).guessed
            guesses[label] = [other[r] for r in split]
    routing = Routing(trace.names(), [scaled.chosen[r] for r in split], trace.prompt_tokens.tolist(), experts,
                      f"trained ({trace.meta.get('stream', '?')} stream)")  # fmt: skip
    return routing, guesses


def _with_guess(trace: routing_trace.RoutingTrace, name: str) -> routing_trace.RoutingTrace:
    return routing_trace.RoutingTrace(trace.experts, trace.k, trace.tokens, trace.offsets, trace.prompt_tokens,
                                      trace.chosen, {"guessed": trace.guesses[name]}, trace.meta)  # fmt: skip


def random_like(routing: Routing, seed: int = 0) -> Routing:
    """The same texts routed at random, k distinct experts per token and layer drawn uniformly and independently:
    no locality at all, the worst case (the synthetic bench model's random routers are skewed, see below)."""
    rng = np.random.default_rng(seed)
    texts = [np.argsort(rng.random((*t.shape[:2], routing.experts)), axis=-1)[..., : routing.k] for t in routing.texts]
    return Routing(routing.names, texts, routing.prompts, routing.experts, "i.i.d. uniform random routing")


def bench_model_table(test: Path, train: Path, experts: int) -> dict:
    """The synthetic bench model's own recorded run (`bench cache` traces: a 200-token review prompt, 64 tokens),
    replayed as `cache_table` replays one run, with a profile from its other run: its random routers' case."""
    calls, other = load_trace(test), load_trace(train)
    layers = sorted({call.layer for call in calls})
    profile = RoutingProfile().merged(counts_of((c.layer, c.experts) for c in other))
    return sweep(calls, dict.fromkeys(layers, 1), len(layers) * experts, SHARES, profile=profile)


def overlap(guess: np.ndarray, chosen: np.ndarray) -> float:
    """Mean over rows and layers of |guess & chosen| / k (rows x layers x k each)."""
    hits = (guess[..., :, None] == chosen[..., None, :]).any(axis=-1).sum(axis=-1)
    return float(hits.mean() / chosen.shape[-1])


def recall(routing: Routing, guesses: dict[str, list]) -> dict[str, float]:
    """Recall of each guess over every decode token of every text, layers 2.. of the store (the engine does not
    guess its first MoE layer); the blind guess; the previous token's experts; the other texts' most used k."""
    decode = np.concatenate([routing.decode(i)[:, 1:] for i in range(len(routing.texts))])
    out = {name: overlap(np.concatenate([g[i][routing.prompts[i] :, 1:] for i in range(len(g))]), decode)
           for name, g in guesses.items()}  # fmt: skip
    out["blind (k/E)"] = routing.k / routing.experts
    previous = [(t[p - 1 : -1, 1:], t[p:, 1:]) for t, p in zip(routing.texts, routing.prompts) if p >= 1]
    out["the previous token's own experts"] = overlap(*map(np.concatenate, zip(*previous)))
    frequent = []
    for i in range(len(routing.texts)):
        others = np.concatenate([t for j, t in enumerate(routing.texts) if j != i])
        top = [np.bincount(others[:, layer].reshape(-1), minlength=routing.experts).argsort()[::-1][: routing.k]
               for layer in range(routing.layers)]  # fmt: skip
        frequent.append(np.broadcast_to(np.stack(top)[1:], routing.decode(i)[:, 1:].shape))
    out["the other texts' most used k"] = overlap(np.concatenate(frequent), decode)
    return out


def cache_table(routing: Routing, chunk: int) -> dict[str, dict]:
    """Hit rates of every policy, the static oracle and Belady at SHARES: one run (cold, and seeded from the other
    review texts' profile) and every text back to back (cold)."""
    sizes = {layer + 1: 1 for layer in range(routing.layers)}  # one unit per expert: every expert is one size
    total = routing.layers * routing.experts
    run = routing.text(RUN)
    train = [i for i in range(len(routing.texts)) if i != run]
    profile = RoutingProfile()
    for i in train:
        profile = profile.merged(counts_of((c.layer, c.experts) for c in routing.calls(i, chunk)))
    together = [call for i in range(len(routing.texts)) for call in routing.calls(i, chunk)]
    return {
        "one run, profile from the other texts": sweep(
            routing.calls(run, chunk), sizes, total, SHARES, profile=profile
        ),
        "every text back to back": sweep(together, sizes, total, SHARES),
    }


def unions(routing: Routing, group: Iterable[int], width: int) -> float:
    """Mean union of experts per layer per decode step over every `width`-subset of `group` (steps where all are
    still decoding)."""
    sizes = []
    for subset in combinations(group, width):
        steps = min(len(routing.decode(i)) for i in subset)
        rows = np.stack([routing.decode(i)[:steps] for i in subset], axis=1)  # steps x width x layers x k
        sizes += [len(np.unique(rows[s, :, layer])) for s in range(steps) for layer in range(routing.layers)]
    return float(np.mean(sizes)) if sizes else float("nan")


def union_table(routing: Routing, limit: int = 60) -> dict[str, dict[int, float]]:
    """Unions at WIDTHS for the month-end split batch and for different reviews (at most `limit` subsets each)."""
    batch = [i for i, n in enumerate(routing.names) if n.startswith(BATCH) and n != RUN]
    texts = [i for i, n in enumerate(routing.names) if not n.startswith(BATCH) or n == RUN]
    rng = np.random.default_rng(0)
    out = {}
    for label, group in (
        ("month-end split batch", batch),
        ("different texts (reviews' single narratives, plain)", texts),
    ):
        row = {}
        for width in WIDTHS:
            if width > len(group):
                continue
            subsets = list(combinations(group, width))
            chosen = [subsets[i] for i in sorted(rng.permutation(len(subsets))[:limit])]
            row[width] = float(np.mean([unions(routing, s, width) for s in chosen]))
        out[label] = row
    return out


def of_belady(row: dict, name: str) -> float:
    """Hits of `name` as a share of Belady's from the same start (warm against warm)."""
    bound = row[BELADY + (" + warm" if name.endswith("+ warm") else "")]
    return row[name].hits / bound.hits if bound.hits else 1.0


def show_cache(label: str, table: dict) -> dict:
    """Print one sweep as a table (hit rate, and share of Belady from the same start); its figures."""
    names = list(next(iter(table.values())))
    print(f"\n{label}: hit rate (share of Belady from the same start)\n")
    print("| budget | " + " | ".join(names) + " |\n|" + "---|" * (len(names) + 1))
    rows = {}
    for share, row in table.items():
        rows[share] = {name: {"hit_rate": round(r.hit_rate, 4), "of_belady": round(of_belady(row, name), 4)}
                       for name, r in row.items()}  # fmt: skip
        print(
            f"| {share:.0%} | " + " | ".join(f"{row[n].hit_rate:.1%} ({of_belady(row, n):.0%})" for n in names) + " |"
        )
    return rows


def report(routing: Routing, guesses: dict[str, list] | None, chunk: int) -> dict:
    figures: dict = {"label": routing.label}
    print(f"\n## {routing.label}: {routing.layers} layers x {routing.experts} experts, k = {routing.k}")
    if guesses is not None:
        figures["recall"] = recall(routing, guesses)
        print("\n| next-layer guess | recall |\n|---|---|")
        for name, value in figures["recall"].items():
            print(f"| {name} | {value:.1%} |")
    figures["cache"] = {label: show_cache(label, table) for label, table in cache_table(routing, chunk).items()}
    figures["unions"] = union_table(routing)
    print("\n| batch | " + " | ".join(f"width {w}" for w in WIDTHS) + " |\n|" + "---|" * (len(WIDTHS) + 1))
    for label, row in figures["unions"].items():
        cells = [f"{row[w]:.1f} ({w * routing.k / row[w]:.2f}x)" if w in row else "-" for w in WIDTHS]
        print(f"| {label} | " + " | ".join(cells) + " |")
    return figures


def routing_arguments(doc: str) -> argparse.ArgumentParser:
    """The options of a simulation on a routing trace laid on the bench geometry (this module's, bench.cache_foresight's)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("trace", type=Path, help="a routing trace (bench/routing_traces.py)")
    parser.add_argument("--layers", type=int, default=12, help="MoE layers of the store (bench preset: 12)")
    parser.add_argument("--experts", type=int, default=128, help="experts per layer of the store (bench: 128)")
    parser.add_argument("--chunk", type=int, default=512, help="prompt rows per prefill pass (the engine's default)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--no-record", action="store_true", help="do not record the run in the run catalogue")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = routing_arguments(__doc__)
    parser.add_argument(
        "--bench-traces", type=Path, nargs=2, metavar=("TEST", "TRAIN"), default=BENCH_TRACES,
        help="two `bench cache` traces of the synthetic bench model (default: docs/runs/traces' review runs a, b)",
    )  # fmt: skip
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    trace = routing_trace.load(args.trace)
    routing, guesses = trained(trace, args.experts, args.layers)
    figures = {
        "trace": str(args.trace), "layers": routing_trace.layer_map(trace.layers, args.layers),
        "trained": report(routing, guesses, args.chunk), "random": report(random_like(routing), None, args.chunk),
    }  # fmt: skip
    print(f"\n## the synthetic bench model's random routers (its recorded run {args.bench_traces[0].name})")
    table = bench_model_table(*args.bench_traces, args.experts)
    figures["bench model"] = show_cache("one run, profile from its other run", table)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    if not args.no_record:
        from nightshift.app.paths import catalogue_file
        from nightshift.engine.instruments.catalogue import Catalogue, Run

        command = shlex.join(["python", "-m", "bench.trained_routing", *argv])
        run = Run(kind="routing-sim", model=trace.meta.get("model", "?"), config={"trace": str(args.trace),
                  "layers": args.layers, "experts": args.experts, "chunk": args.chunk}, figures=figures,
                  verdict="measured", command=command, note="simulation on recorded routing (no timing)")  # fmt: skip
        print(f"\nrecorded as run {Catalogue(catalogue_file()).record(run)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
