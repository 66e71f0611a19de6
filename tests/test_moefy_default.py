"""The sparse default model: the real default model MoEfied and imported into the store."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from nightshift.app.default_model import prepare_sparse_default_model, require_default_model
from nightshift.engine.runtime import open_model
from nightshift.engine.store.moefy_defaults import DEFAULT_EXPERTS, DEFAULT_K

pytestmark = [pytest.mark.slow, pytest.mark.model]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_preparing_again_changes_nothing_and_the_default_is_the_sparse_store(sparse_store, monkeypatch):
    store, home = sparse_store
    monkeypatch.setenv("NIGHTSHIFT_HOME", str(home))
    manifest = (store / "manifest.json").stat().st_mtime_ns
    assert prepare_sparse_default_model(say=lambda message: None) == store == require_default_model()
    assert (store / "manifest.json").stat().st_mtime_ns == manifest
    assert not list((home / "cache").glob("*-moe*")), "the MoE checkpoint is removed once imported"


def test_every_expert_active_reproduces_the_dense_model(default_model_dir, sparse_store):
    dense, sparse = open_model(default_model_dir), open_model(sparse_store[0])
    assert [layer.mlp.num_experts_per_tok for layer in sparse.model.layers] == [DEFAULT_K] * 30
    for layer in sparse.model.layers:
        layer.mlp.num_experts_per_tok = DEFAULT_EXPERTS
    prompt = dense.chat_tokens(QUESTION)
    expected, got = (np.array(m.model(mx.array(prompt)[None])) for m in (dense, sparse))
    # float32 sums in another order, through 30 layers whose activations reach ~1e3: 1e-2 of the logit range.
    assert np.abs(got - expected).max() < 1e-2 * np.abs(expected).max()
    greedy = [[c.token for c in m.generate_tokens(prompt, max_tokens=32)] for m in (dense, sparse)]
    assert greedy[0] == greedy[1]


def test_default_k_answers_sensibly(sparse_store):
    answer = "".join(chunk.text for chunk in open_model(sparse_store[0]).generate(QUESTION, max_tokens=24))
    assert "Paris" in answer
