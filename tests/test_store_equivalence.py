"""A model loaded from the store computes exactly what mlx-lm computes from the original checkpoint.

Synthetic checkpoints (tiny presets) of each family are imported with the trunk kept at the
checkpoint's precision (`--trunk-bits 16`): every weight then reaches the model bit for bit, so
logits must match and greedy decoding must pick the same 32 tokens. The int8 trunk is a
deliberate approximation; its effect is measured in docs/results.md, and checked here only for
what must hold (it is quantized, smaller, and still loads and decodes).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.utils import load_model

from bench.helpers.reference import PROMPT, greedy_tokens
from nightshift.engine.io.drives import Drive
from nightshift.engine.models import get_classes
from nightshift.engine.runtime import open_model
from nightshift.engine.store.importer import ImportOptions, import_checkpoint
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.manifest import read_manifest
from nightshift.engine.store.safetensors_io import read_header
from nightshift.engine.store.synth_families import FAMILIES as SYNTH_FAMILIES
from tests.helpers.stores import import_tiny, tiny_checkpoint

FAMILIES = list(SYNTH_FAMILIES)


@pytest.fixture(scope="module")
def family_sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {arch: tiny_checkpoint(root, arch) for arch in FAMILIES}


@pytest.mark.parametrize("arch", FAMILIES)
def test_store_model_matches_mlx_lm_exactly(arch, family_sources, tmp_path):
    store = import_tiny(tmp_path, family_sources[arch], arch)
    reference, _ = load_model(family_sources[arch], get_model_classes=get_classes)
    loaded, _ = load_store(store)
    x = mx.array([PROMPT])
    expected, got = reference(x), loaded(x)
    assert got.dtype == expected.dtype
    assert mx.allclose(got, expected, rtol=1e-5, atol=1e-5).item()
    assert greedy_tokens(loaded) == greedy_tokens(reference)


def test_kimi_k3_experts_stay_mxfp4(family_sources, tmp_path):
    manifest = read_manifest(import_tiny(tmp_path, family_sources["kimi_k3"], "k"))
    for layer in manifest.layers:
        assert set(layer.quantization) == {"gate_proj", "up_proj", "down_proj"}
        assert all(q == {"mode": "mxfp4", "bits": 4, "group_size": 32} for q in layer.quantization.values())
        assert {(t.name, t.dtype) for t in layer.tensors} >= {("gate_proj.weight", "U32"), ("gate_proj.scales", "U8")}


def test_expert_files_are_page_aligned_and_split_in_whole_pages(family_sources, tmp_path):
    store = import_tiny(tmp_path, family_sources["gpt_oss"], "g")
    manifest = read_manifest(store)
    for layer in manifest.layers:
        assert layer.file_bytes % 8192 == 0  # whole file and each half: multiples of 4 KiB
        assert all(t.offset % 4096 == 0 for t in layer.tensors)
        assert {t.name for t in layer.tensors} >= {"gate_proj.bias", "down_proj.bias"}  # gpt_oss biases
        for expert in range(layer.num_experts):
            for _, path in manifest.replica_paths(layer.layer, expert):
                assert path.stat().st_size == layer.file_bytes


def test_int8_trunk_is_quantized_smaller_and_still_decodes(family_sources, tmp_path):
    exact = import_tiny(tmp_path, family_sources["qwen3_moe"], "q16", trunk_bits=16)
    int8 = import_tiny(tmp_path, family_sources["qwen3_moe"], "q8", trunk_bits=8)
    names = {entry.name for entry in read_header(int8 / "trunk.safetensors")}
    assert "model.embed_tokens.scales" in names and "model.layers.0.self_attn.q_proj.scales" in names
    assert (int8 / "trunk.safetensors").stat().st_size < 0.5 * (exact / "trunk.safetensors").stat().st_size
    assert read_manifest(int8).trunk["quantized"]["model.layers.0.mlp.gate"]["bits"] == 8
    assert len(greedy_tokens(load_store(int8)[0], steps=8)) == 8


def test_open_model_accepts_a_store_and_generates_with_its_tokenizer(family_sources, tmp_path):
    store = import_tiny(tmp_path, family_sources["kimi_k3"], "chat", trunk_bits=8, drives=1)
    model = open_model(store)
    chunks = list(model.generate([{"role": "user", "content": "Reconcile the bank account."}], max_tokens=6))
    assert len(chunks) == 6 and chunks[-1].stats.generated_tokens == 6


def test_quantize_experts_turns_float_experts_into_affine_4_bit(family_sources, tmp_path):
    store = tmp_path / "q4"
    import_checkpoint(
        family_sources["deepseek_v3"],
        store,
        [Drive("d", tmp_path / "d")],
        ImportOptions(trunk_bits=16, quantize_experts=True),
    )
    manifest = read_manifest(store)
    for layer in manifest.layers:
        assert all(q == {"mode": "affine", "bits": 4, "group_size": 64} for q in layer.quantization.values())
    float_bytes = 3 * 64 * 64 * 4  # three float32 64x64 projections
    assert sum(t.nbytes for t in manifest.layers[0].tensors) < float_bytes / 4  # before page padding
    reference, _ = load_model(family_sources["deepseek_v3"], get_model_classes=get_classes)
    x = mx.array([PROMPT])
    expected, got = reference(x), load_store(store)[0](x)
    assert not mx.array_equal(got, expected).item()  # 4-bit experts are an approximation...
    assert mx.abs(got - expected).max().item() < 0.5  # ...but of the same model


def test_mlx_lm_quantized_checkpoint_keeps_its_affine_experts(family_sources, tmp_path):
    """An mlx-lm 4-bit conversion (stacked affine experts, quantized trunk) imports unchanged."""
    from mlx_lm.convert import convert

    converted = tmp_path / "mlx-4bit"
    convert(str(family_sources["qwen3_moe"]), mlx_path=str(converted), quantize=True, q_bits=4, q_group_size=32)
    store = tmp_path / "store"
    import_checkpoint(converted, store, [Drive("d", tmp_path / "d")], ImportOptions(trunk_bits=16))
    for layer in read_manifest(store).layers:
        assert all(q == {"mode": "affine", "bits": 4, "group_size": 32} for q in layer.quantization.values())
    reference, _ = load_model(converted, get_model_classes=get_classes)
    x = mx.array([PROMPT])
    assert mx.array_equal(load_store(store)[0](x), reference(x)).item()
