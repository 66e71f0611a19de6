"""How a decode's demand reads spread over the drives, pass by pass, on each layout of one model (untimed).

    nightshift rig run -- .venv/bin/python -m bench.demand_spread --model bench-replay,bench-replay-rep4 \
        --drives RIG/drives.toml --tokens 6 --budget 0.5 --mbps 12

For each store, one streamed greedy decode (default settings, the cache at `--budget` of the expert bytes), then
over the timed tokens' passes that read anything on demand, per token: the demand MB, the busiest drive's share
of each pass's demand bytes at `--mbps` (`max_drive_s`) against the same bytes shared evenly over every drive
(`even_s`), the drives a pass's demand reads used, from the first demand read's start to the last one's end, the
spread of the drives' last demand-read ends, when the last demand read started against the pass's ask (the start of
its wait; negative: before it), and the drives busy with a read-ahead at the ask. A pass's demand reads are the drive reads of its layer
asked on demand that started after the pass began (they are placed before the pass's wait is marked, so the
wait's start would miss the first). Where `max_drive_s` exceeds `even_s`, the reads were not shared out; where
the time from first start to last end exceeds `max_drive_s`, something besides the drive's bandwidth held them.
Printed, not recorded: a diagnosis.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import nightshift.engine  # noqa: F401  (the CPU BLAS before MLX)

# isort: split
from nightshift.app.models import resolve_model
from nightshift.engine.bench.decode import streamed_decode
from nightshift.engine.instruments.trace import DEMAND, PREFETCH, DriveRead, PassTrace
from nightshift.engine.io.drives import load_drives
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.store.manifest import read_manifest


def spread(passes: list[PassTrace], reads: list[DriveRead], drives: int, drive_bandwidth: float) -> dict[str, float]:
    """The module docstring's sums over `passes` (seconds, MB, counts), of the demand reads each one waited on."""
    out: dict[str, float] = defaultdict(float)
    for p in passes:
        end = p.asked + p.wait_s
        mine = [r for r in reads if r.layer == p.layer and r.source == DEMAND and p.began <= r.start <= end]
        if not mine:
            continue
        first = min(r.start for r in mine)
        per_drive: dict[str, int] = defaultdict(int)
        last_end: dict[str, float] = defaultdict(float)
        for r in mine:
            per_drive[r.drive] += r.nbytes
            last_end[r.drive] = max(last_end[r.drive], r.end)
        total = sum(per_drive.values())
        out["passes"] += 1
        out["demand_mb"] += total / 1e6
        out["max_drive_s"] += max(per_drive.values()) / drive_bandwidth
        out["even_s"] += total / drive_bandwidth / drives
        out["drives_used"] += len(per_drive)
        out["first_start_to_last_end_s"] += max(last_end.values()) - first
        out["drive_end_spread_s"] += max(last_end.values()) - min(last_end.values())
        out["last_start_delay_s"] += max(r.start for r in mine) - p.asked
        out["read_ahead_drives_at_ask"] += len(
            {r.drive for r in reads if r.source == PREFETCH and r.start < p.asked < r.end}
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="stores (layouts of one model), comma-separated")
    parser.add_argument("--drives", type=Path, default=None, help="drives.toml whose roots replace the store's")
    parser.add_argument("--tokens", type=int, default=6)
    parser.add_argument("--budget", type=float, default=0.5, help="the cache, a share of the expert bytes")
    parser.add_argument("--mbps", type=float, required=True, help="one drive's read limit, MB/s (the rig's)")
    args = parser.parse_args()
    drives = load_drives(args.drives) if args.drives else None
    for name in args.model.split(","):
        store = resolve_model(name)
        manifest = read_manifest(store)
        run = streamed_decode(store, StreamSettings(cache_bytes=int(args.budget * manifest.expert_bytes)),
                              args.tokens, drives)  # fmt: skip
        passes = run.passes[-args.tokens * len(manifest.layers) :]  # the timed tokens'
        sums = spread(passes, run.drive_reads, len(manifest.drives), args.mbps * 1e6)
        print(f"{name}: {sums.pop('passes') / args.tokens:.1f} passes a token read on demand; a token: "
              + "; ".join(f"{key} {value / args.tokens:.3f}" for key, value in sums.items()), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
