"""A store pipelined over 2 ranks (2 drives each) against one process with 2 drives: per-token time in one run.

Run inside the rig's cgroup (each rank reads its own throttled drives):

    nightshift rig run -- .venv/bin/python -m bench.distributed --one ONE --two TWO --hosts HOSTS_JSON \
        --single-drives rig0,rig1 [--tokens 24]

ONE is the store placed on the single process's 2 drives, TWO the same weights placed with
`nightshift model place TWO --hosts HOSTS_JSON` (each host's layers on its own 2 drives). Both decode
the same greedy tokens from the same prompt with no expert cache (every expert read from the drives).
Prints per-token decode time of each, each rank's own time per step (its layers, from the trace) and
what two micro-batches in flight would give at most (one on each rank at once, which mlx-lm's pipeline
does not schedule: a batch's rows cross the ranks together): one token per slowest rank's own time
instead of one per whole pipeline pass. Both runs go into the run catalogue (kind `pipeline`).

`--experts STORE` (placed with `model place STORE --hosts HOSTS_JSON --experts`): expert parallelism
over the same hosts in the same run (every rank every layer, half of each layer's experts, one all_sum
per MoE layer; engine/distributed/experts.py). `--four STORE --four-drives a,b,c,d` measures what EP
needs in one process: every layer read from all 4 drives, and the latency of one exchange (an all_sum
of one hidden state over a 2-rank ring on this machine).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nightshift.app.paths import catalogue_file
from nightshift.engine.distributed.hosts import load_hosts
from nightshift.engine.distributed.launch import free_port, generate_over_hosts
from nightshift.engine.distributed.worker import own_time
from nightshift.engine.instruments.assertions import Proof
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.io.drives import Drive
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import open_model
from nightshift.engine.store.manifest import read_manifest

PROMPT = [(7 * i + 3) % 997 + 1 for i in range(32)]
OTHER_PROMPT = [(11 * i + 5) % 997 + 1 for i in range(32)]  # the second sequence in flight
SKIP = 2  # decode steps left out of the per-token time in both runs (the first steps' allocations)


def per_token(elapsed: list[float]) -> float:
    """Seconds per decode token after the first token and SKIP more."""
    return (elapsed[-1] - elapsed[SKIP]) / (len(elapsed) - 1 - SKIP)


def single(store: Path, drives: list[str], tokens: int, prompt: list[int] = PROMPT) -> dict:
    """One process reading every layer's experts from `drives`."""
    manifest = read_manifest(store)
    model = open_model(
        store,
        stream=StreamSettings(cache_bytes=0),
        drives=[Drive(name, Path(manifest.drives[name])) for name in drives],
    )
    try:
        elapsed, ids, stats = [], [], None
        for chunk in model.generate_tokens(prompt, max_tokens=tokens):
            elapsed.append(chunk.stats.elapsed)
            ids.append(chunk.token)
            stats = chunk.stats
        busy, _, steps = own_time(model.stream.trace.passes())
        return {"tokens": ids, "elapsed": elapsed, "drive_bytes": stats.drive_bytes, "busy_s": busy, "steps": steps}
    finally:
        model.close()


def ring_probe(hidden: int, rounds: int = 200) -> None:
    """In a rank of a 2-rank ring: print the mean seconds of an all_sum of one hidden state (EP's exchange)."""
    import time

    import mlx.core as mx

    group = mx.distributed.init(backend="ring", strict=True)
    x = mx.ones((1, hidden), dtype=mx.bfloat16)
    mx.eval(mx.distributed.all_sum(x, stream=mx.cpu))
    start = time.perf_counter()
    for _ in range(rounds):
        x = mx.distributed.all_sum(x, stream=mx.cpu) * 0.5
        mx.eval(x)
    if group.rank() == 0:
        print(f"{(time.perf_counter() - start) / rounds:.6f}", flush=True)


def exchange_latency(hidden: int) -> float:
    """Seconds per all_sum of one hidden state over 2 ranks on this machine (mlx.launch, ring backend)."""
    import subprocess

    launch = Path(sys.executable).with_name("mlx.launch")
    out = subprocess.run(
        [
            str(launch),
            "-n",
            "2",
            "--backend",
            "ring",
            "-p",
            str(free_port(2)),
            sys.executable,
            __file__,
            "--ring-probe",
            str(hidden),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return float(out.stdout.split()[0])


def two_processes(store: Path, drives: str, tokens: int) -> list[dict]:
    """Two single processes at once on the same drives, one sequence each (one host, 2 sequences in flight)."""
    import json
    import subprocess

    command = [sys.executable, __file__, "--single-run", str(store), drives, str(tokens)]
    runs = [subprocess.Popen([*command, str(i)], stdout=subprocess.PIPE, text=True) for i in range(2)]
    return [json.loads(run.communicate()[0].splitlines()[-1]) for run in runs]


def two_pipelines(store: Path, hosts: list, tokens: int) -> list:
    """Two pipelines at once over the same hosts, one sequence each: while one sequence's step is on one host,
    the other's can be on the other host (what batching would do inside one pipeline, here two)."""
    from concurrent.futures import ThreadPoolExecutor

    first = free_port(len(hosts))
    second = next(p for p in iter(lambda: free_port(len(hosts)), None) if abs(p - first) >= len(hosts))
    with ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(generate_over_hosts, store, hosts, prompt, tokens, 0, port)
            for prompt, port in ((PROMPT, first), (OTHER_PROMPT, second))
        ]
        return [r.result() for r in runs]


def main() -> int:
    if sys.argv[1:2] == ["--ring-probe"]:
        ring_probe(int(sys.argv[2]))
        return 0
    if sys.argv[1:2] == ["--single-run"]:
        import json

        store, drives, tokens, which = sys.argv[2:6]
        print(json.dumps(single(Path(store), drives.split(","), int(tokens), (PROMPT, OTHER_PROMPT)[int(which)])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", required=True, type=Path, help="the store placed on the single process's drives")
    parser.add_argument("--two", required=True, type=Path, help="the store placed with model place --hosts")
    parser.add_argument("--hosts", required=True, type=Path, help="hosts.json of the pipeline")
    parser.add_argument("--single-drives", required=True, help="the single process's drives, e.g. rig0,rig1")
    parser.add_argument("--four", type=Path, help="the store placed over 4 drives (expert parallelism's reads)")
    parser.add_argument("--four-drives", help="its drives, e.g. rig0,rig1,rig2,rig3")
    parser.add_argument(
        "--experts",
        type=Path,
        help="the store placed for expert parallelism over the same hosts (each host every layer, a share of "
        "its experts: placement.planner_by_expert): its per-token time in the same run",
    )
    parser.add_argument(
        "--in-flight", action="store_true", help="also 2 sequences at once: 2 pipelines, and 2 processes on one host"
    )
    parser.add_argument("--tokens", type=int, default=24, help="tokens per run (24)")
    parser.add_argument("--note", default="", help="kept with the runs in the catalogue")
    args = parser.parse_args()

    one = single(args.one, args.single_drives.split(","), args.tokens)
    hosts = load_hosts(args.hosts)
    result = generate_over_hosts(args.two, hosts, PROMPT, args.tokens, memory_budget=0, port=free_port(len(hosts)))
    t_one, t_two = per_token(one["elapsed"]), per_token(result.elapsed)
    same = result.tokens == one["tokens"]
    own = [r["busy_s"] / r["decode_steps"] for r in result.ranks]
    one_own = one["busy_s"] / one["steps"]
    bound = t_one / max(own)  # aggregate tok/s with every rank busy, over one process's
    print(f"tokens identical: {same} ({len(result.tokens)} tokens)")
    print(f"one process, 2 drives: {t_one:.3f} s/token ({one_own:.3f} s in its MoE layers)")
    print(f"pipeline, {len(hosts)} ranks x 2 drives: {t_two:.3f} s/token ({t_two / t_one:.2f}x one process's time)")
    for rank, (r, t) in enumerate(zip(result.ranks, own, strict=True)):
        mb = sum(r["drive_bytes"].values()) / 1e6 / (len(result.tokens) - 1)
        print(
            f"  rank {rank}: layers own {t:.3f} s/step ({t / t_two:.0%} of a step), "
            f"waiting/entry {r['entry_s'] / r['decode_steps']:.3f} s/step, {mb:.1f} MB/token (the prompt's reads included) from "
            + ", ".join(sorted(d for d, b in r["drive_bytes"].items() if b))
        )
    print(
        f"with {len(hosts)} micro-batches in flight (one on each rank; mlx-lm's pipeline does not schedule that): "
        f"at most {bound:.2f}x one process's "
        f"tokens/s (one token per slowest rank's own time {max(own):.3f} s; "
        "an upper bound: own time leaves out the work outside the MoE passes)"
    )
    four = None
    if args.four:
        four = single(args.four, args.four_drives.split(","), args.tokens)
        config = read_manifest(args.four).config
        hidden = int(config.get("hidden_size") or config["text_config"]["hidden_size"])
        moe_layers = len(read_manifest(args.four).layers)
        latency = exchange_latency(hidden)
        t_four = per_token(four["elapsed"])
        ep = t_four + moe_layers * latency
        print(
            f"expert parallelism, ingredients: one process on 4 drives {t_four:.3f} s/token; one exchange "
            f"(all_sum of a hidden state, 2 ranks here) {latency * 1e3:.2f} ms x {moe_layers} MoE layers; "
            f"at best {ep:.3f} s/token ({ep / t_one:.2f}x one process on 2 drives, {ep / t_two:.2f}x the pipeline)"
        )
    if args.experts:
        shared = generate_over_hosts(
            args.experts, hosts, PROMPT, args.tokens, memory_budget=0, port=free_port(len(hosts)), shape="experts"
        )
        t_ep = per_token(shared.elapsed)
        print(
            f"expert parallelism over {len(hosts)} ranks (every layer, half the experts each, no reads ahead): "
            f"{t_ep:.3f} s/token = {t_ep / t_one:.2f}x one process, {t_ep / t_two:.2f}x the pipeline; "
            f"tokens identical to one process: {shared.tokens == one['tokens']}; "
            + "; ".join(
                f"rank {i} read " + ", ".join(f"{d} {b / 1e6:.1f} MB" for d, b in r["drive_bytes"].items() if b)
                for i, r in enumerate(shared.ranks)
            )
        )
        Catalogue(catalogue_file()).record(
            Run(
                "pipeline",
                args.experts.name,
                {"tokens": args.tokens, "memory_budget": 0, "prompt_tokens": len(PROMPT), "ranks": len(hosts),
                 "shape": "expert parallel (all_sum per MoE layer)"},
                {"s_per_token": t_ep, "pipeline_s_per_token": t_two, "one_process_s_per_token": t_one,
                 "tokens_identical": int(shared.tokens == one["tokens"])},
                "measured",
                drives={d: b for r in shared.ranks for d, b in r["drive_bytes"].items()},
                command=" ".join(sys.argv),
                note=args.note,
            )
        )  # fmt: skip
    if args.in_flight:
        host_rate = sum(1 / per_token(r["elapsed"]) for r in two_processes(args.one, args.single_drives, args.tokens))
        pipes = two_pipelines(args.two, hosts, args.tokens)
        pipe_rate = sum(1 / per_token(r.elapsed) for r in pipes)
        print(
            f"2 sequences at once: one host, 2 drives, 2 processes {host_rate:.3f} tok/s; "
            f"2 pipelines over {len(hosts)} hosts x 2 drives {pipe_rate:.3f} tok/s = {pipe_rate * t_one:.2f}x one "
            f"process's {1 / t_one:.3f} tok/s, {pipe_rate / host_rate:.2f}x one host's 2 processes"
        )
    catalogue = Catalogue(catalogue_file())
    command = " ".join(sys.argv)
    base = {"tokens": args.tokens, "memory_budget": 0, "prompt_tokens": len(PROMPT)}
    catalogue.record(
        Run(
            "pipeline",
            args.one.name,
            {**base, "ranks": 1, "drives": args.single_drives},
            {"s_per_token": t_one, "own_s_per_step": one_own},
            "measured",
            drives=one["drive_bytes"],
            command=command,
            note=args.note,
        )
    )
    if four is not None:
        catalogue.record(
            Run(
                "pipeline",
                args.four.name,
                {**base, "ranks": 1, "drives": args.four_drives, "shape": "expert-parallel ingredients"},
                {"s_per_token": t_four, "exchange_s": latency, "moe_layers": moe_layers, "ep_best_s_per_token": ep},
                "measured",
                drives=four["drive_bytes"],
                command=command,
                note=args.note,
            )
        )
    if args.in_flight:
        catalogue.record(
            Run(
                "pipeline",
                args.two.name,
                {
                    **base,
                    "ranks": len(hosts),
                    "in_flight": 2,
                    "shape": "2 pipelines at once vs 2 processes on one host",
                },
                {
                    "aggregate_tok_s": pipe_rate,
                    "one_host_two_processes_tok_s": host_rate,
                    "one_process_tok_s": 1 / t_one,
                },
                "measured",
                command=command,
                note=args.note,
            )
        )
    ranks_reading = sum(1 for r in result.ranks if any(r["drive_bytes"].values()))
    catalogue.record(
        Run(
            "pipeline",
            args.two.name,
            {**base, "ranks": len(hosts), "drives": [[d.name for d in h.drives] for h in hosts]},
            {
                "s_per_token": t_two,
                "ratio_to_one_process": t_two / t_one,
                "own_s_per_step": own,
                "in_flight_bound_x": bound,
                "tokens_identical": same,
            },
            "measured" if same else "tokens differ",
            drives={d: b for r in result.ranks for d, b in r["drive_bytes"].items()},
            counters={"ranks_reading": ranks_reading},
            command=command,
            note=args.note,
        ),
        [Proof("pipeline", "ranks_reading", len(hosts))],
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
