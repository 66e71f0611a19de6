"""An HF Mixtral checkpoint rewritten as the same function in Qwen2-MoE's layout, for fastllm (`ftllm` 1.9.0), which
has no Mixtral model (`ftllm` on a Mixtral folder: "FastLLM Error: Unsupport graph model type mixtral"; its
library names no mixtral or mistral type) but runs qwen2_moe with disk experts.

Qwen2-MoE is Mixtral plus three things, each set here so that it adds nothing: biases on q/k/v (written as zeros),
a shared expert scaled by sigmoid(shared_expert_gate) (all its weights zeros, so its output is exactly zero), and the
routing weights (softmax over all experts, top-k, renormalised over the k when `norm_topk_prob`: the same weights
as Mixtral's softmax over the top-k logits). fastllm does not honour `norm_topk_prob` (its library never reads the
key; on a random Mixtral its tokens are transformers' Qwen2-MoE's with `norm_topk_prob` false, not true): its weights
are the softmax over all experts. For a gate scaled by a tiny epsilon (bench/peer_trained_model.py's export: every
softmax is uniform within epsilon), `--down-scale E/k` makes that the same sum: 1/E x E/k = 1/k, within epsilon
(a power of two is exact in any float format). A tied LM head is also written as `lm_head.weight` (fastllm's
qwen2_moe reads it whatever `tie_word_embeddings` says). The other tensors are copied bit for bit.

    python -m bench.peer_qwen2_moe_copy MIXTRAL_DIR OUT_DIR [--shared 12] [--down-scale 8]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx

RENAMES = (
    (".block_sparse_moe.gate.", ".mlp.gate."),
    (".w1.weight", ".gate_proj.weight"),
    (".w2.weight", ".down_proj.weight"),
    (".w3.weight", ".up_proj.weight"),
    (".block_sparse_moe.experts.", ".mlp.experts."),
)


def qwen2_moe_config(config: dict, shared: int) -> dict:
    """Mixtral's config as Qwen2-MoE's: every layer sparse, top-k renormalised, a shared expert of `shared`."""
    kept = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "rms_norm_eps", "rope_theta", "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
            "eos_token_id", "hidden_act", "head_dim")  # fmt: skip
    return {
        **{key: config[key] for key in kept if key in config},
        "model_type": "qwen2_moe",
        "architectures": ["Qwen2MoeForCausalLM"],
        "torch_dtype": config.get("dtype") or config.get("torch_dtype") or "float32",
        "num_experts": config["num_local_experts"],
        "num_experts_per_tok": config["num_experts_per_tok"],
        "moe_intermediate_size": config["intermediate_size"],
        "intermediate_size": config["intermediate_size"],
        "shared_expert_intermediate_size": shared,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "use_sliding_window": False,
        "qkv_bias": True,
    }


def rewritten(tensors: dict[str, mx.array], config: dict, shared: int, down_scale: float = 1.0) -> dict[str, mx.array]:
    """One shard's tensors renamed into Qwen2-MoE's layout, with the zero biases and zero shared expert of every
    layer whose attention this shard holds, each expert's down projection times `down_scale`."""
    out = {}
    for name, value in tensors.items():
        for old, new in RENAMES:
            name = name.replace(old, new)
        if ".mlp.experts." in name and name.endswith(".down_proj.weight") and down_scale != 1.0:
            value = (value * down_scale).astype(value.dtype)
        out[name] = value
        if name == "model.embed_tokens.weight" and config.get("tie_word_embeddings"):
            out["lm_head.weight"] = value
        if name.endswith(".self_attn.q_proj.weight"):
            layer = name.removesuffix(".self_attn.q_proj.weight")
            dtype, hidden = value.dtype, config["hidden_size"]
            kv = config["num_key_value_heads"] * config.get("head_dim", hidden // config["num_attention_heads"])
            out[f"{layer}.self_attn.q_proj.bias"] = mx.zeros((value.shape[0],), dtype)
            out[f"{layer}.self_attn.k_proj.bias"] = mx.zeros((kv,), dtype)
            out[f"{layer}.self_attn.v_proj.bias"] = mx.zeros((kv,), dtype)
            out[f"{layer}.mlp.shared_expert.gate_proj.weight"] = mx.zeros((shared, hidden), dtype)
            out[f"{layer}.mlp.shared_expert.up_proj.weight"] = mx.zeros((shared, hidden), dtype)
            out[f"{layer}.mlp.shared_expert.down_proj.weight"] = mx.zeros((hidden, shared), dtype)
            out[f"{layer}.mlp.shared_expert_gate.weight"] = mx.zeros((1, hidden), dtype)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--shared", type=int, default=12, help="the zero shared expert's neurons")
    parser.add_argument("--down-scale", type=float, default=1.0, help="times every expert's down projection")
    args = parser.parse_args()
    config = json.loads((args.src / "config.json").read_text())
    if config.get("model_type") != "mixtral":
        raise SystemExit(f"{args.src} is a {config.get('model_type')!r} checkpoint; give a Mixtral one")
    if args.out.exists():
        raise SystemExit(f"{args.out} exists; give a new directory")
    staging = args.out.with_name(args.out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    weight_map = {}
    for path in sorted(args.src.iterdir()):
        if path.suffix == ".safetensors":
            tensors = rewritten(mx.load(str(path)), config, args.shared, args.down_scale)
            mx.save_safetensors(str(staging / path.name), tensors, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(tensors, path.name))
        elif path.name == "config.json":
            (staging / path.name).write_text(json.dumps(qwen2_moe_config(config, args.shared), indent=2))
        elif path.name.startswith(("tokenizer", "special_tokens", "generation_config")):
            shutil.copy2(path, staging / path.name)
    if (args.src / "model.safetensors.index.json").exists():
        index = {"metadata": {}, "weight_map": weight_map}
        (staging / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    staging.rename(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
