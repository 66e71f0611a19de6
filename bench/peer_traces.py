"""The expert caches of bench/streaming_peers.py's engines replayed on the same routing traces, with Belady's optimum.

Each engine's cache hit rate is counted on its own run, and the runs route differently (each engine's numerics pick
other experts now and then). Here every trace a run wrote (nightshift's, and nunspark's own `--expert-trace`) is
replayed through the same simulator (engine/bench/cache_sim.py) at each budget: nightshift's policy (`frequency`),
LRU (what nunspark's piece cache and a page cache do), the static oracle and Belady. So "nightshift's policy on
nunspark's trace" and "Belady on nightshift's trace" are on one footing. For a trace with decode passes (one-row
calls) it also prints the bytes LRU and `lrfu` read a decode pass, and the least any policy can (`decode_reads`,
`decode_reads_floor`): what a cache of that size can do for a disk-bound decode.

    python -m bench.peer_traces STORE TRACE... [--shares 0.1,0.25,0.5] [--catalogue PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nightshift.app.paths import catalogue_file
from nightshift.engine.bench.cache_sim import BELADY, Call, decode_reads, decode_reads_floor, sweep
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.moe.held import held_sizes
from nightshift.engine.moe.settings import LRFU, LRU
from nightshift.engine.store.manifest import read_manifest


def load_any(path: Path) -> list[Call]:
    """A trace in nightshift's format (layer, experts, rows) or nunspark's (layer, fired, batch_tokens)."""
    calls = []
    for line in path.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            experts = d["experts"] if "experts" in d else d["fired"]
            counts = tuple(d["counts"]) if "counts" in d else None  # nightshift's: its lookups' weights under lrfu
            calls.append(Call(d["layer"], tuple(sorted(experts)), d.get("rows", d.get("batch_tokens", 1)), counts))
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", type=Path, help="the nightshift store (its expert sizes set the budgets)")
    parser.add_argument("traces", type=Path, nargs="+")
    parser.add_argument("--shares", default="0.1,0.25,0.5")
    parser.add_argument("--catalogue", type=Path)
    args = parser.parse_args()
    manifest = read_manifest(args.store)
    sizes = held_sizes(manifest.layers)
    shares = tuple(float(s) for s in args.shares.split(","))
    catalogue = Catalogue(args.catalogue or catalogue_file())
    for path in args.traces:
        calls = load_any(path)
        table = sweep(calls, sizes, manifest.expert_bytes, shares)
        names = list(next(iter(table.values())))
        print(f"{path.name}: {len(calls)} layer calls")
        print("| budget | " + " | ".join(names) + " |")
        for share, row in table.items():
            print(f"| {share:.0%} | " + " | ".join(f"{row[name].hit_rate:.1%}" for name in names) + " |")
        figures = {f"{name} {share:g}": round(r.hit_rate, 4) for share, row in table.items() for name, r in row.items()}
        if any(call.rows == 1 for call in calls):
            print("| budget | MB | decode MB a pass: lru | lrfu | any policy, at least |")
            for share, row in table.items():  # the sweep's whole-trace replays, less the prompt's
                read = [decode_reads(calls, sizes, row[p]) for p in (LRU, LRFU)]
                read.append(decode_reads_floor(calls, sizes, row[BELADY]))
                budget = row[BELADY].budget
                print(f"| {share:.1%} | {budget / 1e6:.0f} | " + " | ".join(f"{r / 1e6:.1f}" for r in read) + " |")
                figures |= {
                    f"decode MB {name} {share:g}": round(r / 1e6, 2) for name, r in zip(("lru", LRFU, "floor"), read)
                }
        run = Run("peer-traces", args.store.name, {"trace": str(path), "calls": len(calls)}, figures, "measured",
                  command=" ".join(sys.argv), note="replay of a recorded trace (no timing)")  # fmt: skip
        print(f"recorded run {catalogue.record(run)}")


if __name__ == "__main__":
    main()
