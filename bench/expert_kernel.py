"""One expert's compute at n rows on this CPU: the quantized kernel (row by row) against the grouped GEMM.

    .venv/bin/python -m bench.expert_kernel --model bench [--rows 1,2,3,4,8] [--repeats 7]

A batched decode step runs each expert of its union on the rows that selected it; this says which kernel
that should be, and so how a step's expert compute grows with its width. The expert has the store's shapes
and quantization (its first layer's), random weights; each figure is the best of `--repeats` evaluations.
Recorded in the run catalogue (kind `expert-kernel`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import nightshift.engine  # noqa: F401  (the CPU BLAS before MLX)

# isort: split
import mlx.core as mx
from mlx_lm.models.switch_layers import SwitchGLU

import nightshift.engine.cpu_prefill as cpu_prefill
from nightshift.app.models import resolve_model
from nightshift.app.paths import catalogue_file
from nightshift.engine.cpu_prefill import use_gemm_prefill, use_quantized_kernel
from nightshift.engine.instruments.catalogue import Catalogue, Run
from nightshift.engine.store.manifest import read_manifest


def best_of(repeats: int, run) -> float:
    """Fastest of `repeats` timed evaluations (after one untimed), in seconds."""
    mx.eval(run())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(run())
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--rows", default="1,2,3,4,8")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--catalogue", type=Path, default=None, help="run catalogue (default: the data dir's)")
    args = parser.parse_args()
    store = resolve_model(args.model)
    config = json.loads((store / "config.json").read_text())
    layer = read_manifest(store).layers[0]
    hidden = config.get("routed_expert_hidden_size") or config["hidden_size"]
    switch = SwitchGLU(hidden, config["moe_intermediate_size"], 1)
    for name, q in layer.quantization.items():
        setattr(switch, name, getattr(switch, name).to_quantized(q["group_size"], q["bits"], mode=q["mode"]))
    mx.eval(switch.parameters())
    rows: list[dict] = []
    for n in sorted({int(r) for r in args.rows.split(",")}):
        x = mx.random.normal((n, 1, hidden)).astype(mx.bfloat16)
        alone = mx.zeros((n, 1, 1), dtype=mx.uint32)
        use_quantized_kernel(switch)
        quantized = best_of(args.repeats, lambda x=x, alone=alone: switch(x, alone))
        use_gemm_prefill(switch)
        threshold, cpu_prefill.MIN_ROWS = cpu_prefill.MIN_ROWS, 1  # the GEMM path for any number of rows
        try:
            gemm = best_of(args.repeats, lambda x=x, alone=alone: switch(x, alone))
        finally:
            cpu_prefill.MIN_ROWS = threshold
        rows.append({"rows": n, "quantized_ms": 1000 * quantized, "gemm_ms": 1000 * gemm})
        print(f"{n} rows: quantized {1000 * quantized:7.1f} ms, dequantize + GEMM {1000 * gemm:7.1f} ms", flush=True)
    figures = {"rows": rows, "expert_bytes": layer.file_bytes}
    run = Run("expert-kernel", args.model, {"model": args.model, "repeats": args.repeats}, figures, "measured",
              command=" ".join(sys.argv))  # fmt: skip
    catalogue = Catalogue(args.catalogue or catalogue_file())
    print(f"recorded as run {catalogue.record(run, [])} in {catalogue.path}")


if __name__ == "__main__":
    main()
