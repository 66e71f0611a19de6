"""GGUF -> MLX conversion: exact on quantized blocks, right on rotary layout, clear on bad files."""

from __future__ import annotations

import json

import gguf
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import llama
from mlx_lm.utils import load_model

from nightshift.engine.errors import ModelFormatError, UnsupportedModelError
from nightshift.engine.store.gguf_import import GGUFFile, convert_gguf
from nightshift.engine.store.gguf_quant import convert_quantized
from tests.helpers.gguf_files import TINY, dequantize_blocks, write_tiny_llama


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def tiny_model_dir(tiny_gguf, tmp_path_factory):
    return convert_gguf(tiny_gguf, tmp_path_factory.mktemp("models") / "tiny")


def test_quantized_tensors_convert_bit_exactly(tiny_gguf):
    seen = set()
    for tensor in GGUFFile(tiny_gguf).tensors():
        type_name = tensor.tensor_type.name
        if type_name not in ("Q4_1", "Q8_0"):
            continue
        seen.add(type_name)
        rows = int(tensor.shape[1])
        reference = dequantize_blocks(tensor.data, type_name, rows)
        np.testing.assert_array_equal(reference, gguf.quants.dequantize(tensor.data, tensor.tensor_type))

        q = convert_quantized(type_name, tensor.data, rows)
        ours = mx.dequantize(
            mx.array(q.weight),
            mx.array(q.scales.astype(np.float32)),
            mx.array(q.biases.astype(np.float32)),
            group_size=32,
            bits=q.bits,
        )
        np.testing.assert_array_equal(np.array(ours), reference, err_msg=tensor.name)
        assert q.scales.dtype == np.float16 and q.biases.dtype == np.float16
    assert seen == {"Q4_1", "Q8_0"}


def _reference_llama(gguf_path) -> llama.Model:
    """mlx-lm's llama in float32 on the GGUF's own (rotary-permuted) Q/K rows, traditional RoPE."""
    h, heads = TINY["hidden"], TINY["heads"]
    args = llama.ModelArgs(
        model_type="llama", hidden_size=h, num_hidden_layers=TINY["layers"], intermediate_size=TINY["ffn"],
        num_attention_heads=heads, num_key_value_heads=TINY["kv_heads"], rms_norm_eps=1e-5,
        vocab_size=0, rope_theta=10000.0, rope_traditional=True, tie_word_embeddings=True, head_dim=h // heads,
    )  # fmt: skip
    names = {
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }  # fmt: skip
    weights = {}
    for tensor in GGUFFile(gguf_path).tensors():
        shape = tuple(int(n) for n in reversed(tensor.shape))
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape).astype(np.float32)
        if tensor.name == "token_embd.weight":
            args.vocab_size = shape[0]
            name = "model.embed_tokens.weight"
        elif tensor.name == "output_norm.weight":
            name = "model.norm.weight"
        else:
            _, layer, kind, _ = tensor.name.split(".")
            name = f"model.layers.{layer}.{names[kind]}.weight"
        weights[name] = mx.array(values)
    model = llama.Model(args)
    model.load_weights(list(weights.items()))
    return model


def test_converted_model_matches_llama_cpp_rotary_layout(tiny_gguf, tiny_model_dir):
    ours, config = load_model(tiny_model_dir)
    assert config["rope_traditional"] is False
    reference = _reference_llama(tiny_gguf)
    tokens = mx.array([[5, 80, 120, 3, 200, 17, 260, 42, 99, 150, 7, 31]])
    got = ours(tokens).astype(mx.float32)
    want = reference(tokens)
    scale = float(mx.abs(want).max())
    np.testing.assert_allclose(np.array(got), np.array(want), atol=0.02 * scale)


def test_config_keeps_quantized_layers_quantized(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["quantization"]["bits"] == 4 and config["quantization"]["group_size"] == 32
    assert config["quantization"]["model.embed_tokens"] == {"group_size": 32, "bits": 8}
    weights = mx.load(str(tiny_model_dir / "model.safetensors"))
    assert weights["model.layers.0.mlp.up_proj.weight"].dtype == mx.uint32
    assert weights["model.layers.0.mlp.up_proj.scales"].dtype == mx.float16
    assert weights["model.norm.weight"].dtype == mx.float32


def test_missing_gguf_is_a_clear_error(tmp_path):
    with pytest.raises(ModelFormatError, match="not found"):
        convert_gguf(tmp_path / "absent.gguf", tmp_path / "out")


def test_truncated_gguf_is_a_clear_error_and_writes_nothing(tiny_gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size // 2])
    with pytest.raises(ModelFormatError, match=r"cut\.gguf"):
        convert_gguf(cut, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf"]


def test_garbage_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 100)
    with pytest.raises(ModelFormatError, match="not a readable GGUF"):
        convert_gguf(bad, tmp_path / "out")


def test_unknown_architecture_is_refused(tmp_path):
    path = write_tiny_llama(tmp_path / "falcon.gguf", arch="falcon")
    with pytest.raises(UnsupportedModelError, match="'falcon' is not supported"):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_tensor_type_without_exact_form_is_refused(tmp_path):
    path = write_tiny_llama(tmp_path / "q5.gguf", linear_type="Q5_0")
    with pytest.raises(UnsupportedModelError, match="Q5_0"):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.partial-*"))
