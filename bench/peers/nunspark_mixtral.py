"""Mixtral for nunspark 0.13.0, which has no registry entry for it (run with the nunspark venv's python).

nunspark streams only the model types in its registry (`nunspark/architectures.py`, `_ARCH`: qwen3_moe, gpt_oss,
deepseek_v32, glm_moe_dsa, gemma4 among the MoE ones); `get_architecture('mixtral')` raises "unsupported model_type",
and `nunspark pack` of a Mixtral copy packs whole layers (no per-expert pieces). Mixtral meets the contract its
engine states (one causal mask, the stock KVCache, a plain RMSNorm, no embedding scale), but the engine's selective
MoE path reads the MoE block as `.mlp` (`engine.py`: `getattr(slot.mlp, ...)`, `f"mlp.{attr}..."`) where mlx-lm's
Mixtral layer calls it `block_sparse_moe`. So this module adds the missing entry without touching nunspark: mlx-lm's
own `MixtralDecoderLayer` with its MoE block under the name the engine reads, mlx-lm's own Mixtral routing (top-k of
the router's logits, then a softmax over those k, in mlx-lm's order), and the copy's keys renamed to match.

    python bench/peers/nunspark_mixtral.py convert HF_DIR MLX_DIR [--group-size 32]  # the 4-bit copy mlx-lm loads
    python bench/peers/nunspark_mixtral.py pack MLX_DIR PACKED_DIR                   # nunspark's pieces of it

`convert` pads every expert with zero neurons to a multiple of the group size first (MLX's affine 4-bit needs each
weight's input width divisible by it; a zero neuron adds nothing to an expert's output: silu(0) * 0 = 0, and its
down-projection column is never multiplied by anything else), then runs mlx-lm's own convert (4-bit, float32
activations: mlx[cpu]'s gather_mm computes float32 only).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.models import mixtral
from nunspark import architectures
from nunspark.archspec import ArchSpec

SITE = ".block_sparse_moe."  # mlx-lm's name of a Mixtral layer's MoE block
MLP = ".mlp."  # the name nunspark's engine reads


class Layer(mixtral.MixtralDecoderLayer):
    """mlx-lm's Mixtral layer with its MoE block as `mlp`, where nunspark's engine looks for it."""

    def __init__(self, args: mixtral.ModelArgs) -> None:
        super().__init__(args)
        self.mlp = self.block_sparse_moe
        del self.block_sparse_moe

    def __call__(self, x: mx.array, mask: mx.array | None = None, cache: object = None) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


def route(args: mixtral.ModelArgs, gates: mx.array) -> tuple[mx.array, mx.array]:
    """mlx-lm's MixtralSparseMoeBlock selection, step for step (the same order, so the same sums)."""
    k = args.num_experts_per_tok
    inds = mx.stop_gradient(mx.argpartition(-gates, kth=k - 1, axis=-1)[..., :k])
    return inds, mx.softmax(mx.take_along_axis(gates, inds, axis=-1), axis=-1, precise=True)


def register() -> None:
    """Add 'mixtral' to nunspark's registry (idempotent)."""
    architectures._ARCH["mixtral"] = ArchSpec(
        args_cls=mixtral.ModelArgs,
        block_factory=lambda args, _=0: Layer(args),
        layer_key_fn=lambda args, _: "moe",
        selective_moe=True,
        num_experts=lambda args: args.num_local_experts,
        moe_route=route,
    )


def padded_copy(src: Path, out: Path, multiple: int) -> int:
    """`src` (HF Mixtral safetensors) with every expert padded to a multiple of `multiple` neurons; the width."""
    config = json.loads((src / "config.json").read_text())
    neurons = config["intermediate_size"]
    width = -(-neurons // multiple) * multiple
    out.mkdir(parents=True)
    for path in sorted(src.iterdir()):
        if path.suffix == ".safetensors":
            tensors = mx.load(str(path))
            for name, value in tensors.items():
                if ".experts." in name and name.endswith(("w1.weight", "w3.weight")):
                    tensors[name] = mx.pad(value, [(0, width - neurons), (0, 0)])
                elif ".experts." in name and name.endswith("w2.weight"):
                    tensors[name] = mx.pad(value, [(0, 0), (0, width - neurons)])
            mx.save_safetensors(str(out / path.name), tensors, metadata={"format": "pt"})
        elif path.name == "config.json":
            (out / path.name).write_text(json.dumps({**config, "intermediate_size": width}, indent=2))
        elif path.is_file():
            shutil.copy2(path, out / path.name)
    return width


def convert(src: Path, out: Path, group_size: int) -> None:
    from mlx_lm import convert as mlx_convert

    if out.exists():
        raise SystemExit(f"{out} exists; give a new directory")
    staging = out.with_name(out.name + ".padded-hf")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        width = padded_copy(src, staging, group_size)
        mlx_convert(str(staging), mlx_path=str(out), quantize=True, q_group_size=group_size, q_bits=4, dtype="float32")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"wrote {out}: experts padded to {width} neurons, 4-bit, group {group_size}")


def pack(mlx_dir: Path, out: Path) -> None:
    from nunspark.packer import _copy_tokenizer_files
    from nunspark.packer import pack as nunspark_pack

    register()
    config = json.loads(json.dumps(json.loads((mlx_dir / "config.json").read_text())).replace(SITE, MLP))
    weights: dict[str, mx.array] = {}
    for path in sorted(mlx_dir.glob("model*.safetensors")):
        weights.update({name.replace(SITE, MLP): value for name, value in mx.load(str(path)).items()})
    nunspark_pack(None, out, weights=weights, config=config)
    _copy_tokenizer_files(mlx_dir, out)
    print(f"packed {config['num_hidden_layers']} layers of {mlx_dir} into {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="a padded 4-bit MLX copy of an HF Mixtral checkpoint")
    c.add_argument("src", type=Path)
    c.add_argument("out", type=Path)
    c.add_argument("--group-size", type=int, default=32)
    p = sub.add_parser("pack", help="nunspark's pieces of a Mixtral MLX copy")
    p.add_argument("mlx_dir", type=Path)
    p.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.command == "convert":
        convert(args.src, args.out, args.group_size)
    else:
        pack(args.mlx_dir, args.out)


if __name__ == "__main__":
    sys.exit(main())
