"""The trained-routing model written as Mixtral for the peers (bench/peer_trained_model.py), on a tiny MoEfied llama.

- With the routers' bias zeroed, the bias-free gate fitted is the router and the float32 export computes the source's
  function, up to the epsilon of its softmax (each chosen expert's weight 1/k where the source's is 1).
- Padding each expert with zero neurons keeps every weight and adds zeros only: logits equal up to float32 summation
  order.
- The bfloat16 export stores its norms and gates in bfloat16, as a real bf16 checkpoint does
  (`norm_gate_dtype="float32"` keeps them float32), and nightshift imports it and generates, streamed and in
  RAM, the tokens mlx-lm generates from it (with float32 sums in `gather_mm`, the one operation mlx-lm lacks on a
  CPU), its activations bf16.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.utils import load_model

from bench.gpu_gather_mm import gather_mm_as_on_a_gpu
from bench.helpers.moe_families import PROMPT, STEPS, check_import, nightshift_tokens
from bench.helpers.reference import greedy_tokens
from bench.peer_trained_model import EVALUATION_TEXT, MoeReference, export, float32_model
from nightshift.engine.models import get_classes
from nightshift.engine.store.loader import load_store
from tests.helpers.shared import built_once
from tests.helpers.stores import tiny_moefy

QUIET = {"say": lambda message: None}


@pytest.fixture(scope="session")
def sparse_moe(tiny_dense, tmp_path_factory) -> Path:
    """A tiny MoEfied llama at 2 of 8 experts (sparse: its routers decide), built once per session: tests read it,
    and copy it to change it."""
    return (
        built_once(tmp_path_factory, "sparse-moe", lambda f: tiny_moefy(tiny_dense, f / "moe", experts=8, k=2)) / "moe"
    )


@pytest.mark.slow
def test_without_the_routers_bias_the_export_is_the_same_function(sparse_moe, tmp_path):
    source = tmp_path / "unbiased"
    shutil.copytree(sparse_moe, source)
    weights = mx.load(str(source / "model.safetensors"))
    for name in [name for name in weights if name.endswith("router.bias")]:
        weights[name] = mx.zeros_like(weights[name])
    mx.save_safetensors(str(source / "model.safetensors"), weights, {"format": "pt"})
    measured = export(source, tmp_path / "mixtral", dtype="float32", **QUIET)
    assert measured["top_token_agreement"] == 1.0
    reference, exported = MoeReference(source), float32_model(tmp_path / "mixtral")
    window = reference.windows(EVALUATION_TEXT.read_text())[0][:, :48]
    a, b = reference.model(window), exported(window)
    assert float(mx.max(mx.abs(a - b))) < 1e-3 * float(mx.max(mx.abs(a)))
    with pytest.raises(SystemExit, match="exists"):
        export(source, tmp_path / "mixtral", **QUIET)


@pytest.mark.slow
def test_nightshift_imports_the_bfloat16_export_and_generates_mlx_lms_tokens(sparse_moe, tmp_path, monkeypatch):
    src = tmp_path / "mixtral"
    export(sparse_moe, src, **QUIET)
    assert (src / "README.txt").is_file() and not (tmp_path / "mixtral.partial").exists()
    assert dtypes(src) == {"gate": {mx.bfloat16}, "norm": {mx.bfloat16}, "other": {mx.bfloat16}}
    outcome = check_import(src, tmp_path / "checked")
    assert outcome.refused is None and not outcome.differences, outcome
    with monkeypatch.context() as patch:
        patch.setattr(mx, "gather_mm", gather_mm_as_on_a_gpu(mx.gather_mm))
        expected = greedy_tokens(load_model(src, get_model_classes=get_classes)[0], STEPS, PROMPT)
    for streamed in (False, True):
        tokens, stopped = nightshift_tokens(tmp_path / "checked" / "store", streamed)
        assert tokens == (expected[: len(tokens)] if stopped else expected), f"streamed={streamed}"
    model = load_store(tmp_path / "checked" / "store")[0]
    assert model(mx.array([PROMPT])).dtype == mx.bfloat16  # no float32 activations, so no float32 weight copies


@pytest.mark.slow
def test_float32_norms_and_gates_on_request(sparse_moe, tmp_path):
    export(sparse_moe, tmp_path / "mixtral", norm_gate_dtype="float32", **QUIET)
    assert dtypes(tmp_path / "mixtral") == {"gate": {mx.float32}, "norm": {mx.float32}, "other": {mx.bfloat16}}
    assert "the norms and the gates float32" in (tmp_path / "mixtral" / "README.txt").read_text().replace("\n", " ")


def dtypes(export_dir) -> dict[str, set]:
    """The dtypes an export holds: its gates', its norms', every other tensor's."""
    found: dict[str, set] = {"gate": set(), "norm": set(), "other": set()}
    for name, weight in mx.load(str(export_dir / "model.safetensors")).items():
        kind = "gate" if name.endswith("moe.gate.weight") else "norm" if "norm" in name else "other"
        found[kind].add(weight.dtype)
    return found


@pytest.mark.slow
def test_padding_experts_with_zero_neurons_keeps_the_function(sparse_moe, tmp_path):
    export(sparse_moe, tmp_path / "plain", **QUIET)
    neurons = 3 * MoeReference(sparse_moe).config["intermediate_size"] // 8
    export(sparse_moe, tmp_path / "padded", neurons=neurons, **QUIET)
    with pytest.raises(SystemExit, match="fewer than"):
        export(sparse_moe, tmp_path / "too-few", neurons=1, **QUIET)
    plain, padded = (mx.load(str(tmp_path / name / "model.safetensors")) for name in ("plain", "padded"))
    own = plain["model.layers.0.block_sparse_moe.experts.0.w1.weight"].shape[0]
    for name, weight in padded.items():
        if ".w2." in name:
            assert weight.shape[1] == neurons and mx.array_equal(weight[:, :own], plain[name]), name
            assert not mx.any(weight[:, own:]), name
        elif ".experts." in name:
            assert weight.shape[0] == neurons and mx.array_equal(weight[:own], plain[name]), name
            assert not mx.any(weight[own:]), name
        else:
            assert mx.array_equal(weight, plain[name]), name
    window = MoeReference(sparse_moe).windows(EVALUATION_TEXT.read_text())[0][:, :48]
    a, b = (float32_model(tmp_path / name)(window) for name in ("plain", "padded"))
    # The same function; float32 sums over 12 or 36 terms (the extra ones zero) may be blocked differently.
    assert float(mx.max(mx.abs(a - b))) < 1e-5 * float(mx.max(mx.abs(a)))
    assert mx.array_equal(mx.argmax(a, -1), mx.argmax(b, -1))
