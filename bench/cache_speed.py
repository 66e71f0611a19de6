"""The expert cache's own cost: CPU a layer call to replay a recorded routing trace through `ExpertCache`, at shares
of the trace's experts, with the hits beside it (the same policy code the engine runs, so the same victims).

    .venv/bin/python -m bench.cache_speed TRACE [--policy lrfu] [--shares 0.1 0.25 0.5] [--rounds 3]

A trace is a JSON-lines routing record (`bench.cache_traces record`, docs/runs/traces/). To compare two checkouts,
run this file with the other checkout's package first on the path (its `nightshift` folder linked under a
directory given as PYTHONPATH): the replay, hits and counts are the checkout's, the timing loop this file's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from nightshift.engine.bench.cache_sim import load_trace, replay
from nightshift.engine.moe.settings import LRFU


def timed(trace: Path, policy: str, shares: list[float], rounds: int) -> list[dict]:
    """Per share: the least CPU seconds of `rounds` replays (sizes 1 an expert), per layer call, and the hits."""
    calls = load_trace(trace)
    layers = sorted({call.layer for call in calls})
    width = max(e for call in calls for e in call.experts) + 1
    rows = []
    for share in shares:
        budget = int(share * len(layers) * width)
        cpu = []
        for _ in range(rounds):
            began = time.process_time()
            result = replay(calls, dict.fromkeys(layers, 1), budget, policy)
            cpu.append(time.process_time() - began)
        rows.append({"share": share, "budget_experts": budget, "calls": len(calls), "cpu_s": min(cpu),
                     "us_per_call": min(cpu) / len(calls) * 1e6, "hit_rate": result.hits / result.lookups})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--policy", default=LRFU)
    parser.add_argument("--shares", type=float, nargs="+", default=[0.1, 0.25, 0.5])
    parser.add_argument("--rounds", type=int, default=3, help="replays a share; the least CPU is kept")
    args = parser.parse_args()
    from nightshift.app.paths import catalogue_file
    from nightshift.engine.instruments.catalogue import Catalogue, Run
    from nightshift.engine.moe import cache

    rows = timed(args.trace, args.policy, args.shares, args.rounds)
    for row in rows:
        print(f"share {row['share']:.2f}: {row['us_per_call']:7.1f} us CPU a layer call, hits {row['hit_rate']:.4f}")
    config = {"policy": args.policy, "rounds": args.rounds, "cache_module": str(Path(cache.__file__).resolve())}
    run = Run("cache-speed", args.trace.stem, config, {"rows": rows}, "measured", command=" ".join(sys.argv))
    print(f"recorded as run {Catalogue(catalogue_file()).record(run)} in {catalogue_file()}")


if __name__ == "__main__":
    main()
