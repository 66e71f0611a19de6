"""Benchmark: GEMM prefill against MLX's quantized kernel, side by side on one model in one run.

    python -m bench.cpu_prefill MODEL_DIR --catalogue PATH [--prompt-tokens 400]

Both runs answer the same prompt greedily; the GEMM run is recorded only if its layers
took the GEMM path (counter `gemm_calls`), and both must produce the same tokens.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from nightshift.engine.cpu_blas import BLAS_IN_USE
from nightshift.engine.cpu_prefill import MIN_ROWS, use_gemm_prefill, use_quantized_kernel
from nightshift.engine.instruments.assertions import Proof
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.instruments.probes import Instruments
from nightshift.engine.runtime import open_model

TEXT = "The bank statement shows a payment of 1,480.00 that the ledger does not. "


def _measure(model, prompt: list[int], max_tokens: int, instruments: Instruments) -> tuple[list[int], dict, int]:
    before = instruments.gemm_calls
    chunks = list(model.generate_tokens(prompt, max_tokens=max_tokens))
    stats = chunks[-1].stats
    figures = {
        "prompt_tokens": stats.prompt_tokens,
        "time_to_first_token_s": round(stats.time_to_first_token, 3),
        "prefill_tokens_per_s": round(stats.prefill_tokens_per_s, 2),
        "decode_tokens_per_s": round(stats.decode_tokens_per_s, 2),
    }
    return [c.token for c in chunks], figures, instruments.gemm_calls - before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--catalogue", type=Path, required=True)
    parser.add_argument("--prompt-tokens", type=int, default=400)
    parser.add_argument("--max-tokens", type=int, default=16)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)

    instruments = Instruments()  # the model's layers count their GEMM calls here
    model = open_model(args.model, instruments=instruments)
    unit = model.tokenizer.encode(TEXT)
    prompt = (unit * (args.prompt_tokens // len(unit) + 1))[: args.prompt_tokens]
    catalogue = Catalogue(args.catalogue)
    command = shlex.join(["python", "-m", "bench.cpu_prefill", *argv])
    results = {}
    for gemm in (False, True):
        (use_gemm_prefill if gemm else use_quantized_kernel)(model.model)
        tokens, figures, calls = _measure(model, prompt, args.max_tokens, instruments)
        results[gemm] = (tokens, figures)
        print(f"{'gemm prefill' if gemm else 'quantized kernel'}: {figures}, gemm layer calls {calls}")
        base = results[False][1]["time_to_first_token_s"]
        verdict = "baseline" if not gemm else ("win" if figures["time_to_first_token_s"] < base else "loss")
        run = Run(
            kind="cpu-prefill", model=str(args.model), verdict=verdict, command=command,
            config={"prefill": "gemm" if gemm else "quantized", "min_rows": MIN_ROWS, "blas": BLAS_IN_USE},
            figures={**figures, "ttft_ratio_to_baseline": round(figures["time_to_first_token_s"] / base, 3)},
            counters={"gemm_calls": calls},
            note="same greedy tokens as the baseline" if tokens == results[False][0] else "tokens differ",
        )  # fmt: skip
        run_id = catalogue.record(run, [Proof("gemm prefill", "gemm_calls")] if gemm else [])
        print(f"recorded run {run_id} ({verdict})")
    return 0 if results[True][0] == results[False][0] else 1


if __name__ == "__main__":
    sys.exit(main())
