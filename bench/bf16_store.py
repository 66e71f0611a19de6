"""A store's model as mlx-lm's `convert -q --dtype bfloat16` would publish it: 4-bit, bfloat16 scales, imported.

    .venv/bin/python -m bench.bf16_store --model default OUT_DIR

The hub's MLX checkpoints are mostly this format; the default model ships as a GGUF (float16 scales, float32
activations), so the exact prefill's cost on a bf16-scaled store is measured on this copy of it
(`python -m bench.cpu_prefill OUT_DIR/store ...`, docs/results.md [21]). The weights are
dequantized, cast to bfloat16 and quantized again by mlx-lm's own functions (group size 32, as the GGUF's: the
experts are 96 wide, which 64 does not divide), then
imported with `nightshift model import`'s importer.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.utils import dequantize_model, quantize_model, save_config, save_model

from nightshift.app.models import resolve_model
from nightshift.engine.io.drives import Drive
from nightshift.engine.store.importer import import_checkpoint
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.manifest import read_manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default", help="store name or directory (default: the default model)")
    parser.add_argument("out", type=Path, help="new directory: OUT/checkpoint and OUT/store")
    args = parser.parse_args(argv)
    source = resolve_model(None if args.model == "default" else args.model)
    model, _ = load_store(source)
    config = dict(read_manifest(source).config)
    config.pop("quantization", None)
    model = dequantize_model(model)
    model.update(
        tree_map(lambda v: v.astype(mx.bfloat16) if mx.issubdtype(v.dtype, mx.floating) else v, model.parameters())
    )
    model, config = quantize_model(model, config, 32, 4)  # 32: the experts are 96 wide
    checkpoint = args.out / "checkpoint"
    save_model(checkpoint, model)
    save_config({**config, "torch_dtype": "bfloat16"}, checkpoint / "config.json")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, checkpoint / name)
    import_checkpoint(checkpoint, args.out / "store", [Drive("d0", args.out / "experts")])
    print(args.out / "store")
    return 0


if __name__ == "__main__":
    sys.exit(main())
