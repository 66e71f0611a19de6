"""Convert a Hugging Face checkpoint to a split, quantized GGUF with llama.cpp's own converter (`bench peer`'s peer).

Runs in the peer's interpreter (the venv `bench/peer_setup.sh` builds: llama-cpp-python, torch, the converter's
requirements), never in nightshift's; it imports nothing of nightshift.

    PEER_PYTHON bench/peer_convert.py SRC OUT_DIR --llama-cpp DIR [--shards 4] [--type Q4_1|bf16] [--spread DIR,DIR...]

1. `convert_hf_to_gguf.py SRC --outtype f32 --split-max-size S` (S = a `--shards`th of the f32 size), so the
   model comes in `--shards` files that `bench peer` puts one per drive;
2. `llama_model_quantize` (the bindings' C call) of those shards to `--type`, keeping the split
   (OUT_DIR/model-00001-of-0000N.gguf ...); the f32 shards are deleted;
3. with `--spread`, shard i moved to the i-th directory (round robin: one per drive, so llama.cpp reads the same
   drives nightshift does) and linked from OUT_DIR, where llama.cpp finds a split model's files.

With `--type bf16` step 2 is skipped: the converter writes the shards in bf16 (a bf16 checkpoint kept as it is).

One thing is forced: the converter refuses a byte-level BPE tokenizer whose pre-tokenizer hash it does not
know (a synthetic model's, trained here), so the pre-tokenizer is labelled "gpt-2". Only text tokenization
would differ; the benchmark feeds token ids.
Q4_1 is 5.0 bits per weight (a float16 scale and minimum per 32 weights), as nightshift's affine 4-bit with
float32 scale and bias per 64 weights: the experts are the same bytes on both sides.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
from pathlib import Path

TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7}  # llama.h's LLAMA_FTYPE_MOSTLY_*


def convert(src: Path, f32_prefix: Path, llama_cpp: Path, shards: int, outtype: str = "f32") -> list[Path]:
    """The GGUF shards of `src` in `outtype` (f32, or bf16 for a bf16 model kept as it is), by llama.cpp's converter."""
    sys.path.insert(0, str(llama_cpp))
    import convert_hf_to_gguf
    from conversion.base import TextModel

    TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    weights = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    per_shard = math.ceil(weights / shards / 1e6) + 1
    sys.argv = ["convert_hf_to_gguf.py", str(src), "--outtype", outtype, "--outfile", f"{f32_prefix}.gguf",
                "--split-max-size", f"{per_shard}M"]  # fmt: skip
    convert_hf_to_gguf.main()
    whole = f32_prefix.with_name(f"{f32_prefix.name}.gguf")  # the converter splits nothing that fits one shard
    return sorted(f32_prefix.parent.glob(f"{f32_prefix.name}-*-of-*.gguf")) or [whole]


def quantize(first_shard: Path, out_prefix: Path, kind: str, split: bool) -> None:
    """`first_shard`'s model quantized to `kind`: OUT_PREFIX-0000i-of-0000n.gguf when `split`, else OUT_PREFIX.gguf."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = TYPES[kind]
    params.keep_split = split
    out_prefix = out_prefix if split else out_prefix.with_name(f"{out_prefix.name}.gguf")
    params.nthread = 2
    if llama_cpp.llama_model_quantize(str(first_shard).encode(), str(out_prefix).encode(), params) != 0:
        raise SystemExit(f"llama_model_quantize failed on {first_shard}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument(
        "--llama-cpp", type=Path, required=True, help="llama.cpp's source (the sdist's vendor/llama.cpp)"
    )
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument(
        "--type", choices=[*sorted(TYPES), "bf16"], default="Q4_1", help="bf16: converted, not quantized"
    )
    parser.add_argument("--spread", help="comma-separated directories (one per drive) to move the shards to")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.type == "bf16":
        convert(args.src, args.out_dir / "model", args.llama_cpp, args.shards, outtype="bf16")
    else:
        f32 = convert(args.src, args.out_dir / "f32", args.llama_cpp, args.shards)
        try:
            quantize(f32[0], args.out_dir / "model", args.type, split=len(f32) > 1)
        finally:
            for shard in f32:
                shard.unlink()
    shards = sorted(args.out_dir.glob("model*.gguf"))
    places = [Path(d) for d in args.spread.split(",")] if args.spread else []
    for i, shard in enumerate(shards):
        if places:
            moved = places[i % len(places)] / shard.name
            shutil.move(shard, moved)
            shard.symlink_to(moved)
        print(shard.resolve(), shard.stat().st_size)


if __name__ == "__main__":
    main()
