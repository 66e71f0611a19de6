"""Benchmark: the CPU prefill paths side by side on one model in one run, alternating.

    python -m bench.cpu_prefill MODEL_DIR --catalogue PATH [--prompt-tokens 400] [--rounds 2]

Three paths answer the same prompt greedily, in turn, `--rounds` times: MLX's quantized kernel everywhere
(mlx-lm's own math), the exact default (`use_gemm_prefill`: float32 GEMM only where the kernel computes in
float32) and the opt-in float32 prefill (`float32_prefill`: GEMM for 16-bit checkpoints too). A GEMM run is
recorded with proof only if its layers took the GEMM path (counter `gemm_calls`); the exit status is 1 when the
exact default's tokens differ from the kernel's. The float32 prefill's tokens are noted, not required.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from functools import partial
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
    parser.add_argument("--rounds", type=int, default=2, help="times each path runs, in turn (2)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)

    instruments = Instruments()  # the model's layers count their GEMM calls here
    model = open_model(args.model, instruments=instruments)
    unit = model.tokenizer.encode(TEXT)
    prompt = (unit * (args.prompt_tokens // len(unit) + 1))[: args.prompt_tokens]
    catalogue = Catalogue(args.catalogue)
    command = shlex.join(["python", "-m", "bench.cpu_prefill", *argv])
    modes = {
        "quantized kernel": use_quantized_kernel,
        "exact default": use_gemm_prefill,
        "float32 prefill": partial(use_gemm_prefill, float32_prefill=True),
    }
    tokens: dict[str, list[int]] = {}
    for round_ in range(args.rounds):
        base = None
        for mode, switch in modes.items():
            switch(model.model)
            got, figures, calls = _measure(model, prompt, args.max_tokens, instruments)
            tokens.setdefault(mode, got)
            base = base or figures["time_to_first_token_s"]
            same = got == tokens["quantized kernel"]
            print(f"round {round_ + 1} {mode}: {figures}, gemm layer calls {calls}, tokens as the kernel's: {same}")
            verdict = (
                "baseline"
                if mode == "quantized kernel"
                else ("win" if figures["time_to_first_token_s"] < base else "loss")
            )
            run = Run(
                kind="cpu-prefill", model=str(args.model), verdict=verdict, command=command,
                config={"prefill": mode, "round": round_ + 1, "min_rows": MIN_ROWS, "blas": BLAS_IN_USE},
                figures={**figures, "ttft_ratio_to_kernel": round(figures["time_to_first_token_s"] / base, 3)},
                counters={"gemm_calls": calls},
                note="same greedy tokens as the quantized kernel" if same else "tokens differ from the quantized kernel",
            )  # fmt: skip
            run_id = catalogue.record(run, [Proof("gemm prefill", "gemm_calls")] if calls else [])
            print(f"recorded run {run_id} ({verdict})")
    return 0 if tokens["exact default"] == tokens["quantized kernel"] else 1


if __name__ == "__main__":
    sys.exit(main())
