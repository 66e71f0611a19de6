"""The families and sizes a synthetic checkpoint can take: each family's config.json and how its
checkpoints name and encode routed experts (engine/store/synth.py writes them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx


def _mla(hidden: int) -> dict:
    heads = 4 if hidden <= 128 else 8
    return dict(
        num_attention_heads=heads,
        num_key_value_heads=heads,
        kv_lora_rank=32,
        q_lora_rank=None,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
    )


def kimi_k3(hidden: int, layers: int, experts: int, active: int, expert_hidden: int, vocab: int) -> dict:
    return dict(
        model_type="kimi_k3",
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=2 * hidden,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        linear_attn_config={
            "kda_layers": list(range(2, layers + 1, 2)),
            "num_heads": 4,
            "head_dim": 16,
            "short_conv_kernel_size": 4,
        },
        num_experts=experts,
        num_experts_per_token=active,
        num_shared_experts=1,
        moe_intermediate_size=expert_hidden,
        first_k_dense_replace=1,
        quantization_config={"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized"},
        **_mla(hidden),
    )


def deepseek_v3(hidden: int, layers: int, experts: int, active: int, expert_hidden: int, vocab: int) -> dict:
    return dict(
        model_type="deepseek_v3",
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=2 * hidden,
        moe_intermediate_size=expert_hidden,
        n_routed_experts=experts,
        n_shared_experts=1,
        num_experts_per_tok=active,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        rms_norm_eps=1e-6,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        **_mla(hidden),
    )


def kimi_k2(*sizes: int) -> dict:
    """Kimi K2 is a DeepSeek V3 architecture under its own model_type (mlx-lm maps it back)."""
    return {**deepseek_v3(*sizes), "model_type": "kimi_k2"}


def qwen3_moe(hidden: int, layers: int, experts: int, active: int, expert_hidden: int, vocab: int) -> dict:
    return dict(
        model_type="qwen3_moe",
        architectures=["Qwen3MoeForCausalLM"],  # as released: llama.cpp's converter picks its model class by it
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=2 * hidden,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=experts,
        num_experts_per_tok=active,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        moe_intermediate_size=expert_hidden,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        max_position_embeddings=2048,
        norm_topk_prob=True,
    )


def mixtral(hidden: int, layers: int, experts: int, active: int, expert_hidden: int, vocab: int) -> dict:
    return dict(
        model_type="mixtral",
        architectures=["MixtralForCausalLM"],
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=expert_hidden,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=experts,
        num_experts_per_tok=active,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
    )


def gpt_oss(hidden: int, layers: int, experts: int, active: int, expert_hidden: int, vocab: int) -> dict:
    return dict(
        model_type="gpt_oss",
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=expert_hidden,
        head_dim=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=experts,
        num_experts_per_tok=active,
        sliding_window=16,
        rope_theta=10000,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        quantization_config={"quant_method": "mxfp4"},
    )


@dataclass(frozen=True)
class ExpertLayout:
    """How a family's checkpoints name and encode routed experts.

    `template` is the per-expert key under the layer (None: gpt_oss's stacked, fused gate_up layout);
    `renames` maps mlx-lm projection names to the checkpoint's; `mxfp4` says experts ship packed MXFP4.
    Unquantized experts are float32: mlx's CPU `gather_mm` takes nothing else.
    """

    config: Callable[..., dict]
    template: str | None
    renames: dict[str, str]
    mxfp4: bool

    @property
    def dtype(self) -> mx.Dtype:
        return mx.bfloat16 if self.mxfp4 else mx.float32


W123 = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
FAMILIES: dict[str, ExpertLayout] = {
    "kimi_k3": ExpertLayout(kimi_k3, "block_sparse_moe.experts.{e}.{proj}", W123, mxfp4=True),
    "deepseek_v3": ExpertLayout(deepseek_v3, "mlp.experts.{e}.{proj}", {}, mxfp4=False),
    "kimi_k2": ExpertLayout(kimi_k2, "mlp.experts.{e}.{proj}", {}, mxfp4=False),
    "qwen3_moe": ExpertLayout(qwen3_moe, "mlp.experts.{e}.{proj}", {}, mxfp4=False),
    "mixtral": ExpertLayout(mixtral, "block_sparse_moe.experts.{e}.{proj}", W123, mxfp4=False),
    "gpt_oss": ExpertLayout(gpt_oss, None, {}, mxfp4=True),
}

# preset -> (hidden, layers, experts, active, expert hidden, vocab)
PRESETS = {
    "tiny": (64, 3, 8, 2, 64, 512),
    # Mid-size: 27 MB of MXFP4 experts per layer (kimi_k3), for memory measurements.
    "small": (512, 5, 64, 8, 512, 1024),
    # Scaled-down Kimi K3: 12 MoE layers x 128 experts (16 active), 1.6 MiB MXFP4 experts, 2.5 GB of experts.
    "bench": (1024, 13, 128, 16, 1024, 4096),
}
