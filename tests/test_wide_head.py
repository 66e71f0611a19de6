"""A tied output head narrower than the activations multiplies a wider copy made once at load (engine/store/head.py):
mlx-lm's tokens, streamed and in RAM, with no copy of the weight made by a step."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest

from bench.helpers.moe_families import FamilyError, build, moe_families, random_weights, tiny_config
from bench.helpers.reference import greedy_tokens
from nightshift.engine.moe.budget import step_copy_bytes, trunk_bytes, working_set_bytes
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import open_model
from nightshift.engine.store.families import build_model
from nightshift.engine.store.head import WideHead, hold_wide_heads, tied_embeddings, vocab_size
from nightshift.engine.store.loader import layer_experts, load_store
from nightshift.engine.store.manifest import read_manifest

STEPS = 24


@pytest.mark.parametrize("shape", [(1, 1, 64), (2, 7, 64), (300, 64)])
def test_a_float32_product_with_a_bf16_weight_is_the_product_with_its_float32_cast(shape):
    """MLX promotes the bf16 weight by an exact cast and runs the same GEMM: the held copy gives the same bits."""
    weight = mx.random.normal((1000, 64), key=mx.random.key(1)).astype(mx.bfloat16)
    x = mx.random.normal(shape, key=mx.random.key(2))
    assert mx.array_equal(x @ weight.T, x @ weight.T.astype(mx.float32)).item()
    assert mx.array_equal(nn.Embedding(1000, 64).update({"weight": weight}).as_linear(x), x @ weight.T).item()
    assert mx.array_equal(WideHead(weight, mx.float32).as_linear(x), x @ weight.T).item()


class Tiny(nn.Module):
    """A bf16 embedding and another table beside a float32 norm (float32 activations), with or without its own
    output projection."""

    def __init__(self, head: bool = False, dtype: mx.Dtype = mx.bfloat16):
        super().__init__()
        self.embed_tokens = nn.Embedding(100, 8)
        self.embed_tokens.weight = self.embed_tokens.weight.astype(dtype)
        self.ngrams = nn.Embedding(300, 8)  # not the vocabulary's: never a head
        self.ngrams.weight = self.ngrams.weight.astype(mx.bfloat16)
        self.norm = nn.RMSNorm(8)
        if head:
            self.lm_head = nn.Linear(8, 100, bias=False)


@pytest.mark.parametrize(
    "model, wide",
    [(Tiny(), True), (Tiny(head=True), False), (Tiny(dtype=mx.float32), False)],
    ids=["tied bf16", "own head", "as wide as the activations"],
)
def test_only_a_tied_embedding_narrower_than_the_activations_gets_a_wide_copy(model, wide):
    weight = model.embed_tokens.weight
    hold_wide_heads(model, {"text_config": {"vocab_size": 100}})
    assert isinstance(model.embed_tokens, WideHead) == wide
    assert type(model.ngrams) is nn.Embedding
    assert model.embed_tokens.weight is weight  # the lookup reads the stored weight: its output dtype is unchanged
    assert "_wide_t" not in dict(model.embed_tokens.parameters())  # held, not a parameter to load or save


def _family_cases() -> list:
    return [pytest.param(f, id=f, marks=() if f == "mixtral" else pytest.mark.slow) for f in moe_families()]


@pytest.mark.parametrize("family", _family_cases())
def test_every_family_that_ties_its_head_multiplies_the_held_copy_with_the_same_tokens(family):
    """Each MoE family of the installed mlx-lm with its embedding tied (its options on), bf16 beside float32: the
    held copy is found wherever the family keeps its embedding, and the greedy tokens do not move."""
    try:
        config = tiny_config(family, options=True)
        model = build(family, config)
    except FamilyError as exc:
        pytest.skip(str(exc))
    model.load_weights(list(random_weights(family, config=config).items()))
    tied = tied_embeddings(model, vocab_size(config))
    if not tied:
        pytest.skip(f"{family} has no tied head even with its options on")
    for _, embedding in tied:
        embedding.weight = embedding.weight.astype(mx.bfloat16)
    expected = greedy_tokens(model, 8)
    hold_wide_heads(model, config)
    assert all(isinstance(module, WideHead) for _, module in tied_embeddings(model, vocab_size(config)))
    assert greedy_tokens(model, 8) == expected


def test_a_step_narrower_than_the_copy_multiplies_the_stored_weight():
    weight = mx.random.normal((100, 8), key=mx.random.key(3)).astype(mx.bfloat16)
    x = mx.random.normal((1, 8), key=mx.random.key(4)).astype(mx.bfloat16)
    out = WideHead(weight, mx.float32).as_linear(x)
    assert out.dtype == mx.bfloat16
    assert mx.array_equal(out, x @ weight.T).item()


@pytest.fixture(scope="module")
def tied_store(stores, tmp_path_factory) -> Path:
    """The tiny qwen3_moe store with its head tied to a bf16 embedding, float32 elsewhere (so float32 activations),
    as the Mixtral bench export's; its experts stay on the drives the manifest names."""
    store = tmp_path_factory.mktemp("tied") / "store"
    shutil.copytree(stores["qwen3_moe"], store)
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["config"]["tie_word_embeddings"] = True
    (store / "manifest.json").write_text(json.dumps(manifest))
    trunk = store / manifest["trunk"]["file"]
    tensors = {name: value for name, value in mx.load(str(trunk)).items() if not name.endswith("lm_head.weight")}
    embedding = next(name for name in tensors if name.endswith("embed_tokens.weight"))
    tensors[embedding] = tensors[embedding].astype(mx.bfloat16)
    mx.save_safetensors(str(trunk), tensors)
    return store


def mlx_lm_tokens(store: Path) -> list[int]:
    """mlx-lm's model of the store's family with the store's weights, every expert in RAM, as mlx-lm runs it."""
    manifest = read_manifest(store)
    weights = dict(mx.load(str(store / manifest.trunk["file"])))
    for layer in manifest.layers:
        weights.update(layer_experts(manifest, layer))
    model = build_model(manifest.config)
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    return greedy_tokens(model, STEPS)


def test_a_tied_bf16_head_under_float32_activations_gives_mlx_lms_tokens_streamed_and_in_ram(tied_store):
    expected = mlx_lm_tokens(tied_store)
    in_ram, _ = load_store(tied_store)
    streamed, _, stream = load_streaming(tied_store, StreamSettings())
    try:
        assert isinstance(in_ram.model.embed_tokens, WideHead)
        assert isinstance(streamed.model.embed_tokens, WideHead)
        assert greedy_tokens(in_ram, STEPS) == expected
        assert greedy_tokens(streamed, STEPS) == expected
    finally:
        stream.close()


def test_a_step_of_the_held_head_makes_no_copy_of_its_weight(tied_store):
    """mlx-lm's head casts the whole bf16 embedding to a fresh float32 array every step; the held one does not."""
    model, _ = load_store(tied_store)
    head = model.model.embed_tokens
    copy = head.weight.size * 4
    x = mx.random.normal((1, 1, head.weight.shape[1]), key=mx.random.key(5))
    mx.eval(x)

    def step_peak(embedding: nn.Embedding) -> int:
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        mx.eval(embedding.as_linear(x))
        return mx.get_peak_memory() - before

    assert step_peak(head) < copy <= step_peak(nn.Embedding(*head.weight.shape).update({"weight": head.weight}))


def test_the_held_copy_is_counted_with_the_trunk_and_not_again_in_the_buffer_cache(tied_store):
    """The budget counts the copy once, as the trunk's (held); MLX's buffer cache keeps only the working set."""
    manifest = read_manifest(tied_store)
    trunk = tied_store / manifest.trunk["file"]
    model, _ = load_store(tied_store)
    held = model.model.embed_tokens._wide_t.nbytes
    assert trunk_bytes(trunk)[0] == trunk.stat().st_size + held
    assert step_copy_bytes(trunk) == 0
    default = mx.set_cache_limit(1 << 40)  # as MLX's default on a GPU: its memory limit
    try:
        open_model(tied_store)
        assert mx.set_cache_limit(default) == working_set_bytes(manifest)
    finally:
        mx.set_cache_limit(default)
