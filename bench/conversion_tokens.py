"""Greedy tokens of mlx-lm conversions through nightshift's runtime, exact default against `float32_prefill`.

    .venv/bin/python -m bench.conversion_tokens --families mixtral,granitemoe,glm4_moe,deepseek_v3,qwen3_moe \\
        --quantization "4bit bf16"

For each family a tiny random release checkpoint (bench/helpers/moe_families.py) is converted by mlx-lm's own
`convert` as `--quantization` names (its QUANTIZATIONS), imported, and checked as the conformance test checks it
(tensors, then 24 greedy tokens in RAM and streamed against plain mlx-lm), once with the exact default and once
with every model opened `float32_prefill`. Prints one line per family and mode; asserts nothing.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from pathlib import Path

import bench.helpers.moe_families as families
from nightshift.engine.runtime import open_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", required=True, help="comma-separated family names")
    parser.add_argument("--quantization", default="4bit bf16", choices=list(families.QUANTIZATIONS))
    args = parser.parse_args(argv)
    for fast in (False, True):
        families.open_model = functools.partial(open_model, float32_prefill=fast)  # what check_import opens
        for family in args.families.split(","):
            with tempfile.TemporaryDirectory() as scratch:
                root = Path(scratch)
                src = families.write_checkpoint(family, root / "src", "release")
                converted = families.quantized_checkpoint(src, root / "q", **families.QUANTIZATIONS[args.quantization])
                outcome = families.check_import(converted, root)
                verdict = "; ".join(outcome.differences or []) or "24/24 tokens equal, in RAM and streamed"
                print(f"{'float32_prefill' if fast else 'exact default'} {family} {args.quantization}: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
