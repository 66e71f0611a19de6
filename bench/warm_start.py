"""Warm start measured: the same first answer from a freshly opened model, with and without the warm start.

Each round opens the store twice (order alternating from round to round), each time from the same routing
profile (restored before every open, since each run adds itself to it): the time to open, to the first
token and to the `tokens`th, the cache's hit rate, and what the warm start read, kept and served. The
prompt is the first `--prompt-tokens` of a text (a review's, say), so the profile's runs and this one differ.

    python -m bench.warm_start STORE --catalogue CAT --text FILE [--budget 0.1] [--tokens 16]
        [--prompt-tokens 400] [--rounds 2]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from nightshift.engine.instruments.assertions import Proof
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.warm import load_profile, save_profile
from nightshift.engine.runtime import open_model
from nightshift.engine.store.manifest import read_manifest

LABELS = ("cold", "warm")


def one_run(store: Path, settings: StreamSettings, text: str, prompt_tokens: int, tokens: int) -> dict:
    """Open, answer, close: the timings from the open on, and the stream's counters."""
    began = time.perf_counter()
    model = open_model(store, stream=settings)
    try:
        opened = time.perf_counter() - began
        prompt = model.tokenizer.encode(text)[:prompt_tokens]
        chunks = list(model.generate_tokens(prompt, max_tokens=tokens))
        done = time.perf_counter() - began
        stats, figures = chunks[-1].stats, model.stream.figures()
    finally:
        model.close()
    return {
        "open_s": opened,
        "first_token_s": opened + stats.time_to_first_token,
        "answer_s": done,
        "hit_rate": stats.cache_hit_rate,
        "bytes_read": figures.bytes_read,
        "warm_read": figures.warm.read,
        "warm_kept": figures.warm.kept,
        "warm_hits": figures.warm_hits,
        "tokens": [c.token for c in chunks],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("--catalogue", type=Path, required=True)
    parser.add_argument("--text", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=0, help="share of the expert bytes (0: auto)")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    manifest = read_manifest(args.store)
    profile = load_profile(args.store)
    if profile is None:
        parser.error(f"{args.store} has no routing profile yet: run the model once first")
    experts = {layer.layer: layer.num_experts for layer in manifest.layers}
    base = StreamSettings() if not args.budget else StreamSettings(cache_bytes=int(args.budget * manifest.expert_bytes))
    text = args.text.read_text()
    runs: dict[str, list[dict]] = {label: [] for label in LABELS}
    for r in range(args.rounds):
        for label in LABELS if r % 2 == 0 else reversed(LABELS):
            save_profile(args.store, profile, experts)  # every open starts from the same profile
            settings = replace(base, warm_start=label == "warm")
            runs[label].append(one_run(args.store, settings, text, args.prompt_tokens, args.tokens))
            print(label, {k: v for k, v in runs[label][-1].items() if k != "tokens"})
    save_profile(args.store, profile, experts)
    keys = ("open_s", "first_token_s", "answer_s", "hit_rate", "bytes_read", "warm_read", "warm_kept", "warm_hits")
    med = {label: {k: statistics.median(r[k] for r in runs[label]) for k in keys} for label in LABELS}
    figures = {f"{label} {k}": v for label, m in med.items() for k, v in m.items()}
    figures["answer_warm_vs_cold"] = med["warm"]["answer_s"] / med["cold"]["answer_s"]
    figures["first_token_warm_vs_cold"] = med["warm"]["first_token_s"] / med["cold"]["first_token_s"]
    same = all(r["tokens"] == runs["cold"][0]["tokens"] for label in LABELS for r in runs[label])
    figures["tokens_identical"] = same
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()})
    run = Run(
        kind="warm-start",
        model=args.store.name,
        config={**base.as_dict(), "budget_share": args.budget, "tokens": args.tokens,
                "prompt_tokens": args.prompt_tokens, "rounds": args.rounds, "profile_runs": profile.runs},
        figures=figures,
        counters={"warm_kept": med["warm"]["warm_kept"], "warm_hits": med["warm"]["warm_hits"]},
        verdict="measured" if same else "tokens differ",
        command=shlex.join(["python", "-m", "bench.warm_start", *argv]),
        note="timed on a shared 2-core machine; rounds alternate their order",
    )  # fmt: skip
    proofs = [Proof("warm start", "warm_kept")]
    print(f"recorded run {Catalogue(args.catalogue).record(run, proofs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
