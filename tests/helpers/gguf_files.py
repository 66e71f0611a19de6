"""Small GGUF files written by the tests with the `gguf` package's writer.

A tiny llama with seeded random weights and a byte-level BPE vocabulary, in the
tensor types the default model uses (F32 norms, Q8_0 embedding, Q4_1 linears),
plus raw-block dequantization written here independently of nightshift's code.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from tokenizers import pre_tokenizers

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "r e"]

TINY = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 128}


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """Specials first, then the 256 byte symbols, then one token per merge."""
    tokens = SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens += [m.replace(" ", "") for m in MERGES]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, types, MERGES


def write_tiny_llama(path: Path, seed: int = 0, arch: str = "llama", linear_type: str = "Q4_1") -> Path:
    """Write a 2-layer llama GGUF; `arch` may be set to something unsupported for error tests."""
    rng = np.random.default_rng(seed)
    tokens, types, merges = tiny_vocab()
    h, ffn = TINY["hidden"], TINY["ffn"]
    head_dim = h // TINY["heads"]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(TINY["layers"])
    writer.add_context_length(256)
    writer.add_embedding_length(h)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(TINY["heads"])
    writer.add_head_count_kv(TINY["kv_heads"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(2)
    writer.add_chat_template(CHATML)

    qtype = getattr(gguf.GGMLQuantizationType, linear_type)

    def matrix(name: str, rows: int, cols: int, kind=qtype, scale: float = 0.2) -> None:
        w = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            writer.add_tensor(name, w.astype(np.float16 if kind == gguf.GGMLQuantizationType.F16 else np.float32))
        else:
            writer.add_tensor(name, gguf.quants.quantize(w, kind), raw_dtype=kind)

    matrix("token_embd.weight", len(tokens), h, gguf.GGMLQuantizationType.Q8_0, scale=1.0)
    writer.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(h)).astype(np.float32))
    kv = TINY["kv_heads"] * head_dim
    for layer in range(TINY["layers"]):
        p = f"blk.{layer}."
        writer.add_tensor(p + "attn_norm.weight", (1 + 0.1 * rng.standard_normal(h)).astype(np.float32))
        writer.add_tensor(p + "ffn_norm.weight", (1 + 0.1 * rng.standard_normal(h)).astype(np.float32))
        matrix(p + "attn_q.weight", h, h)
        matrix(p + "attn_k.weight", kv, h)
        matrix(p + "attn_v.weight", kv, h)
        matrix(p + "attn_output.weight", h, h)
        matrix(p + "ffn_gate.weight", ffn, h)
        matrix(p + "ffn_up.weight", ffn, h)
        matrix(p + "ffn_down.weight", h, ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


Q4_1_BLOCK = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))])
Q8_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", (32,))])


def dequantize_blocks(raw: np.ndarray, type_name: str, rows: int) -> np.ndarray:
    """Reference dequantization from the ggml block definitions, in float32."""
    if type_name == "Q4_1":
        b = np.ascontiguousarray(raw).view(Q4_1_BLOCK).reshape(rows, -1)
        q = np.concatenate([b["qs"] & 0x0F, b["qs"] >> 4], axis=-1).astype(np.float32)
        values = b["d"].astype(np.float32)[..., None] * q + b["m"].astype(np.float32)[..., None]
    elif type_name == "Q8_0":
        b = np.ascontiguousarray(raw).view(Q8_0_BLOCK).reshape(rows, -1)
        values = b["d"].astype(np.float32)[..., None] * b["qs"].astype(np.float32)
    else:
        raise ValueError(type_name)
    return values.reshape(rows, -1)
