"""`nightshift model tune`: a short calibration of a store's streaming settings on this machine's drives.

Each step measures the settings chosen so far (the incumbent) and a few candidates side by side: the same
short greedy decode (a one-token prompt, one warm-up token, then `tokens` timed), cache off so the drives
are what is measured; with `repeats` > 1, in alternating order, each rate the median. A candidate
replaces the incumbent only when it is more than MARGIN faster and its counters prove it ran
(joined_prefetch for prefetch, split_reads for split reads, balanced_reads for balanced reads). Steps, in
the order they matter on the rig (docs/results.md): prefetch on or off; with prefetch on, its low-recall
layers off, a prefetch limit and one prefetch thread per drive; 1 or 2 demand threads per drive instead of
4; where experts have replicas on two devices, balanced reads toggled and split reads. Then the defaults and the choice run once more, side by side, for the gain
recorded; a choice that does not beat the defaults there is dropped (kept as `rejected`). The cache
policy is chosen by replaying the chosen run's lookups against every policy at the auto budget this
machine gives the store (engine/bench/cache_sim.py: the engine's own cache class, so its hit rates are
the engine's); when that budget holds every expert the policy cannot matter.

A step that would not finish within the time budget is skipped and listed as such, never guessed.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from nightshift.engine.bench.cache_sim import Call, replay
from nightshift.engine.bench.decode import PROMPT, counters_of, drives_of, streamed_decode
from nightshift.engine.instruments.assertions import Proof, failures
from nightshift.engine.io.ceilings import Ceilings
from nightshift.engine.io.drives import Drive
from nightshift.engine.moe.budget import size_budget
from nightshift.engine.moe.held import held_expert_bytes, held_sizes
from nightshift.engine.moe.load import with_drives
from nightshift.engine.moe.settings import AUTO_BUDGET, CACHE_POLICIES, StreamSettings
from nightshift.engine.moe.tuning import tuned_values, write_tuning
from nightshift.engine.store.manifest import Manifest, read_manifest

MARGIN = 0.03  # a candidate must beat the incumbent by more than this: the rig's run-to-run spread is 1-3 %
RECALL_FLOOR = 0.3  # a layer whose prediction names under this share of its experts reads mostly waste
TUNE_PROMPT = PROMPT[:1]  # decode is what is tuned: a one-token prompt keeps the prefill's reads short


@dataclass
class Trial:
    """One measured configuration: what it changed from the defaults, its rate, and its proof counters."""

    step: str
    label: str
    changes: dict
    tokens_per_s: float
    bytes_per_token: float
    counters: dict
    drives: dict
    recall_per_layer: dict[int, float]
    seconds: float
    proofs: list[Proof]

    def unproven(self) -> list[str]:
        return failures(self.proofs, self.counters)

    def as_dict(self) -> dict:
        return {
            "step": self.step,
            "label": self.label,
            "changes": {k: sorted(v) if isinstance(v, frozenset) else v for k, v in self.changes.items()},
            "tokens_per_s": self.tokens_per_s,
            "bytes_per_token": self.bytes_per_token,
            "counters": self.counters,
            "recall_per_layer": {str(k): v for k, v in self.recall_per_layer.items()},
            "seconds": round(self.seconds, 1),
            "proven": not self.unproven(),
        }


def proofs_for(settings: StreamSettings, changes: dict) -> list[Proof]:
    """The counters that show `settings`' mechanisms fired in a decode (balanced reads only where `changes` turn
    them on: on by default they cut nothing when a layer's reads divide evenly or the drives share a device)."""
    proofs = []
    if settings.prefetch:
        proofs.append(Proof("prefetch", "joined_prefetch"))
    if settings.split_reads:
        proofs.append(Proof("split reads", "split_reads"))
    elif changes.get("balance_reads"):
        proofs.append(Proof("balanced reads", "balanced_reads"))
    return proofs


def split_possible(manifest: Manifest, in_use: list[str]) -> bool:
    """Whether some expert has replicas on two devices among the drives in use (what split reads need)."""
    device = {name: os.stat(manifest.drives[name]).st_dev for name in in_use}
    return any(
        len({device[d] for d in entry["replicas"] if d in device}) > 1
        for experts in manifest.experts.values()
        for entry in experts
    )


class Calibration:
    """The measuring loop: trials side by side, a time budget, the incumbent's changes from the defaults."""

    def __init__(
        self,
        store: Path,
        drives: list[Drive] | None,
        ceilings: Ceilings | None,
        tokens: int,
        budget_s: float,
        say: Callable[[str], None],
        use_drives: tuple[str, ...] = (),
        repeats: int = 1,
    ):
        self.store, self.drives, self.ceilings, self.tokens = Path(store), drives, ceilings, tokens
        self.repeats = repeats
        self.base = StreamSettings(cache_bytes=0, use_drives=use_drives)  # the drives are measured: no RAM cache
        self.deadline = time.monotonic() + budget_s
        self.say = say
        self.trials: list[Trial] = []
        self.skipped: list[str] = []
        self.chosen: dict = {}
        self.routing: list = []

    def settings(self, changes: dict) -> StreamSettings:
        return replace(self.base, **{**self.chosen, **changes})

    def measure(self, step: str, label: str, changes: dict, routing: bool = False) -> Trial:
        settings = self.settings(changes)
        began = time.monotonic()
        run = streamed_decode(self.store, settings, self.tokens, self.drives, self.ceilings, routing, TUNE_PROMPT)
        seconds = time.monotonic() - began
        trial = Trial(step, label, {**self.chosen, **changes}, 1 / run.timing.seconds_per_token,
                      run.read_bytes / self.tokens, counters_of(run.figures), drives_of(run.figures),
                      run.figures.recall_per_layer, seconds, proofs_for(settings, changes))  # fmt: skip
        if routing:
            self.routing = run.routing
        self.trials.append(trial)
        self.say(f"  {step}: {label}: {trial.tokens_per_s:.3f} tok/s ({seconds:.0f} s)")
        return trial

    def time_left_for(self, runs: int) -> bool:
        """Whether `runs` more trials fit in the budget (each as long as the slowest so far)."""
        longest = max((t.seconds for t in self.trials), default=0.0)
        return time.monotonic() + runs * longest <= self.deadline

    def side_by_side(self, step: str, configs: list[tuple[str, dict]], routing: str = "") -> list[list[Trial]]:
        """Each config's trials, `repeats` rounds in alternating order (A B, B A, ...) so drift favours none;
        the config labelled `routing` records its lookups."""
        trials: dict[str, list[Trial]] = {label: [] for label, _ in configs}
        for round_ in range(self.repeats):
            for label, changes in configs if round_ % 2 == 0 else configs[::-1]:
                trials[label].append(self.measure(step, label, changes, label == routing))
        return [trials[label] for label, _ in configs]

    def step(self, name: str, candidates: list[tuple[str, dict]]) -> Trial | None:
        """Measure the incumbent and each candidate side by side; keep the fastest proven one (median rate)
        beyond MARGIN. Returns the incumbent's first trial (its recall per layer), None when not measured."""
        if not candidates:
            return None
        if not self.time_left_for(self.repeats * (len(candidates) + 1)):
            self.skipped.append(name)
            self.say(f"  {name}: skipped (would not finish within the time budget)")
            return None
        incumbent, *measured = self.side_by_side(name, [("as chosen so far", {}), *candidates])
        best, best_rate = None, rate(incumbent) * (1 + MARGIN)
        for trials in measured:
            unproven = [line for t in trials for line in t.unproven()]
            if unproven:
                self.say(f"    not counted: {'; '.join(unproven)}")
            elif rate(trials) > best_rate:
                best, best_rate = trials, rate(trials)
        if best is not None:
            self.chosen = dict(best[0].changes)
        return incumbent[0]


def rate(trials: list[Trial]) -> float:
    """A configuration's rate over its trials: the median tokens/s."""
    return statistics.median(t.tokens_per_s for t in trials)


def prefetch_candidates(settings: StreamSettings, trial: Trial, top_k: int) -> list[tuple[str, dict]]:
    """With prefetch on: its low-recall layers off, a limit of a quarter of top-k, one prefetch thread."""
    low = sorted(layer for layer, recall in trial.recall_per_layer.items() if recall < RECALL_FLOOR)
    out = []
    if low and len(low) < len(trial.recall_per_layer):
        out.append((f"prefetch off for layers {low} (recall < {RECALL_FLOOR:.0%})", {"prefetch_off": frozenset(low)}))
    out.append((f"prefetch limit {max(1, top_k // 4)}", {"prefetch_limit": max(1, top_k // 4)}))
    if settings.prefetch_threads != 1:
        out.append(("1 prefetch thread per drive", {"prefetch_threads": 1}))
    return out


def choose_cache_policy(calibration: Calibration, manifest: Manifest, in_use: list[str]) -> dict:
    """Replay the chosen run's lookups against every policy at this machine's auto budget for the store."""
    settings = calibration.settings({})
    threads = (settings.demand_threads + settings.prefetch_threads) * len(in_use)
    budget = size_budget(AUTO_BUDGET, manifest, calibration.store, threads).bytes
    calls = [Call(layer, tuple(experts), rows, tuple(counts)) for layer, experts, rows, counts in calibration.routing]
    record, best = policy_record(calls, manifest, budget, settings.cache_policy)
    if best is not None:
        calibration.chosen["cache_policy"] = best
    return record


def policy_record(calls: list[Call], manifest: Manifest, budget: int, default: str) -> tuple[dict, str | None]:
    """What replaying `calls` at `budget` says (the record's `cache_policy`) and the policy to choose, None to keep
    `default`. Sizes and the budget that holds every expert count what the cache holds (engine/moe/held.py), not
    the padded files."""
    every, sizes = held_expert_bytes(manifest), held_sizes(manifest.layers)
    hits = {policy: replay(calls, sizes, budget, policy).hit_rate for policy in CACHE_POLICIES}
    record = {"auto_budget_bytes": budget, "held_expert_bytes": every, "lookups": len(calls),
              "hit_rate": {p: round(h, 4) for p, h in hits.items()}}  # fmt: skip
    if budget >= every:
        record["why"] = "the auto budget holds every expert: no policy evicts, so the default stays"
        return record, None
    best = max(CACHE_POLICIES, key=lambda p: (hits[p], p == default))
    record["why"] = f"{best}: highest hit rate replaying this run's lookups at the auto budget"
    return record, best if hits[best] > hits[default] else None


def tune(
    store: Path,
    drives: list[Drive] | None = None,
    ceilings: Ceilings | None = None,
    tokens: int = 6,
    budget_s: float = 300.0,
    say: Callable[[str], None] = print,
    use_drives: tuple[str, ...] = (),
    repeats: int = 1,
) -> dict:
    """Calibrate the store's streaming settings on `drives` (default: the store's own; `use_drives`: only
    those), keep the record in tuning.json next to its manifest, and return it."""
    began = time.monotonic()
    manifest = with_drives(read_manifest(store), drives)
    in_use = list(use_drives) or list(manifest.drives)
    top_k = int(manifest.config.get("num_experts_per_tok") or manifest.config.get("num_experts_per_token") or 1)
    cal = Calibration(store, drives, ceilings, tokens, budget_s, say, tuple(use_drives), repeats)
    first = cal.step("prefetch", [("prefetch off", {"prefetch": False})])
    if first is not None and cal.settings({}).prefetch:
        cal.step("prefetch details", prefetch_candidates(cal.settings({}), first, top_k))
    threads = [(f"{n} demand thread(s) per drive", {"demand_threads": n}) for n in (1, 2)]
    cal.step("demand threads", [c for c in threads if c[1]["demand_threads"] != cal.settings({}).demand_threads])
    if split_possible(manifest, in_use):
        balance = not cal.settings({}).balance_reads
        cal.step("reads in parts", [(f"balanced reads {'on' if balance else 'off'}", {"balance_reads": balance}),
                                    ("split reads", {"split_reads": True})])  # fmt: skip
    undo = {k: getattr(cal.base, k) for k in cal.chosen}
    defaults, tuned = map(rate, cal.side_by_side("gain", [("defaults", undo), ("tuned", {})], routing="tuned"))
    measured = tuned / defaults - 1  # with nothing chosen, both runs were the defaults: the spread of one setting
    gain, rejected = (measured if cal.chosen else 0.0), None
    if cal.chosen and gain <= 0:  # the steps' choice lost in the side-by-side check: the defaults stay
        base = tuned_values(cal.base)
        rejected = {"settings": {k: v for k, v in tuned_values(cal.settings({})).items() if v != base[k]}, "gain": gain}
        say(f"  the choice {rejected['settings']} measured {gain:+.1%} against the defaults: the defaults stay")
        cal.chosen, gain = {}, 0.0
    cache = choose_cache_policy(cal, manifest, in_use)
    record = {
        "tuned_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "drives": {name: manifest.drives[name] for name in in_use},
        "drives_in_use": in_use,
        "all_drives": set(in_use) == set(manifest.drives),
        "settings": tuned_values(cal.settings({})),
        "gain": gain,
        "measured": measured,
        "rejected": rejected,
        "defaults_tokens_per_s": defaults,
        "tuned_tokens_per_s": tuned,
        "tokens": tokens,
        "repeats": repeats,
        "margin": MARGIN,
        "cache_policy": cache,
        "trials": [t.as_dict() for t in cal.trials],
        "skipped": cal.skipped,
        "seconds": round(time.monotonic() - began, 1),
    }
    record["path"] = str(write_tuning(store, record))
    return record
