"""A random MixtralForCausalLM shaped like the trained-routing bench model (SmolLM2-135M MoEfied: hidden 576, 9 heads
of 64 over 3 KV heads, tied embeddings, 128 experts of 12 neurons, 16 active, bf16) with a few layers, saved by
transformers' own `save_pretrained`, so every peer's Mixtral loader can be tried before the real export exists.
Run with a venv that has torch and transformers (the AirLLM one):

    /work/peers/airllm/venv/bin/python bench/peers/tiny_mixtral.py OUT [--layers 2] [--std 0.02] [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from transformers import MixtralConfig, MixtralForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--neurons", type=int, default=12, help="neurons per expert")
    parser.add_argument("--std", type=float, default=0.02, help="weights' init std (larger: less uniform output)")
    parser.add_argument("--tokenizer", type=Path, help="a folder whose tokenizer.json/tokenizer_config.json to copy")
    args = parser.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} exists; give a new directory")
    torch.manual_seed(0)
    config = MixtralConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=args.neurons, num_hidden_layers=args.layers,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, num_local_experts=128, num_experts_per_tok=16,
        rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192, tie_word_embeddings=True,
        sliding_window=None, torch_dtype="bfloat16", initializer_range=args.std,
    )  # fmt: skip
    model = MixtralForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(args.out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if args.tokenizer and (args.tokenizer / name).exists():
            shutil.copy2(args.tokenizer / name, args.out / name)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
