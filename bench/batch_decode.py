"""Batched decoding on a streamed store: aggregate tok/s at widths 1, 2, 4, 8, and the union each step read.

    nightshift rig run -- .venv/bin/python -m bench.batch_decode --model bench [--widths 2,4,8] [--tokens 6]
        [--replay-from N]

Every prompt is first decoded alone (width 1) with the barrier trace on: its time is the width-1 figure and
its trace says which experts each of its decode steps selected per layer. A batch of width B then decodes the
first B prompts together; the union predicted for it is, per step and layer, the size of the union of the B
solo selections, and the union measured is the experts its layer calls selected (each read once). Runs with
no RAM cache, so every step reads from the drives. Recorded in the run catalogue (kind `batch-decode`).

Where the time goes, per decode step and width, from the same run's barrier trace: the readback stall before
each router (the trunk's compute, and the experts' compute still queued from the layer before: experts are
queued on MLX's stream as they land and computed there beside the reads), the time queueing the experts, the
next-layer guess, and the wait for reads (with the experts' compute running beside it); beside them the disk
floor (bytes the step read over the drives' aggregate bandwidth, probed first) and the two ceilings of the
ratio to width 1: W x experts(1) / union(W) (the routing, on drives alone) and W x compute(1) / compute(W)
(this CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import nightshift.engine  # noqa: F401  (the CPU BLAS before MLX)

# isort: split
from nightshift.app.models import resolve_model
from nightshift.app.paths import catalogue_file, drives_file
from nightshift.engine.batch import batch_tokens
from nightshift.engine.bench.decode import measure_bandwidth, needed_bytes
from nightshift.engine.generation import BatchStats
from nightshift.engine.instruments.assertions import Proof
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.instruments.trace import PassTrace
from nightshift.engine.io.drives import load_drives
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import Model
from nightshift.engine.store.upkeep import calibration_prompts


def timed_batch(model: Model, prompts: list[list[int]], tokens: int) -> tuple[BatchStats, list[PassTrace]]:
    """Decode `prompts` together; the batch's stats and its decode steps' passes (the prompts' left out)."""
    began = model.stream.trace.now()
    stats = BatchStats(width=len(prompts))
    batch_tokens(model.model, prompts, tokens, model.stream, stats=stats)
    decode_began = began + stats.prefill_seconds
    return stats, [p for p in model.stream.trace.passes() if p.began >= decode_began]


def where_time_goes(stats: list[BatchStats], passes: list[list[PassTrace]], bandwidth: float) -> dict[str, float]:
    """Seconds per decode step: measured, readback stalls, queueing experts, guessing, waiting on reads, disk
    floor; compute_s counts what the layer thread spent outside the wait (expert compute beside it is not in it)."""
    steps = sum(s.steps for s in stats)
    flat = [p for run in passes for p in run]
    trunk, experts = sum(p.readback_s for p in flat), sum(p.expert_s for p in flat)
    guess, wait = sum(p.predict_s for p in flat), sum(p.wait_s for p in flat)
    read = sum(needed_bytes(run, 0.0) for run in passes)
    return {
        "step_s": sum(s.decode_seconds for s in stats) / steps,
        "trunk_s": trunk / steps,
        "experts_s": experts / steps,
        "guess_s": guess / steps,
        "read_wait_s": max(wait - experts, 0.0) / steps,  # the layer thread waiting on reads
        "compute_s": (trunk + experts + guess) / steps,
        "mb_per_step": read / steps / 1e6,
        "disk_floor_s": read / steps / bandwidth,
    }


def replay_from(model: Model, first: int) -> None:
    """A model whose routers replay recorded routing (kimi_k3_replay) takes the recorded sequences in turn, one
    per fresh cache: start its next sequence at `first`, so that a batch of B replays the very sequences its first
    B prompts replayed alone (and the union predicted from them is the batch's). Other models: nothing."""
    restart = getattr(model.model, "restart_replay", None)
    if restart is not None:
        restart(first)


def solo_selections(
    model: Model, prompt: list[int], tokens: int, index: int = 0
) -> tuple[BatchStats, list[PassTrace], list[dict]]:
    """Decode `prompt` (the `index`-th) alone; its stats, decode passes and, per decode step, the experts each
    layer selected."""
    replay_from(model, index)
    stats, decode = timed_batch(model, [prompt], tokens)
    layers = len(model.stream.manifest.layers)
    steps: list[dict[int, set[int]]] = [{} for _ in range(len(decode) // layers)]
    for i, p in enumerate(decode[: len(steps) * layers]):
        steps[i // layers][p.layer] = {r.expert for r in p.reads}
    return stats, decode, steps


def predicted_union(selections: list[list[dict[int, set[int]]]]) -> float:
    """Mean over steps and layers of the union of the sequences' solo selections."""
    sizes = [
        len(set().union(*(seq[step][layer] for seq in selections)))
        for step in range(min(len(seq) for seq in selections))
        for layer in selections[0][step]
    ]
    return sum(sizes) / len(sizes) if sizes else 0.0


def rows_per_expert(selections: list[list[dict[int, set[int]]]]) -> dict[int, int]:
    """How many (step, layer, expert) of the batch's union had n rows selecting it, n -> count (from the solo
    selections): with each expert run on its rows, what the step's expert compute is made of."""
    counts: Counter[int] = Counter()
    for step in range(min(len(seq) for seq in selections)):
        for layer in selections[0][step]:
            counts.update(Counter(e for seq in selections for e in seq[step][layer]).values())
    return dict(sorted(counts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--widths", default="2,4,8", help="batch widths besides 1, comma-separated")
    parser.add_argument("--tokens", type=int, default=6, help="tokens per sequence (the first comes from its prompt)")
    parser.add_argument("--prompt-tokens", type=int, default=24, help="length of each calibration prompt")
    parser.add_argument("--drives", type=Path, default=None, help="drives.toml (default: the data dir's, if any)")
    parser.add_argument("--catalogue", type=Path, default=None, help="run catalogue (default: the data dir's)")
    parser.add_argument(
        "--replay-from", type=int, default=0,
        help="a replaying model's first recorded sequence (bench-replay: 2, the month-end split's 8 chats)",
    )  # fmt: skip
    args = parser.parse_args()
    widths = sorted({int(w) for w in args.widths.split(",")} - {1})
    drives_path = args.drives or (drives_file() if drives_file().is_file() else None)
    drives = load_drives(drives_path) if drives_path else None
    model = Model(resolve_model(args.model), StreamSettings(cache_bytes=0, trace=True), drives)
    prompts = calibration_prompts(model.tokenizer, length=args.prompt_tokens)[: max(widths)]
    if len(prompts) < max(widths):
        raise SystemExit(f"the calibration text gives {len(prompts)} prompts; ask for widths up to that")
    bandwidth = measure_bandwidth(model.stream.manifest, list(model.stream.manifest.drives))
    print(f"drives: {bandwidth / 1e6:.1f} MB/s together", flush=True)

    solo = []
    for i, prompt in enumerate(prompts, 1):
        solo.append(solo_selections(model, prompt, args.tokens, args.replay_from + i - 1))
        print(f"alone {i}/{len(prompts)}: {solo[-1][0].decode_tokens_per_s:.3f} tok/s", flush=True)
    width1 = sum(s.decode_tokens_per_s for s, _, _ in solo) / len(solo)
    k_per_call = sum(s.experts_per_layer_call for s, _, _ in solo) / len(solo)
    one = where_time_goes([s for s, _, _ in solo], [p for _, p, _ in solo], bandwidth)
    rows = [{"width": 1, "tok_s": width1, "ratio": 1.0, "union_measured": k_per_call, "union_predicted": k_per_call,
             **one, "disk_ceiling": 1.0, "compute_ceiling": 1.0}]  # fmt: skip
    counters: dict[str, float] = {}
    for width in widths:
        start = time.perf_counter()
        replay_from(model, args.replay_from)
        stats, passes = timed_batch(model, prompts[:width], args.tokens)
        predicted = predicted_union([sel for _, _, sel in solo[:width]])
        time_goes = where_time_goes([stats], [passes], bandwidth)
        rows.append(
            {
                "width": width,
                "tok_s": stats.decode_tokens_per_s,
                "ratio": stats.decode_tokens_per_s / width1 if width1 else 0.0,
                "union_measured": stats.experts_per_layer_call,
                "union_predicted": predicted,
                "rows_per_expert": rows_per_expert([sel for _, _, sel in solo[:width]]),
                **time_goes,
                "disk_ceiling": width * k_per_call / predicted if predicted else 0.0,
                "compute_ceiling": width * one["compute_s"] / time_goes["compute_s"],
                "wall_s": time.perf_counter() - start,
            }
        )
        counters[f"rows_per_step_w{width}"] = stats.rows / stats.steps if stats.steps else 0.0
        counters[f"overlapped_w{width}"] = sum(p.overlapped for p in passes)
        print(f"width {width}: {stats.decode_tokens_per_s:.3f} tok/s", flush=True)
    model.stream.close()

    print(f"{'width':>5} {'tok/s':>8} {'x width 1':>9} {'experts/layer step':>19} {'predicted':>10} "
          f"{'ceiling: disk':>13} {'compute':>8}")  # fmt: skip
    for r in rows:
        print(
            f"{r['width']:>5} {r['tok_s']:>8.3f} {r['ratio']:>9.2f} {r['union_measured']:>19.2f} "
            f"{r['union_predicted']:>10.2f} {r['disk_ceiling']:>13.2f} {r['compute_ceiling']:>8.2f}"
        )
    print(f"{'width':>5} {'s/step':>7} {'disk floor':>10} {'compute':>8} {'trunk':>6} {'experts':>8} {'guess':>6} "
          f"{'idle on reads':>13} {'MB/step':>8}")  # fmt: skip
    for r in rows:
        print(
            f"{r['width']:>5} {r['step_s']:>7.2f} {r['disk_floor_s']:>10.2f} {r['compute_s']:>8.2f} "
            f"{r['trunk_s']:>6.2f} {r['experts_s']:>8.2f} {r['guess_s']:>6.2f} {r['read_wait_s']:>13.2f} "
            f"{r['mb_per_step']:>8.1f}"
        )
    figures = {"rows": rows, "width1_tok_s": width1, "bandwidth_mb_s": bandwidth / 1e6}
    config = {"model": args.model, "widths": widths, "tokens": args.tokens, "prompt_tokens": args.prompt_tokens,
              "replay_from": args.replay_from}  # fmt: skip
    proofs = [Proof(f"batch of {w}", f"rows_per_step_w{w}", w - 0.5) for w in widths if w > 1]
    catalogue = Catalogue(args.catalogue or catalogue_file())
    run_id = catalogue.record(
        Run("batch-decode", args.model, config, figures, "pass", counters=counters, command=" ".join(sys.argv)),
        proofs,
    )
    print(json.dumps(figures))
    print(f"recorded as run {run_id} in {catalogue.path}")


if __name__ == "__main__":
    main()
