"""How much of Belady an expert cache can reach with a forecast of its lookups, and with none (no timing).

    .venv/bin/python -m bench.cache_foresight TRACE [--peer-trace JSONL ...] [--layers 12] [--experts 128]

Belady knows every future lookup; `lrfu` (the engine's default) knows none. Between them, the engine's own cache
class replayed with a forecast of part of the future: an expert the forecast names for a coming lookup outranks
every expert it does not (soonest first, as Belady ranks), the rest keep their `lrfu` order. Forecasts:

- the rest of the token, exact: every later layer's experts of the token being decoded (what a perfect next-layer
  guess, and a perfect guess of every layer after it, would give; the engine's guess names 68 % of the next one);
- each layer's next call, exact (one token of foresight), or named with recall r: r of its experts and as many
  others drawn at random (an oracle forecast of the next token, blurred to what a real one might reach);
- a forecast learned from history alone (`Learned`): a logistic regression of "looked up at the layer's next call" on
  recency and decayed counts, fitted on other texts and replayed on held-out ones, scoring the cache's victims;
  with, per trace, how much of the next token's experts it names (its top k), beside the previous token's own.

On held-out review runs of the trained-routing traces (laid on the bench geometry, as bench.trained_routing lays
them) and on recorded traces of other models (`--peer-trace`, JSON lines of engine/bench/cache_sim.py). Records the
figures in the run catalogue (kind `cache-foresight`) unless --no-record.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.trained_routing import SHARES, routing_arguments, trained
from nightshift.engine.bench.cache_sim import Call, belady, load_trace, replay
from nightshift.engine.moe.cache import ExpertCache, Key
from nightshift.engine.moe.settings import LRFU
from nightshift.engine.store import routing_trace

FORESEEN = 1e9  # a forecast expert scores this less its position: above every lrfu score (log2 of a decayed count)
TEST = ("month-end single", "month-end summary", "weekly single", "daily single")  # held-out review runs
TRAIN = ("beancount single", "camt053 single", "mt940 single", "ofx single")  # the learned forecast's texts
RECALLS = (0.5, 0.7, 0.9)
DECAYS = (1.0, 0.3, 0.1, 0.03)  # the learned forecast's decayed counts: halvings per call of the layer
HISTORY = 4  # the learned forecast's recency bits: looked up at each of the layer's last HISTORY calls


class Foreseeing(ExpertCache[None]):
    """The engine's `lrfu` cache whose eviction and admission also see `foreseen`: {key: position of its next
    lookup} for the experts a forecast names; those outrank the rest, the soonest first."""

    def __init__(self, budget: int):
        super().__init__(budget, LRFU)
        self.foreseen: dict[Key, int] = {}

    _victim = ExpertCache._least_scored

    def _score(self, key: Key) -> float:
        position = self.foreseen.get(key)
        return super()._score(key) if position is None else FORESEEN - position


Forecast = Callable[[int], dict[Key, int]]  # position c -> {key: position of its lookup} for the keys it names


def next_calls(calls: list[Call]) -> list[dict[int, int]]:
    """Per position c: {layer: position of that layer's first call after c}."""
    ahead: dict[int, int] = {}
    out: list[dict[int, int]] = [{}] * len(calls)
    for c in range(len(calls) - 1, -1, -1):
        out[c] = dict(ahead)
        ahead[calls[c].layer] = c
    return out


def rest_of_token(calls: list[Call]) -> Forecast:
    """The exact lookups of the calls after c up to the next call of the first layer (the token being decoded)."""
    first = min(call.layer for call in calls)
    ends, end = [0] * len(calls), len(calls)
    for c in range(len(calls) - 1, -1, -1):
        ends[c] = end
        end = c if calls[c].layer == first else end
    return lambda c: {(calls[j].layer, e): j for j in range(c + 1, ends[c]) for e in calls[j].experts}


def next_call(calls: list[Call], recall: float, experts: int, seed: int = 0) -> Forecast:
    """Each layer's next call named with `recall`: that share of its experts, and as many others at random."""
    rng = np.random.default_rng(seed)
    named = []
    for call in calls:
        keep = round(recall * len(call.experts))
        right = rng.choice(call.experts, keep, replace=False).tolist()
        others = np.setdiff1d(np.arange(experts), call.experts)
        named.append(right + rng.choice(others, min(len(call.experts) - keep, len(others)), replace=False).tolist())
    ahead = next_calls(calls)
    return lambda c: {(layer, e): j for layer, j in ahead[c].items() for e in named[j]}


def foreseen_replay(calls: list[Call], budget: int, forecast: Forecast) -> float:
    """Hit rate of the `lrfu` cache over `calls` (sizes 1), the forecast at each call in view; `replay`'s loop."""
    cache = Foreseeing(budget)
    for c, call in enumerate(calls):
        missing = [e for e in call.experts if (call.layer, e) not in cache]
        cache.look_up(call.layer, call.experts, call.shares)
        cache.foreseen = forecast(c)
        for expert in missing:
            cache.put((call.layer, expert), None, 1)
    return cache.hits / (cache.hits + cache.misses)


class Learned(ExpertCache[None]):
    """The `lrfu` cache (admission, weights) ranking by a learned probability of the key's lookup at its layer's
    next call: a logistic regression on the key's recency bits, log decayed counts and its layer's persistence."""

    def __init__(self, budget: int, weights: np.ndarray | None = None):
        super().__init__(budget, LRFU)
        self.weights = weights
        self.state: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # layer -> (recency bits, decayed counts)
        self.persist: dict[int, float] = {}  # layer -> running share of a call's experts also in the call before
        self.logit: dict[int, np.ndarray] = {}

    def observe(self, layer: int, experts: tuple[int, ...], shares: list[float] | None, width: int) -> np.ndarray:
        """Count one call of `layer`; its experts' features (width x features) after it."""
        bits, counts = self.state.get(layer, (np.zeros(width, np.int64), np.zeros((len(DECAYS), width))))
        chosen = np.asarray(experts)
        if layer in self.state:
            before = bits[chosen] & 1
            self.persist[layer] = 0.9 * self.persist.get(layer, 0.5) + 0.1 * float(before.mean())
        used = np.zeros(width, np.int64)
        used[chosen] = 1
        bits = ((bits << 1) | used) & ((1 << HISTORY) - 1)
        counts = counts * 2.0 ** -np.asarray(DECAYS)[:, None]
        counts[:, chosen] += 1.0 if shares is None else np.asarray(shares)
        self.state[layer] = (bits, counts)
        persist = np.full(width, self.persist.get(layer, 0.5))
        recent = [(bits >> k) & 1 for k in range(HISTORY)]
        features = np.stack([np.ones(width), *recent, *np.log1p(counts), persist, persist * recent[0]], axis=1)
        if self.weights is not None:
            self.logit[layer] = features @ self.weights
        return features

    _victim = ExpertCache._least_scored

    def _score(self, key: Key) -> float:
        return float(self.logit[key[0]][key[1]]) if self.weights is not None else super()._score(key)


def fit(calls_per_text: list[list[Call]], experts: int, l2: float = 1e-3, rounds: int = 25) -> np.ndarray:
    """The learned forecast's weights: features after each call of a layer, labelled by the layer's next call."""
    rows, labels = [], []
    for calls in calls_per_text:
        model, last = Learned(0), {}
        for call in calls:
            if call.layer in last:
                label = np.zeros(experts)
                label[list(call.experts)] = 1
                rows.append(last[call.layer])
                labels.append(label)
            last[call.layer] = model.observe(call.layer, call.experts, call.shares, experts)
    x, y = np.concatenate(rows), np.concatenate(labels)
    w = np.zeros(x.shape[1])
    for _ in range(rounds):  # Newton's method on the L2-regularised log loss
        p = 1 / (1 + np.exp(-x @ w))
        hessian = (x * (p * (1 - p))[:, None]).T @ x + l2 * np.eye(len(w))
        w -= np.linalg.solve(hessian, x.T @ (p - y) + l2 * w)
    return w


def learned_replay(calls: list[Call], budget: int, weights: np.ndarray, experts: int) -> float:
    cache = Learned(budget, weights)
    for call in calls:
        missing = [e for e in call.experts if (call.layer, e) not in cache]
        cache.look_up(call.layer, call.experts, call.shares)
        cache.observe(call.layer, call.experts, call.shares, experts)
        for expert in missing:
            cache.put((call.layer, expert), None, 1)
    return cache.hits / (cache.hits + cache.misses)


def recall(calls: list[Call], weights: np.ndarray, experts: int) -> dict[str, float]:
    """Over decode steps, the share of a layer's experts that its previous call chose, and that the learned
    forecast's top k (k: the call's experts) named after the previous call: what history can say of the next token."""
    model, before = Learned(0, weights), {}
    named = previous = total = 0
    for call in calls:
        chosen = set(call.experts)
        if call.layer in before and call.rows == 1:
            logit, last = before[call.layer]
            named += len(chosen & set(np.argsort(-logit)[: len(chosen)].tolist()))
            previous += len(chosen & last)
            total += len(chosen)
        model.observe(call.layer, call.experts, call.shares, experts)
        before[call.layer] = (model.logit[call.layer], chosen)
    return {"learned top k": round(named / total, 4), "previous call's experts": round(previous / total, 4)}


def table(calls: list[Call], experts: int, weights: np.ndarray) -> dict[str, dict[str, float]]:
    """{share: {row: hit rate as a share of Belady's}} at SHARES of the trace's layers x experts (sizes 1)."""
    sizes = {call.layer: 1 for call in calls}
    forecasts = {"rest of the token, exact": rest_of_token(calls)}
    forecasts |= {f"next call, recall {r:.0%}": next_call(calls, r, experts) for r in RECALLS}
    forecasts["next call, exact (one token of foresight)"] = next_call(calls, 1.0, experts)
    out = {}
    for share in SHARES:
        budget = int(share * len(sizes) * experts)
        bound = belady(calls, sizes, budget).hit_rate
        row = {"belady hit rate": bound, "lrfu": replay(calls, sizes, budget, LRFU).hit_rate / bound}
        row["learned from history"] = learned_replay(calls, budget, weights, experts) / bound
        row |= {name: foreseen_replay(calls, budget, forecast) / bound for name, forecast in forecasts.items()}
        out[f"{share:g}"] = {name: round(value, 4) for name, value in row.items()}
    return out


def show(label: str, rows: dict[str, dict[str, float]]) -> None:
    shares = {share: row for share, row in rows.items() if share != "recall"}
    names = list(next(iter(shares.values())))
    print(f"\n{label}: share of Belady's hits (Belady's hit rate in the first column)\n")
    print("| budget | " + " | ".join(names) + " |\n|" + "---|" * (len(names) + 1))
    for share, row in shares.items():
        cells = [f"{row[n]:.1%}" for n in names]
        print(f"| {float(share):.0%} | " + " | ".join(cells) + " |", flush=True)
    print(
        "\nof the next token's experts per layer, named by: "
        + ", ".join(f"{n} {v:.1%}" for n, v in rows["recall"].items())
    )


def main(argv: list[str] | None = None) -> int:
    parser = routing_arguments(__doc__)
    parser.add_argument("--peer-trace", type=Path, nargs="*", default=[], help="recorded cache traces (JSON lines)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    trace = routing_trace.load(args.trace)
    routing, _ = trained(trace, args.experts, args.layers)
    weights = fit([routing.calls(routing.text(name), args.chunk) for name in TRAIN], args.experts)
    print(f"learned forecast fitted on {', '.join(TRAIN)}: weights {np.round(weights, 3).tolist()}")
    figures: dict = {"train": list(TRAIN), "weights": weights.round(4).tolist()}
    for name in TEST:
        calls = routing.calls(routing.text(name), args.chunk)
        figures[name] = table(calls, args.experts, weights) | {"recall": recall(calls, weights, args.experts)}
        show(f"trained routing, {name}", figures[name])
    for path in args.peer_trace:
        calls = load_trace(path)
        experts = 1 + max(max(call.experts) for call in calls)
        figures[str(path)] = table(calls, experts, weights) | {"recall": recall(calls, weights, experts)}
        show(str(path), figures[str(path)])
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    if not args.no_record:
        from nightshift.app.paths import catalogue_file
        from nightshift.engine.instruments.catalogue import Catalogue, Run

        config = {"trace": str(args.trace), "peer_traces": [str(p) for p in args.peer_trace], "layers": args.layers,
                  "experts": args.experts, "chunk": args.chunk}  # fmt: skip
        run = Run(kind="cache-foresight", model=trace.meta.get("model", "?"), config=config, figures=figures,
                  verdict="measured", command=shlex.join(["python", "-m", "bench.cache_foresight", *argv]),
                  note="replays of recorded routing with forecasts of it (no timing)")  # fmt: skip
        print(f"\nrecorded as run {Catalogue(catalogue_file()).record(run)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
