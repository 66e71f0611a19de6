"""What `serve --hosts` pays per run, and a batch of chats over the pipeline against one process, in one run.

Run inside the rig's cgroup (each rank reads its own throttled drives), after the setup of
docs/results.md's "Pipeline over hosts (issue [16])":

    nightshift rig run -- .venv/bin/python -m bench.serve_hosts --one ONE --two TWO --hosts HOSTS_JSON \
        --single-drives rig0,rig1 [--tokens 12] [--width 2]

1. Start cost. The service keeps one process's model loaded between runs; over hosts the ranks are
   launched for each narrative (engine/distributed/model.py). Printed: one process's open time (what a
   kept model saves once), each rank's seconds from launch to ready (start, imports, the trunk's load,
   the ring's connect: what every run over hosts pays), and the whole generation's wall time.
2. Batching ([15]) over the pipeline: `width` chats answered as one batch by one process (2 drives) and by
   the pipeline (2 ranks x 2 drives), against one chat alone in one process; aggregate decode tok/s.
   In mlx-lm's pipeline a batch's rows cross the ranks together (one micro-batch: the ranks still take
   turns), so batching shares reads in both, and the pipeline adds drives but not concurrency.

Greedy texts are checked equal between the two batches. Runs go into the run catalogue (kind `pipeline`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from nightshift.app.paths import catalogue_file
from nightshift.engine.distributed.hosts import load_hosts
from nightshift.engine.distributed.model import ClusterModel
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.io.drives import Drive
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import open_model
from nightshift.engine.store.manifest import read_manifest

CHATS = [
    [{"role": "user", "content": "Summarise the month's payments in one paragraph."}],
    [{"role": "user", "content": "Which supplier was paid twice, and by how much?"}],
    [{"role": "user", "content": "List the three largest refunds."}],
    [{"role": "user", "content": "Was anything paid on a weekend?"}],
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", required=True, type=Path, help="the store placed on the single process's drives")
    parser.add_argument("--two", required=True, type=Path, help="the store placed with model place --hosts")
    parser.add_argument("--hosts", required=True, type=Path, help="hosts.json of the pipeline")
    parser.add_argument("--single-drives", required=True, help="the single process's drives, e.g. rig0,rig1")
    parser.add_argument("--tokens", type=int, default=12, help="tokens per answer (12)")
    parser.add_argument("--width", type=int, default=2, choices=range(2, len(CHATS) + 1), help="chats per batch (2)")
    parser.add_argument("--note", default="", help="kept with the runs in the catalogue")
    args = parser.parse_args()
    chats = CHATS[: args.width]

    manifest = read_manifest(args.one)
    began = time.perf_counter()
    one = open_model(
        args.one,
        stream=StreamSettings(cache_bytes=0),
        drives=[Drive(name, Path(manifest.drives[name])) for name in args.single_drives.split(",")],
    )
    open_s = time.perf_counter() - began
    try:
        alone = one.generate_batch(chats[:1], args.tokens)
        together = one.generate_batch(chats, args.tokens)
    finally:
        one.close()

    cluster = ClusterModel(args.two, load_hosts(args.hosts), memory_budget=0)
    began = time.perf_counter()
    over = cluster.generate_batch(chats, args.tokens)
    wall_s = time.perf_counter() - began
    ready = [r["ready_s"] for r in cluster.last.ranks]

    same = [p.text for p in over.parts] == [p.text for p in together.parts]
    rates = {
        "one_process_1_chat_tok_s": alone.stats.decode_tokens_per_s,
        f"one_process_{args.width}_chats_tok_s": together.stats.decode_tokens_per_s,
        f"pipeline_{args.width}_chats_tok_s": over.stats.decode_tokens_per_s,
    }
    base = rates["one_process_1_chat_tok_s"]
    print(f"start: one process opens the model in {open_s:.2f} s (once, kept loaded by the service)")
    print(
        "start over hosts, every run: ranks ready after "
        + ", ".join(f"rank {r} {s:.2f} s" for r, s in enumerate(ready))
        + f"; the whole batch took {wall_s:.2f} s, of which decode {over.stats.decode_seconds:.2f} s and "
        f"prefill {over.stats.prefill_seconds:.2f} s"
    )
    for name, rate in rates.items():
        print(f"{name}: {rate:.3f} tok/s ({rate / base:.2f}x one chat alone)")
    print(f"texts of the two batches identical: {same}")

    catalogue = Catalogue(catalogue_file())
    command = " ".join(sys.argv)
    catalogue.record(
        Run(
            "pipeline",
            args.two.name,
            {
                "tokens": args.tokens,
                "width": args.width,
                "memory_budget": 0,
                "ranks": len(cluster.hosts),
                "drives": args.single_drives,
                "shape": "serve --hosts: start cost and a batch over the pipeline",
            },
            {
                **rates,
                "one_process_open_s": open_s,
                "rank_ready_s": max(ready),
                "pipeline_batch_wall_s": wall_s,
                "texts_identical": same,
            },
            "measured",
            drives=over.generation.drive_bytes,
            command=command,
            note=args.note,
        )
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
