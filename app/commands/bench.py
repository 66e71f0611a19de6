"""`nightshift bench decode|ab|ladder|prefill|draft|cache|peer`: timed runs of the streaming engine, recorded in the run catalogue.

Run them on the rig for drive-bound figures: `nightshift rig run -- nightshift bench decode --model M
--drives RIG/drives.toml`. Every run is recorded, losses included; an A/B records its variant only when
the counters prove the mechanism fired (config assertions).
"""

from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import replace
from pathlib import Path

from nightshift.app.commands import say
from nightshift.app.commands.runs import catalogue
from nightshift.app.commands.stream_flags import (
    add_stream_arguments,
    comma_list,
    settings_from,
    sources_from,
    tuning_from,
)
from nightshift.engine.moe.settings import FIRST_REPLICA, FREQUENCY, LEAST_COMPLETION, LRFU

SHARES = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0)  # budgets `bench cache` simulates, of the store's expert bytes

# mechanism -> (baseline settings, variant settings, counter that proves the variant fired)
MECHANISMS = {
    "split": ({"split_reads": False}, {"split_reads": True}, "split_reads"),
    "balance": ({"balance_reads": False}, {"balance_reads": True}, "balanced_reads"),
    "pools": ({"shared_pool": True}, {"shared_pool": False}, "prefetch_reads"),
    "dispatch": ({"dispatch": FIRST_REPLICA}, {"dispatch": LEAST_COMPLETION}, "replica_choices"),
    "prefetch": ({"prefetch": False}, {"prefetch": True}, "joined_prefetch"),
    "prefetch-fill": (
        {"prefetch": True, "prefetch_fill": False},
        {"prefetch": True, "prefetch_fill": True},
        "joined_prefetch",
    ),
    "overlap": ({"overlap": False}, {"overlap": True}, "overlapped_experts"),
    "prefetch-tail": ({"prefetch_tail": False}, {"prefetch_tail": True}, "tail_prefetch"),
    "cache": ({"cache_bytes": 0}, {}, "cache_hits"),  # variant: --memory-budget (not 0)
    "cache-policy": ({"cache_policy": FREQUENCY}, {"cache_policy": LRFU}, "cache_hits"),
}


# The benchmarks measure the drives: no expert cache unless a run asks for one (`--memory-budget`).
BENCH_DEFAULTS = {"cache_bytes": 0}


def _record(
    args: argparse.Namespace,
    kind: str,
    store: Path,
    settings,
    result: dict,
    verdict: str,
    proofs=(),
    note: str = "",
    extra_config: dict | None = None,
) -> int:
    from nightshift.engine.instruments.catalogue import Run

    config = {**settings.as_dict(), "tokens": result["figures"].get("tokens"), **(extra_config or {})}
    run = Run(
        kind=kind,
        model=store.name,
        config=config,
        figures=result["figures"],
        verdict=verdict,
        drives=result["drives"],
        counters=result["counters"],
        command=shlex.join(["nightshift", *args.invocation]),
        note=note,
    )
    return catalogue().record(run, list(proofs))


def _show(label: str, result: dict) -> None:
    f = result["figures"]
    line = (
        f"{label}: {f['ms_per_token']:.1f} ms/token ({f['tokens_per_s']:.2f} tok/s), "
        f"{f['bytes_per_token'] / 1e6:.2f} MB/token, disk floor {f['disk_floor_ms']:.1f} ms "
        f"at {f['bandwidth_bytes_per_s'] / 1e6:.2f} MB/s (probe {f['probed_bytes_per_s'] / 1e6:.2f}, "
        f"this run {f['achieved_bytes_per_s'] / 1e6:.2f})"
    )
    if "compute_floor_ms" in f:
        line += (
            f", compute floor {f['compute_floor_ms']:.1f} ms, roofline fraction {f['roofline_fraction']:.2f}"
            f" (layer floor {f['layer_floor_ms']:.1f} ms: {f['layer_floor_fraction']:.2f}), tokens identical: "
            f"{f['tokens_identical']}"
        )
    if f.get("floor_error"):
        line += "; MEASUREMENT ERROR: faster than its roofline (a floor was mis-measured)"
    say(line)
    say(f"  counters: {result['counters']}")
    say(f"  trace: {result['trace']}")


def cmd_decode(args: argparse.Namespace) -> int:
    from nightshift.engine.bench.decode import decode_bench
    from nightshift.engine.bench.decode import verdict as verdict_of

    store, drives, ceilings = sources_from(args)
    settings = settings_from(args)
    result = decode_bench(
        store, settings, args.tokens, drives, ceilings, not args.no_compute_floor, args.bandwidth_seconds
    )
    _show("decode", result)
    verdict = verdict_of(result["figures"])
    say(f"recorded as run {_record(args, 'decode', store, settings, result, verdict)} ({verdict})")
    return 0


def cmd_ab(args: argparse.Namespace) -> int:
    from nightshift.engine.bench.decode import decode_bench, in_ram_decode
    from nightshift.engine.errors import NightshiftError
    from nightshift.engine.instruments.assertions import Proof, require

    store, drives, ceilings = sources_from(args)
    base_change, variant_change, counter = MECHANISMS[args.mechanism]
    settings = settings_from(args)
    if args.mechanism in ("cache", "cache-policy") and not settings.cache_bytes:
        raise NightshiftError(f"the {args.mechanism} A/B needs a cache: pass --memory-budget auto or a size")
    baseline = replace(settings, **base_change)
    variant = replace(settings, **variant_change)
    in_ram = False if args.no_compute_floor else in_ram_decode(store, args.tokens)  # once, for both rows
    results = {}
    for label, config in (("A (baseline)", baseline), ("B (variant)", variant)):
        results[label] = decode_bench(store, config, args.tokens, drives, ceilings, in_ram, args.bandwidth_seconds)
        _show(f"{args.mechanism} {label}", results[label])
    a, b = results["A (baseline)"], results["B (variant)"]
    gain = b["figures"]["tokens_per_s"] / a["figures"]["tokens_per_s"] - 1
    note = f"A/B {args.mechanism}: variant {gain:+.1%} tok/s"
    proofs = [Proof(args.mechanism, counter)]
    require(proofs, b["counters"])  # neither side is recorded if the variant did not demonstrably run
    a_id = _record(args, "ab", store, baseline, a, "baseline", note=note)
    b_id = _record(args, "ab", store, variant, b, "win" if gain > 0 else "loss", proofs, note=note)
    say(f"{note}; recorded as runs {a_id} (A) and {b_id} (B); `nightshift runs compare {a_id} {b_id}`")
    return 0


def cmd_ladder(args: argparse.Namespace) -> int:
    from nightshift.engine.bench.decode import ladder as decode_ladder
    from nightshift.engine.bench.decode import verdict as verdict_of

    store, drives, ceilings = sources_from(args)
    settings = settings_from(args)
    runs = decode_ladder(
        store, settings, args.tokens, drives, ceilings, args.bandwidth_seconds, not args.no_compute_floor,
        tuning_from(args),
    )  # fmt: skip
    top = runs[-1][1]["figures"]["tokens_per_s"]
    for count, (step, result) in enumerate(runs, 1):
        share = result["figures"]["tokens_per_s"] / top
        _show(f"{count} drive(s): {share:.0%} of the {len(runs)}-drive rate (linear: {count / len(runs):.0%})", result)
        result["figures"]["share_of_top"] = share
        verdict = "linear" if abs(share - count / len(runs)) <= 0.1 else "off-linear"
        verdict += f", {verdict_of(result['figures'])}"
        _record(args, "ladder", store, step, result, verdict, note=f"ladder step {count} of {len(runs)}")
    return 0


def _depths(text: str) -> list[int]:
    depths = list(comma_list(int)(text))
    if not depths or min(depths) < 0:
        raise argparse.ArgumentTypeError(f"draft depths must be 0 or more, at least one; got {text!r}")
    return depths


def cmd_draft(args: argparse.Namespace) -> int:
    from nightshift.app.models import resolve_model
    from nightshift.engine.bench.draft import best_depth, draft_sweep
    from nightshift.engine.instruments.assertions import Proof
    from nightshift.engine.runtime import open_model
    from nightshift.engine.speculative import record_best_depth

    store, drives, ceilings = sources_from(args)
    settings = settings_from(args)
    drafter = resolve_model(args.drafter)
    model = open_model(store, settings, drives, ceilings, drafter=drafter)
    try:
        results = draft_sweep(model, args.depths, args.tokens, args.repeats)
    finally:
        model.close()
    best = best_depth(results)
    say(
        "| depth | tok/s | acceptance | drafted | accepted | verify passes | union/verify | experts/layer pass "
        "| MB/token | break-even | tokens identical |"
    )
    for result in results:
        f, c = result["figures"], result["counters"]
        say(
            f"| {f['depth']} | {f['tokens_per_s']:.2f} | {f['acceptance_rate']:.0%} | {c['drafted']} | {c['accepted']} "
            f"| {c['verify_passes']} | {f['union_per_verify']:.2f} | {f['experts_per_layer_pass']:.2f} "
            f"| {f['bytes_per_token'] / 1e6:.2f} | {f['break_even_acceptance'] or 0:.0%} | {f['tokens_identical']} |"
        )
        result["drives"] = {}
        verdict = ("best" if result is best else "measured") if f["tokens_identical"] else "tokens-differ"
        proofs = [Proof(f"draft depth {f['depth']}", "drafted")] if f["depth"] else []
        run = _record(
            args,
            "draft",
            store,
            settings,
            result,
            verdict,
            proofs,
            note=f"draft sweep, drafter {drafter.name}",
            extra_config={"depth": f["depth"], "drafter": drafter.name},
        )
        result["run"] = run
    depth = best["figures"]["depth"]
    where = record_best_depth(
        store, drafter, depth, {"tokens_per_s": best["figures"]["tokens_per_s"], "run": best["run"]}
    )
    say(
        f"best depth {depth} ({best['figures']['tokens_per_s']:.2f} tok/s, run {best['run']}); "
        f"the default for this drafter now, in {where}"
    )
    return 0


def cmd_prefill(args: argparse.Namespace) -> int:
    from nightshift.engine.bench.prefill import prefill_bench
    from nightshift.engine.instruments.assertions import Proof

    store, drives, ceilings = sources_from(args)
    settings = settings_from(args)
    result = prefill_bench(
        store,
        settings,
        args.prompt_tokens,
        args.chunk,
        drives,
        ceilings,
        not args.no_compute_floor,
        args.row_tokens,
        args.bandwidth_seconds,
    )
    f = result["figures"]
    line = (
        f"prefill of {f['prompt_tokens']} tokens in chunks of {f['chunk']}: first token after "
        f"{f['time_to_first_token_s']:.1f} s, read amplification {f['read_amplification']:.3f}x "
        f"({f['bytes_read'] / 1e6:.0f} of {f['unique_bytes'] / 1e6:.0f} MB unique), disk floor "
        f"{f['disk_floor_s']:.1f} s at {f['bandwidth_bytes_per_s'] / 1e6:.0f} MB/s"
    )
    if "compute_floor_s" in f:
        line += (
            f", compute floor {f['compute_floor_s']:.1f} s, roofline fraction {f['roofline_fraction']:.2f}, "
            f"first token identical: {f['first_token_identical']}"
        )
    say(line)
    if "row_by_row_s" in f:
        say(
            f"  row by row on the first {f['row_by_row_tokens']} tokens: {f['row_by_row_tokens_per_s']:.2f} tok/s, "
            f"read amplification {f['row_by_row_read_amplification']:.2f}x"
        )
    say(f"  counters: {result['counters']}")
    verdict = "measured"
    if "roofline_fraction" in f:
        within = f["roofline_fraction"] >= 1 / 1.1 and f["read_amplification"] <= 1.05
        verdict = "pass" if within else "below-roofline"
    proofs = [Proof("expert-major prefill", "prefill_unique_bytes")]
    if settings.prefill_prefetch:
        proofs.append(Proof("prefill prefetch", "joined_prefetch"))
    run = _record(
        args,
        "prefill",
        store,
        settings,
        result,
        verdict,
        proofs,
        extra_config={"tokens": args.prompt_tokens, "chunk": args.chunk},
    )
    say(f"recorded as run {run} ({verdict})")
    return 0


def _shares(text: str) -> tuple[float, ...]:
    """Comma-separated shares of the expert bytes, each in (0, 1]; empty: none."""
    shares = tuple(float(part) for part in text.split(",") if part.strip())
    if shares and (min(shares) <= 0 or max(shares) > 1):
        raise argparse.ArgumentTypeError(f"give shares of the expert bytes in (0, 1], e.g. 0.1,0.25,0.5; got {text!r}")
    return shares


def cmd_cache(args: argparse.Namespace) -> int:
    """Record a routing trace (or take one), replay it against every policy and Belady, then measure the pick."""
    from nightshift.app.paths import ensure_data_dir
    from nightshift.engine.bench.cache_sim import Call, belady, best_policy, load_trace, replay, save_trace, sweep
    from nightshift.engine.bench.decode import PASS_FRACTION, decode_bench, in_ram_decode
    from nightshift.engine.bench.decode import verdict as verdict_of
    from nightshift.engine.instruments.assertions import Proof
    from nightshift.engine.moe.held import held_sizes
    from nightshift.engine.moe.load import with_drives
    from nightshift.engine.moe.warm import load_profile, save_profile
    from nightshift.engine.store.manifest import read_manifest

    store, drives, ceilings = sources_from(args)
    settings = settings_from(args)
    manifest = with_drives(read_manifest(store), drives)
    sizes = held_sizes(manifest.layers)
    profile = load_profile(store)  # past runs' (each run below adds itself: measured runs start from this one)
    if args.routing:
        calls, where = load_trace(Path(args.routing)), Path(args.routing)
    else:  # a real run with no cache: the lookups the engine makes, prompt and decode passes
        result = decode_bench(store, replace(settings, cache_bytes=0), args.tokens, drives, ceilings, False,
                              args.bandwidth_seconds, routing=True)  # fmt: skip
        calls = [Call(layer, experts, rows, counts) for layer, experts, rows, counts in result["routing"]]
        where = ensure_data_dir() / "traces" / f"{store.name}-{len(calls)}-calls.jsonl"
        where.parent.mkdir(exist_ok=True)
        save_trace(calls, where)
    say(f"trace: {len(calls)} layer calls ({sum(c.rows > 1 for c in calls)} of many rows) in {where}")
    table = sweep(calls, sizes, manifest.expert_bytes, args.shares, profile=profile)
    names = list(next(iter(table.values())))
    say("| budget | " + " | ".join(names) + " |")
    for share, row in table.items():
        say(f"| {share:.0%} | " + " | ".join(f"{row[p].hit_rate:.1%}" for p in names) + " |")
    pick = best_policy(table)
    sim = {f"{p} {share:g}": round(r.hit_rate, 4) for share, row in table.items() for p, r in row.items()}
    run = _record(args, "cache-sim", store, settings, {"figures": {**sim, "pick": pick, "calls": len(calls)},
                  "drives": {}, "counters": {"calls": len(calls)}}, f"pick {pick}", note=f"trace {where}")  # fmt: skip
    say(f"simulator's pick: {pick} (highest mean hit rate at 10/25/50 %); recorded as run {run}")
    warm = settings.warm_start and profile is not None
    # The compute floor once, shared by every budget (as an A/B's or a ladder's): each budget's roofline is
    # max(its disk floor from the bytes it read, this), and its tokens are checked against the in-RAM model's.
    in_ram = in_ram_decode(store, args.tokens) if args.measure else None
    for share in args.measure:
        budget = int(share * manifest.expert_bytes)
        measured = replace(settings, cache_bytes=budget, cache_policy=pick)
        if warm:
            experts = {layer.layer: layer.num_experts for layer in manifest.layers}
            save_profile(store, profile, experts)  # back to the profile the prediction replays from
        result = decode_bench(store, measured, args.tokens, drives, ceilings, in_ram, args.bandwidth_seconds)
        f, c = result["figures"], result["counters"]
        f["hit_rate"] = c["cache_hits"] / max(1, c["cache_hits"] + c["cache_misses"])
        f["predicted_hit_rate"] = replay(calls, sizes, budget, pick, profile if warm else None, warm).hit_rate
        f["belady_hit_rate"] = belady(calls, sizes, budget, warm).hit_rate  # from the same start
        f["of_belady"] = f["hit_rate"] / f["belady_hit_rate"] if f["belady_hit_rate"] else 1.0
        f["budget_share"] = share
        close = abs(f["hit_rate"] - f["predicted_hit_rate"]) <= 0.02
        at_roofline = f["roofline_fraction"] >= PASS_FRACTION and not f["floor_error"]  # above 1: a floor was wrong
        verdict = "pass" if close and f["of_belady"] >= 0.9 and at_roofline else "miss"
        verdict += f" (roofline: {verdict_of(f)})"  # compute-bound, tokens differing, a floor mis-measured
        say(
            f"{share:.0%} ({budget / 1e6:.0f} MB, {pick}): hit rate {f['hit_rate']:.1%} measured, "
            f"{f['predicted_hit_rate']:.1%} predicted, {f['of_belady']:.0%} of Belady's {f['belady_hit_rate']:.1%}; "
            f"{f['bytes_per_token'] / 1e6:.1f} MB/token, {f['ms_per_token']:.0f} ms/token, disk floor "
            f"{f['disk_floor_ms']:.0f} ms, compute floor {f['compute_floor_ms']:.0f} ms, stream wait "
            f"{f['wait_ms_per_token']:.0f} ms/token, roofline fraction {f['roofline_fraction']:.2f} (layer floor "
            f"{f['layer_floor_ms']:.0f} ms: {f['layer_floor_fraction']:.2f}): {verdict}"
        )
        note = f"trace {where}; timed on a shared machine"
        run = _record(args, "cache", store, measured, result, verdict, [Proof("cache", "cache_hits")], note=note)
        say(f"  recorded as run {run}")
        if args.foresight:
            _measure_foresight(args, store, measured, calls, drives, ceilings, in_ram, where)
    return 0


def _measure_foresight(args, store: Path, measured, calls, drives, ceilings, in_ram, where: Path) -> None:
    """The same budget with every guess right: the trace's next-layer experts read ahead, all of them (no window
    cap: the cap is there for wrong guesses). How far prediction could take this decode; recorded apart."""
    from nightshift.engine.bench.decode import decode_bench
    from nightshift.engine.instruments.assertions import Proof

    settings = replace(measured, prefetch=True, prefetch_fill=False)
    known = [(call.layer, call.experts) for call in calls]
    result = decode_bench(store, settings, args.tokens, drives, ceilings, in_ram, args.bandwidth_seconds,
                          foresight=known)  # fmt: skip
    f = result["figures"]
    say(
        f"  foresight (the trace's next-layer experts as the guesses): {f['ms_per_token']:.0f} ms/token, recall "
        f"{f['prefetch_recall']:.0%}, roofline fraction {f['roofline_fraction']:.2f} (layer floor "
        f"{f['layer_floor_ms']:.0f} ms), tokens identical: {f['tokens_identical']}"
    )
    note = f"foresight: guesses from the trace {where} (a ceiling for prediction, not a decode a user gets)"
    proofs = [Proof("cache", "cache_hits"), Proof("foresight", "joined_prefetch")]
    run = _record(args, "cache-foresight", store, settings, result, "measured", proofs, note=note)
    say(f"  recorded as run {run}")


def cmd_peer(args: argparse.Namespace) -> int:
    """nightshift against llama.cpp (mmap) and mlx-lm in RAM at the same budgets: each run recorded, the table shown."""
    from nightshift.engine.bench.peer import (
        NIGHTSHIFT,
        PeerError,
        PeerPlan,
        llama_cpp_python,
        read_ahead_kb,
        read_gguf,
        run_peers,
        table,
    )
    from nightshift.engine.instruments.catalogue import Run
    from nightshift.engine.moe.load import with_drives
    from nightshift.engine.store.manifest import read_manifest

    python = args.peer_python or llama_cpp_python()
    if python is None:
        raise PeerError(
            "no interpreter with llama-cpp-python: build one with bench/peer_setup.sh, then pass --peer-python "
            "or set NIGHTSHIFT_LLAMA_CPP_PYTHON to its python"
        )
    store, drives, _ = sources_from(args)
    gguf = read_gguf(Path(args.gguf))
    expert_bytes = with_drives(read_manifest(store), drives).expert_bytes
    settings = settings_from(args).as_dict()
    bits = {"nightshift_bits_per_weight": 8 * expert_bytes / gguf.expert_weights,
            "llama_bits_per_weight": gguf.bits_per_expert_weight,
            "gguf_read_ahead_kb": sorted({read_ahead_kb(f) for f in gguf.files}, key=str)}  # fmt: skip
    say(
        f"experts: nightshift {expert_bytes / 1e6:.1f} MB ({bits['nightshift_bits_per_weight']:.2f} bits/weight), "
        f"llama.cpp {gguf.expert_bytes / 1e6:.1f} MB ({gguf.bits_per_expert_weight:.2f}); budgets are shares of "
        f"nightshift's; llama.cpp's non-expert tensors {gguf.trunk_bytes / 1e6:.1f} MB stay mapped on top"
    )
    drives_file = Path(args.drives) if args.drives else None
    plan = PeerPlan(store, gguf, python, settings, args.shares, args.tokens, args.threads, drives_file, args.mlx_in_ram)

    def record(run) -> None:
        cache = {"cache_bytes": run.budget} if run.engine == NIGHTSHIFT else {}  # the budget its cache ran with
        config = {**settings, **cache, "engine": run.engine, "budget_share": run.share, "budget": run.budget,
                  "limit": run.limit, "tokens": args.tokens, "threads": args.threads, "gguf": str(gguf.files[0]), **bits}  # fmt: skip
        verdict = "oom-killed" if run.memory.get("oom_kills") else "measured"
        entry = Run(kind="peer", model=store.name, config=config, figures=run.figures(), verdict=verdict,
                    command=shlex.join(["nightshift", *args.invocation]), note=f"bench peer: {run.engine}")  # fmt: skip
        say(f"{run.engine} at {run.share if run.share is not None else 'all'}: {run.tokens_per_s:.3f} tok/s; "
            f"recorded as run {catalogue().record(entry)} ({verdict})")  # fmt: skip

    runs = run_peers(plan, expert_bytes, on_run=record)
    print(table(runs))
    return 0


def cmd_replicate(args: argparse.Namespace) -> int:
    from nightshift.app.models import resolve_model
    from nightshift.engine.bench.layout import replicate_everywhere

    copied = replicate_everywhere(resolve_model(args.model), args.replicas)
    where = "every drive of the store" if args.replicas is None else f"{args.replicas} drives"
    say(f"copied {copied / 1e6:.1f} MB: every expert now has a replica on {where}")
    return 0


def _add_bandwidth_seconds(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bandwidth-seconds",
        type=float,
        default=5.0,  # engine/bench/decode.py BANDWIDTH_S: why this long is noted there
        help="how long to probe the drives' aggregate read bandwidth before the run (5); the disk floor uses "
        "the larger of the probe and the rate the timed run itself read at",
    )


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n")[0]
    sub = parser.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    decode = sub.add_parser("decode", help="streamed decode vs its disk and compute floors")
    ab = sub.add_parser("ab", help="A/B one mechanism; the variant is recorded only if its counter proves it fired")
    ab.add_argument("--mechanism", choices=sorted(MECHANISMS), required=True)
    ladder = sub.add_parser("ladder", help="the same decode on 1, 2, ... n drives (experts on every drive)")
    for parser, run in ((decode, cmd_decode), (ab, cmd_ab), (ladder, cmd_ladder)):
        add_stream_arguments(parser, BENCH_DEFAULTS)
        parser.add_argument("--tokens", type=int, default=16, help="tokens to decode (16)")
        _add_bandwidth_seconds(parser)
        parser.set_defaults(run=run)
    prefill = sub.add_parser("prefill", help="a long prompt's time to first token vs its floors; read amplification")
    add_stream_arguments(prefill, BENCH_DEFAULTS)
    prefill.add_argument("--prompt-tokens", type=int, default=512, help="prompt length (512)")
    prefill.add_argument("--chunk", type=int, default=512, help="prompt rows per forward pass (512)")
    prefill.add_argument("--row-tokens", type=int, default=0, help="also prefill N tokens row by row, to compare (0)")
    _add_bandwidth_seconds(prefill)
    prefill.add_argument("--no-compute-floor", action="store_true", help="skip the in-RAM run")
    prefill.set_defaults(run=cmd_prefill)
    draft = sub.add_parser("draft", help="sweep speculative draft depth: acceptance, union per verify, tok/s")
    add_stream_arguments(draft, BENCH_DEFAULTS)
    draft.add_argument("--drafter", required=True, help="drafter model (name or directory) sharing the tokenizer")
    draft.add_argument("--depths", type=_depths, default=[0, 1, 2, 3, 4, 5, 6], help="comma-separated (0,1,...,6)")
    draft.add_argument("--tokens", type=int, default=32, help="tokens to decode per depth (32)")
    draft.add_argument("--repeats", type=int, default=1, help="runs per depth, alternating; each keeps its median (1)")
    draft.set_defaults(run=cmd_draft)
    cache = sub.add_parser(
        "cache", help="replay a routing trace against cache policies and Belady; measure the pick at some budgets"
    )
    add_stream_arguments(cache, BENCH_DEFAULTS)
    cache.add_argument("--tokens", type=int, default=16, help="tokens to decode, in the trace and each measured run")
    cache.add_argument("--routing", help="a routing trace recorded before (JSON lines) instead of recording one")
    cache.add_argument(
        "--shares", type=_shares, default=SHARES, help="budgets simulated, as shares of the expert bytes"
    )
    cache.add_argument(
        "--measure", type=_shares, default=(0.1, 0.25, 0.5), help="budgets measured with the pick (none: '')"
    )
    cache.add_argument(
        "--foresight",
        action="store_true",
        help="also measure each budget with the trace's next-layer experts as the guesses (prediction's ceiling)",
    )
    _add_bandwidth_seconds(cache)
    cache.set_defaults(run=cmd_cache)
    peer = sub.add_parser(
        "peer", help="nightshift vs llama.cpp (mmap) and mlx-lm in RAM, each held to the same RAM budget (cgroups)"
    )
    add_stream_arguments(peer, BENCH_DEFAULTS)
    peer.add_argument("--gguf", required=True, help="the same model for llama.cpp (the first file of a split GGUF)")
    peer.add_argument("--shares", type=_shares, default=(0.1, 0.25, 0.5), help="budgets, as shares of the expert bytes")
    peer.add_argument("--tokens", type=int, default=8, help="tokens to decode per run, timed (8)")
    peer.add_argument("--threads", type=int, default=os.cpu_count(), help="llama.cpp's threads (all cores)")
    peer.add_argument("--peer-python", help="python with llama-cpp-python (default: NIGHTSHIFT_LLAMA_CPP_PYTHON)")
    peer.add_argument(
        "--mlx-in-ram", action=argparse.BooleanOptionalAction, default=True, help="also run the store in RAM (on)"
    )
    peer.set_defaults(run=cmd_peer)
    replicate = sub.add_parser("replicate", help="copy every expert to every drive of the store (for the ladder)")
    replicate.add_argument("--model", required=True, help="a store (name from `model list`, or directory)")
    replicate.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="replicas per expert: copies to the drives after its first, in the store's order (default: every drive)",
    )
    replicate.set_defaults(run=cmd_replicate)
    for parser in (decode, ab, ladder):
        parser.add_argument(
            "--no-compute-floor", action="store_true", help="skip the in-RAM run (when the experts do not fit in RAM)"
        )
