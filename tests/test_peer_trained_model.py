"""The trained-routing model written as Mixtral for the peers (bench/peer_trained_model.py), on a tiny MoEfied llama.

- With the routers' bias zeroed, the bias-free gate fitted is the router and the float32 export computes the source's
  function, up to the epsilon of its softmax (each chosen expert's weight 1/k where the source's is 1).
- nightshift imports the bfloat16 export (a Mixtral with float experts) and generates, streamed and in RAM, the
  tokens mlx-lm generates from it (with float32 sums in `gather_mm`, the one operation mlx-lm lacks on a CPU).
"""

from __future__ import annotations

import shutil

import mlx.core as mx
import pytest
from mlx_lm.utils import load_model

from bench.peer_trained_model import EVALUATION_TEXT, MoeReference, export, float32_model
from nightshift.engine.models import get_classes
from tests.helpers.moe_families import PROMPT, STEPS, check_import, gather_mm_as_on_a_gpu, nightshift_tokens
from tests.helpers.reference import greedy_tokens
from tests.helpers.stores import tiny_moefy

QUIET = {"say": lambda message: None}


@pytest.fixture(scope="module")
def sparse_moe(tiny_dense, tmp_path_factory):
    """A tiny MoEfied llama at 2 of 8 experts (sparse: its routers decide)."""
    return tiny_moefy(tiny_dense, tmp_path_factory.mktemp("moe") / "moe", experts=8, k=2)


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
    outcome = check_import(src, tmp_path / "checked")
    assert outcome.refused is None and not outcome.differences, outcome
    with monkeypatch.context() as patch:
        patch.setattr(mx, "gather_mm", gather_mm_as_on_a_gpu(mx.gather_mm))
        expected = greedy_tokens(load_model(src, get_model_classes=get_classes)[0], STEPS, PROMPT)
    for streamed in (False, True):
        tokens, stopped = nightshift_tokens(tmp_path / "checked" / "store", streamed)
        assert tokens == (expected[: len(tokens)] if stopped else expected), f"streamed={streamed}"
