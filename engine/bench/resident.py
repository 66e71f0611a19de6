"""The default budget side by side: a store streamed with `auto`, the same store in RAM, the dense model in RAM.

One process, the three models open together, rounds in alternating order (the machine may be shared: ratios
within a run stay fair). Each round prefills the same ~400-token prompt and decodes the same greedy tokens;
figures are medians over the warm rounds (the streamed model's first round, which reads the experts, is
reported apart). The ratios are medians of each round's own ratio (the models of one round run back to back,
so they share the machine's state; a ratio of medians taken across rounds swung 0.89-1.06 between runs on this
machine, with no difference in CPU per token). The streamed model's counters prove what was read: every
expert once (drive reads equal to distinct experts read, bytes equal to the store's expert bytes) and
nothing after the first round.

    python -m nightshift.engine.bench.resident STORE DENSE --catalogue CAT [--prompt-tokens 400] [--tokens 32]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from pathlib import Path

from nightshift.engine.bench.cpu_prefill import TEXT
from nightshift.engine.cpu_prefill import PrefillQuantizedSwitchLinear
from nightshift.engine.instruments.assertions import Proof
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import Model, open_model

LABELS = ("dense in RAM", "store in RAM", "store streamed")


def one_round(model: Model, prompt: list[int], tokens: int) -> dict:
    """Prefill `prompt` and decode `tokens`: time to first token, decode rate, the tokens."""
    chunks = list(model.generate_tokens(prompt, max_tokens=tokens))
    stats = chunks[-1].stats
    return {
        "ttft_s": stats.time_to_first_token,
        "decode_tok_s": stats.decode_tokens_per_s,
        "tokens": [c.token for c in chunks],
        "bytes_read": sum(stats.drive_bytes.values()),
        "hit_rate": stats.cache_hit_rate,
    }


def side_by_side(store: Path, dense: Path, prompt_tokens: int, tokens: int, rounds: int) -> dict:
    """Rounds over the three models in alternating order; per model its rounds' figures."""
    models = {
        LABELS[0]: open_model(dense),
        LABELS[1]: open_model(store),
        LABELS[2]: open_model(store, stream=StreamSettings()),
    }
    try:
        unit = models[LABELS[0]].tokenizer.encode(TEXT)
        prompt = (unit * (prompt_tokens // len(unit) + 1))[:prompt_tokens]
        runs: dict[str, list[dict]] = {label: [] for label in LABELS}
        runs[LABELS[2]].append(one_round(models[LABELS[2]], prompt, tokens))  # cold: reads the experts
        for r in range(rounds):
            for label in LABELS if r % 2 == 0 else reversed(LABELS):
                runs[label].append(one_round(models[label], prompt, tokens))
        streamed = models[LABELS[2]].stream
        return {"runs": runs, "figures": streamed.figures(), "budget": streamed.budget, "prompt": prompt}
    finally:
        for model in models.values():
            model.close()


def per_round(warm: dict[str, list[dict]], name: str, of: str, to: str, key: str) -> dict[str, float]:
    """`name`: the median over rounds of `of`'s `key` over `to`'s in the same round; `name` q1 and q3 its spread."""
    ratios = [a[key] / b[key] for a, b in zip(warm[of], warm[to], strict=True)]
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    return {name: statistics.median(ratios), f"{name} q1": q1, f"{name} q3": q3}


def summary(result: dict) -> dict:
    """Medians of the warm rounds per model, the ratios the issue asks for, and the read proof."""
    runs, figures, budget = result["runs"], result["figures"], result["budget"]
    warm = {label: runs[label][1:] if label == LABELS[2] else runs[label] for label in LABELS}
    med = {
        label: {key: statistics.median(r[key] for r in warm[label]) for key in ("ttft_s", "decode_tok_s")}
        for label in LABELS
    }
    reads = sum(d.reads for d in figures.drives.values())
    return {
        "median": med,
        "cold_ttft_s": runs[LABELS[2]][0]["ttft_s"],
        "cold_decode_tok_s": runs[LABELS[2]][0]["decode_tok_s"],
        **per_round(warm, "decode_vs_in_ram", LABELS[2], LABELS[1], "decode_tok_s"),
        **per_round(warm, "prefill_vs_dense", LABELS[2], LABELS[0], "ttft_s"),
        **per_round(warm, "prefill_in_ram_vs_dense", LABELS[1], LABELS[0], "ttft_s"),
        "budget_bytes": budget.bytes,
        "expert_bytes": budget.expert_bytes,
        "bytes_read": figures.bytes_read,
        "drive_reads": reads,
        "distinct_experts_read": figures.distinct_experts_read,
        "read_after_first_round": sum(r["bytes_read"] for r in runs[LABELS[2]][1:]),
        "hit_rate_warm": statistics.median(r["hit_rate"] for r in warm[LABELS[2]]),
        "resident_layers": figures.resident_layers,
        "tokens_identical_to_in_ram": all(r["tokens"] == runs[LABELS[1]][0]["tokens"] for r in runs[LABELS[2]]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("dense", type=Path)
    parser.add_argument("--catalogue", type=Path, required=True)
    parser.add_argument("--prompt-tokens", type=int, default=400)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    gemm_before = PrefillQuantizedSwitchLinear.gemm_calls
    result = side_by_side(args.store, args.dense, args.prompt_tokens, args.tokens, args.rounds)
    figures = summary(result)
    for label, med in figures["median"].items():
        print(f"{label}: first token after {med['ttft_s']:.2f} s, decode {med['decode_tok_s']:.2f} tok/s")
    print({k: v for k, v in figures.items() if k != "median"})
    once = figures["drive_reads"] == figures["distinct_experts_read"] and figures["read_after_first_round"] == 0
    verdict = (
        "pass"
        if once and figures["decode_vs_in_ram"] >= 0.95 and figures["prefill_vs_dense"] <= 1.25
        else "below-target"
    )
    run = Run(
        kind="budget",
        model=args.store.name,
        config={**StreamSettings().as_dict(), "prompt_tokens": args.prompt_tokens, "tokens": args.tokens,
                "rounds": args.rounds, "dense": args.dense.name},
        figures={k: v for k, v in figures.items() if k != "median"}
        | {f"{label} {key}": value for label, med in figures["median"].items() for key, value in med.items()},
        counters={"cache_hits": result["figures"].cache_hits, "resident_layers": figures["resident_layers"],
                  "expert_gemm_calls": PrefillQuantizedSwitchLinear.gemm_calls - gemm_before},
        verdict=verdict,
        command=shlex.join(["python", "-m", "nightshift.engine.bench.resident", *argv]),
        note="timed on a shared 2-core machine; rounds alternate so ratios within the run are fair",
    )  # fmt: skip
    proofs = [Proof("resident layers", "resident_layers"), Proof("expert GEMM prefill", "expert_gemm_calls")]
    print(f"recorded run {Catalogue(args.catalogue).record(run, proofs)} ({verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
