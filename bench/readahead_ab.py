"""Read-ahead settings side by side: one routing trace, the same decode under each arm, in turn.

    nightshift rig run -- .venv/bin/python -m bench.readahead_ab --model bench --drives RIG/drives.toml \
        --routing TRACE --tokens 12 --budgets 0.25 --caps guesses,reads,odds [--aborts off,on] [--rounds 2] \
        [--variants old=,new=load_left+spare_demand_drives]

An arm is a store, a `--prefetch-cap`, a `--prefetch-abort` and a variant (every store with every cap, abort setting
and variant; a variant names the boolean settings it turns on, `--variants`):
`--model` may name several stores of one model laid out differently (`bench replicate` on a copy of the store
directory: one replica per expert against one on every drive), so layouts alternate like settings. For each budget
(a share of the store's expert bytes, the cache under the default policy) the arms are decoded in turn, round 1 in
the order given and round 2 reversed (ABBA for two arms), each from a cold start (the store's routing profile
removed), with the compute floor measured once at the start (on the first store) as `bench cache` does. Each row:
time per token, the disk, layer and compute floors and the roofline fraction, the hit rate against the trace's
prediction, the decode's read-aheads per token (issued, used, wasted, the bytes wasted ones read; declined by the
odds; aborted) and its waits split by what the drive each layer waited on last was reading
(engine/bench/wait_split.py). Every row is recorded in the run catalogue (kind `readahead-ab`); the table is
printed as CSV too.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import nightshift.engine  # noqa: F401  (the CPU BLAS before MLX)

# isort: split
from nightshift.app.models import resolve_model
from nightshift.app.paths import catalogue_file
from nightshift.engine.bench.cache_sim import load_trace, replay
from nightshift.engine.bench.decode import decode_bench, in_ram_decode
from nightshift.engine.bench.wait_split import CLASSES
from nightshift.engine.instruments.assertions import Proof
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.io.drives import load_drives
from nightshift.engine.moe.held import held_sizes
from nightshift.engine.moe.load import with_drives
from nightshift.engine.moe.settings import PREFETCH_CAPS, StreamSettings
from nightshift.engine.moe.warm import PROFILE_FILE, profile_path
from nightshift.engine.store.manifest import read_manifest

ABORTS = {"off": False, "on": True}
COLUMNS = (
    "model", "budget", "round", "cap", "abort", "variant", "ms_per_token", "disk_floor_ms", "layer_floor_ms", "compute_floor_ms",
    "roofline_fraction", "hit_rate", "predicted_hit_rate", "mb_read_per_token", "mb_needed_per_token",
    "wait_ms_per_token", "read_ahead_per_token", "used_per_token", "wasted_per_token", "wasted_mb_per_token",
    "declined_per_token", "aborted_per_token", "spared_per_token", "wait_ms", *(f"wait_{name}_ms" for name in CLASSES),
    "placed_layer_floor_ms", "recall_pct", "read_ahead_pct", "tokens_identical", "run",
)  # fmt: skip


Arm = tuple[str, str, str, str]  # (store, cap, abort, variant)


def order(arms: list[Arm], rounds: int) -> list[tuple[int, Arm]]:
    """(round, arm) in the order run: the arms as given, then reversed, alternately (ABBA for two)."""
    return [(r + 1, arm) for r in range(rounds) for arm in (arms if r % 2 == 0 else arms[::-1])]


def row_of(share: float, round_: int, arm: Arm, result: dict, predicted: float, tokens: int) -> dict:
    """One decode's figures and its decode-only read-ahead counts, per token."""
    f, c = result["figures"], result["counters"]
    wasted_read = c["decode_wasted_prefetch_bytes"] - c["decode_aborted_prefetch_bytes"]
    return {
        "model": arm[0],
        "budget": share,
        "round": round_,
        "cap": arm[1],
        "abort": arm[2],
        "variant": arm[3],
        "ms_per_token": round(f["ms_per_token"], 1),
        "disk_floor_ms": round(f["disk_floor_ms"], 1),
        "layer_floor_ms": round(f["layer_floor_ms"], 1),
        "compute_floor_ms": round(f["compute_floor_ms"], 1),
        "roofline_fraction": round(f["roofline_fraction"], 3),
        "hit_rate": round(c["cache_hits"] / max(1, c["cache_hits"] + c["cache_misses"]), 4),
        "predicted_hit_rate": round(predicted, 4),
        "mb_read_per_token": round(f["bytes_per_token"] / 1e6, 2),
        "mb_needed_per_token": round(f["needed_bytes_per_token"] / 1e6, 2),
        "wait_ms_per_token": round(f["wait_ms_per_token"], 1),
        "read_ahead_per_token": round(c["decode_prefetch_reads"] / tokens, 2),
        "used_per_token": round(c["decode_joined_prefetch"] / tokens, 2),
        "wasted_per_token": round(c["decode_wasted_prefetch"] / tokens, 2),
        "wasted_mb_per_token": round(wasted_read / tokens / 1e6, 2),
        "declined_per_token": round(c["decode_declined_prefetch"] / tokens, 2),
        "aborted_per_token": round(c["decode_aborted_prefetch"] / tokens, 2),
        "spared_per_token": round(c["decode_spared_prefetch"] / tokens, 2),
        **{name: f[name] for name in COLUMNS if name.startswith("wait_") or name == "placed_layer_floor_ms"},
        "recall_pct": c["prefetch_recall_pct"],
        "read_ahead_pct": c["read_ahead_pct"],
        "tokens_identical": f["tokens_identical"],
    }


def parse_variants(text: str) -> dict[str, dict[str, bool]]:
    """`NAME=SETTING+SETTING,...` -> {name: {setting: True}}; an unknown or non-boolean setting is an error."""
    booleans = {f.name for f in dataclasses.fields(StreamSettings) if f.type in ("bool", bool)}
    variants = {}
    for item in text.split(","):
        name, _, on = item.partition("=")
        wanted = [s for s in on.split("+") if s]
        unknown = [s for s in wanted if s not in booleans]
        if not name or unknown:
            raise SystemExit(
                f"--variants {text!r}: give NAME=SETTING+SETTING, comma-separated, the settings boolean ones of "
                f"StreamSettings ({', '.join(unknown) or 'a name is missing'})"
            )
        variants[name] = dict.fromkeys(wanted, True)
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="stores to alternate (one model's layouts), comma-separated")
    parser.add_argument("--drives", type=Path, default=None, help="drives.toml whose roots replace the store's")
    parser.add_argument("--routing", type=Path, required=True, help="the trace `bench cache` recorded (prediction)")
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--budgets", default="0.25", help="shares of the expert bytes, comma-separated")
    parser.add_argument("--caps", default="reads,odds", help=f"caps to alternate, of {', '.join(PREFETCH_CAPS)}")
    parser.add_argument("--aborts", default="off", help="prefetch_abort settings to cross with the caps: off, on")
    parser.add_argument(
        "--variants",
        default="default=",
        help="settings to alternate beside the caps: NAME=SETTING+SETTING (the boolean settings it turns on, "
        "e.g. old=,new=load_left+spare_demand_drives), comma-separated",
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds (each after the first in reverse order)")
    parser.add_argument("--catalogue", type=Path, default=None, help="run catalogue (default: the data dir's)")
    args = parser.parse_args()
    caps, aborts = args.caps.split(","), args.aborts.split(",")
    if not caps or any(cap not in PREFETCH_CAPS for cap in caps):
        raise SystemExit(f"--caps {args.caps!r}: give caps from {', '.join(PREFETCH_CAPS)}, comma-separated")
    if any(abort not in ABORTS for abort in aborts):
        raise SystemExit(f"--aborts {args.aborts!r}: give off, on or both, comma-separated")
    variants = parse_variants(args.variants)
    stores = {name: resolve_model(name) for name in args.model.split(",")}
    arms = [(name, cap, abort, v) for name in stores for cap in caps for abort in aborts for v in variants]
    drives = load_drives(args.drives) if args.drives else None
    manifest = with_drives(read_manifest(next(iter(stores.values()))), drives)
    if any(read_manifest(store).expert_bytes != manifest.expert_bytes for store in stores.values()):
        raise SystemExit(f"--model {args.model!r}: the stores hold different experts; give layouts of one model")
    sizes = held_sizes(manifest.layers)
    calls = load_trace(args.routing)
    catalogue = Catalogue(args.catalogue or catalogue_file())
    in_ram = in_ram_decode(next(iter(stores.values())), args.tokens)  # the compute floor once, for every row
    print(f"compute floor {1000 * in_ram.seconds_per_token:.0f} ms/token", flush=True)
    rows = []
    for share in (float(s) for s in args.budgets.split(",")):
        budget = int(share * manifest.expert_bytes)
        for round_, arm in order(arms, args.rounds):
            store = stores[arm[0]]
            profile_path(store).unlink(missing_ok=True)  # a cold start, as the recipe's: no learned profile,
            (store / PROFILE_FILE).unlink(missing_ok=True)  # nor one an older nightshift learned in the store
            settings = StreamSettings(
                cache_bytes=budget, prefetch_cap=arm[1], prefetch_abort=ABORTS[arm[2]], **variants[arm[3]]
            )
            result = decode_bench(store, settings, args.tokens, drives, compute_floor=in_ram)
            predicted = replay(calls, sizes, budget, settings.cache_policy).hit_rate
            row = row_of(share, round_, arm, result, predicted, args.tokens)
            config = {**settings.as_dict(), "tokens": args.tokens, "round": round_, "trace": str(args.routing)}
            run = Run("readahead-ab", store.name, config, {**result["figures"], **row}, "measured",
                      drives=result["drives"], counters=result["counters"], command=" ".join(sys.argv),
                      note=f"stores {args.model} x caps {args.caps} x aborts {args.aborts} x variants {args.variants} alternated, budget {share:g}")  # fmt: skip
            proofs = (
                [Proof("cache", "cache_hits")]
                + [Proof("prefetch_abort", "decode_aborted_prefetch")] * (settings.prefetch_abort)
                + [Proof("spare_demand_drives", "decode_spared_prefetch")] * settings.spare_demand_drives
            )
            row["run"] = catalogue.record(run, proofs)
            rows.append(row)
            print(", ".join(f"{k} {row[k]}" for k in COLUMNS), flush=True)
    print(",".join(COLUMNS))
    for row in rows:
        print(",".join(str(row[k]) for k in COLUMNS))


if __name__ == "__main__":
    main()
