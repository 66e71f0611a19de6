"""MoEfication on a tiny llama: grouping, router fit, exactness with every expert, top-k routing, CLI.

The fast forms of the calibration steps are checked bit for bit against plain statements of the
same algorithms (the oracles below), ties included: a speed-up must not change the model.
"""

from __future__ import annotations

import json
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from nightshift.app.cli import main
from nightshift.engine.errors import NightshiftError, UnsupportedModelError
from nightshift.engine.runtime import open_model
from nightshift.engine.store.moefy import (
    CALIBRATION_TEXT,
    EVALUATION_TEXT,
    DenseReference,
    _balanced_assign,
    _unit_means,
    fit_linear_router,
    group_neurons,
)
from tests.helpers.gguf_files import TINY
from tests.helpers.stores import EXPERTS, SHORT_CALIBRATION, tiny_moefy


@pytest.fixture(scope="module")
def tiny_moe(tiny_dense, tmp_path_factory):
    """The tiny llama MoEfied with every expert active."""
    out = tmp_path_factory.mktemp("moe") / "tiny-moe"
    return tiny_moefy(tiny_dense, out)


def test_grouping_is_a_partition_into_equal_groups():
    magnitude = np.abs(np.random.default_rng(1).normal(size=(300, 96)))
    groups = group_neurons(magnitude, 8)
    assert groups.shape == (8, 12)
    assert np.array_equal(np.sort(groups.reshape(-1)), np.arange(96))


def test_grouping_finds_neurons_that_fire_together():
    rng = np.random.default_rng(2)
    planted = rng.permutation(64).reshape(4, 16)
    magnitude = np.full((400, 64), 0.01)
    for token in range(400):
        magnitude[token, planted[rng.integers(4)]] = rng.uniform(1, 2, size=16)
    found = {frozenset(group) for group in group_neurons(magnitude, 4).tolist()}
    assert found == {frozenset(group) for group in planted.tolist()}


def plain_balanced_assign(similarity: np.ndarray, size: int) -> np.ndarray:
    """Rounds of proposals, a row and a column at a time: each unplaced row proposes to its most
    similar column with room (the first on ties); each column keeps its most similar proposers
    (the lowest rows on ties) up to its room."""
    rows, columns = similarity.shape
    assignment, room = [-1] * rows, [size] * columns
    while -1 in assignment:
        proposals: dict[int, list[int]] = {column: [] for column in range(columns)}
        for row in (row for row in range(rows) if assignment[row] < 0):
            best = max((column for column in range(columns) if room[column] > 0), key=lambda c: similarity[row, c])
            proposals[best].append(row)
        for column, rows_proposing in proposals.items():
            for row in sorted(rows_proposing, key=lambda r: -similarity[r, column])[: room[column]]:
                assignment[row] = column
                room[column] -= 1
    return np.array(assignment)


def plain_group_neurons(magnitude: np.ndarray, experts: int, seed: int, iterations: int = 20) -> np.ndarray:
    """Balanced spherical k-means on the neurons' normalized token profiles, centroids as group means."""
    neurons = magnitude.shape[1]
    profiles = magnitude.T / (np.linalg.norm(magnitude.T, axis=1, keepdims=True) + 1e-12)
    centroids = profiles[np.random.default_rng(seed).choice(neurons, experts, replace=False)]
    for _ in range(iterations):
        assignment = plain_balanced_assign(profiles @ centroids.T, neurons // experts)
        centroids = np.stack([profiles[assignment == group].mean(axis=0) for group in range(experts)])
        centroids /= np.linalg.norm(centroids, axis=1, keepdims=True) + 1e-12
    return np.stack([np.flatnonzero(assignment == group) for group in range(experts)])


def plain_ffn_inputs(reference: DenseReference, window: mx.array) -> list[np.ndarray]:
    """Each layer's FFN input on one window, the llama block's parts applied one at a time."""
    h, inputs = reference.model.model.embed_tokens(window), []
    for layer in reference.layers:
        after_attention = h + layer.self_attn(layer.input_layernorm(h), "causal")
        inputs.append(layer.post_attention_layernorm(after_attention))
        h = after_attention + layer.mlp(inputs[-1])
    return [np.array(x[0]) for x in inputs]


def bits(array: np.ndarray) -> np.ndarray:
    """A float array's bit patterns, so that equality means bit for bit (0.0 and -0.0 differ)."""
    return array.view(np.uint32 if array.dtype == np.float32 else np.uint64)


@pytest.mark.parametrize("seed", range(6))
def test_balanced_assignment_is_the_plain_rounds_of_proposals_ties_included(seed):
    rng = np.random.default_rng(seed)
    size, columns = int(rng.integers(1, 9)), int(rng.integers(2, 7))
    # Few distinct values: many rows tie for a column, and columns tie for a row.
    similarity = rng.integers(0, 3, size=(size * columns, columns)).astype(np.float32)
    if seed % 2:
        similarity = rng.normal(size=similarity.shape).astype(np.float32)
    assignment = _balanced_assign(similarity, size)
    assert np.array_equal(assignment, plain_balanced_assign(similarity, size))
    assert np.array_equal(np.bincount(assignment, minlength=columns), np.full(columns, size))


@pytest.mark.parametrize(("tokens", "neurons", "experts"), [(120, 48, 4), (90, 60, 6), (300, 160, 8)])
def test_grouping_is_the_plain_balanced_kmeans_bit_for_bit(tokens, neurons, experts):
    rng = np.random.default_rng(tokens)
    # Coarse values and repeated neurons: equal similarities, so every tie-break is exercised.
    magnitude = np.round(np.abs(rng.normal(size=(tokens, neurons))), 1).astype(np.float32)
    magnitude[:, neurons // 2 :] = magnitude[:, : neurons - neurons // 2][:, rng.permutation(neurons - neurons // 2)]
    magnitude[: tokens // 3, ::5] = 0.0
    for seed in range(3):
        assert np.array_equal(group_neurons(magnitude, experts, seed), plain_group_neurons(magnitude, experts, seed))


@pytest.mark.parametrize(("neurons", "experts"), [(48, 8), (96, 4), (600, 3)])
def test_centroids_are_the_plain_group_means_bit_for_bit(neurons, experts):
    rng = np.random.default_rng(neurons)
    magnitude = np.abs(rng.normal(size=(700, neurons))).astype(np.float32)
    profiles = magnitude.T / (np.linalg.norm(magnitude.T, axis=1, keepdims=True) + 1e-12)  # as grouping has them
    assignment = rng.permutation(np.repeat(np.arange(experts), neurons // experts))
    groups = np.stack([np.flatnonzero(assignment == group) for group in range(experts)])
    plain = np.stack([profiles[assignment == group].mean(axis=0) for group in range(experts)])
    plain /= np.linalg.norm(plain, axis=1, keepdims=True) + 1e-12
    assert np.array_equal(bits(_unit_means(np.ascontiguousarray(profiles), groups)), bits(plain))


def test_calibration_inputs_are_those_of_whole_forward_passes(tiny_dense):
    reference = DenseReference(tiny_dense)
    windows = reference.windows(SHORT_CALIBRATION)
    assert len(windows) > 1  # several windows concatenated per layer
    expected = [np.concatenate(parts) for parts in zip(*(plain_ffn_inputs(reference, w) for w in windows))]
    got = reference.mlp_inputs(windows)
    assert len(got) == len(expected) == TINY["layers"]
    assert all(np.array_equal(bits(a), bits(b)) for a, b in zip(got, expected))


def test_grouping_rejects_a_count_that_does_not_divide_the_neurons():
    with pytest.raises(NightshiftError, match="do not split into 7 equal experts"):
        group_neurons(np.ones((10, 96)), 7)


def test_router_fit_recovers_a_linear_map():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(500, 20)).astype(np.float32)
    weight, bias = rng.normal(size=(6, 20)), rng.normal(size=6)
    fitted_weight, fitted_bias = fit_linear_router(x, x @ weight.T + bias, ridge=1e-9)
    np.testing.assert_allclose(fitted_weight, weight, atol=1e-4)
    np.testing.assert_allclose(fitted_bias, bias, atol=1e-4)


def test_shipped_texts_are_separate_and_substantial():
    calibration, evaluation = CALIBRATION_TEXT.read_text(), EVALUATION_TEXT.read_text()
    assert len(calibration.split()) > 2000 and len(evaluation.split()) > 800
    sentences = {s.strip() for s in calibration.split(".") if len(s.strip()) > 30}
    assert not any(s.strip() in sentences for s in evaluation.split(".") if len(s.strip()) > 30)


def test_checkpoint_is_a_llama_moe_with_experts_from_every_neuron(tiny_dense, tiny_moe):
    config = json.loads((tiny_moe / "config.json").read_text())
    assert config["model_type"] == "llama_moe"
    assert (config["num_experts"], config["num_experts_per_tok"]) == (EXPERTS, EXPERTS)
    assert {p.name for p in tiny_dense.glob("tokenizer*")} <= {p.name for p in tiny_moe.iterdir()}
    weights = mx.load(str(tiny_moe / "model.safetensors"))
    size = TINY["ffn"] // EXPERTS
    assert weights["model.layers.0.mlp.switch_mlp.gate_proj.weight"].shape == (EXPERTS, size, TINY["hidden"] // 8)
    assert weights["model.layers.0.mlp.switch_mlp.down_proj.weight"].shape == (EXPERTS, TINY["hidden"], size)
    assert weights["model.layers.0.mlp.router.weight"].shape == (EXPERTS, TINY["hidden"])
    assert not [name for name in weights if ".mlp.gate_proj" in name or ".mlp.down_proj" in name]


def test_every_expert_active_is_the_dense_model(tiny_dense, tiny_moe):
    dense, sparse = open_model(tiny_dense), open_model(tiny_moe)
    prompt = mx.array(dense.tokenizer.encode("the quick brown fox jumps over the lazy dog"))[None]
    expected, got = dense.model(prompt), sparse.model(prompt)
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-4, atol=1e-4)
    greedy = [[c.token for c in m.generate_tokens(prompt[0].tolist(), max_tokens=16)] for m in (dense, sparse)]
    assert greedy[0] == greedy[1]


def test_router_picks_the_top_k_experts(tiny_moe):
    sparse = open_model(tiny_moe)
    mlp = sparse.model.layers[0].mlp
    scores = mx.array([3.0, -1.0, 7.0, 0.5, 2.0, -4.0, 6.0, 1.0])
    mlp.router.weight = mx.zeros_like(mlp.router.weight)
    mlp.router.bias = scores
    x = mx.random.normal((1, 5, TINY["hidden"]), key=mx.random.key(4))
    for k, chosen in ((1, [2]), (3, [2, 6, 0])):
        mlp.num_experts_per_tok = k
        indices = mx.broadcast_to(mx.array(chosen), (1, 5, k))
        expected = mlp.switch_mlp(x, indices).sum(axis=-2)
        np.testing.assert_allclose(np.array(mlp(x)), np.array(expected), rtol=1e-5, atol=1e-5)


def test_fewer_experts_change_the_output(tiny_dense, tmp_path):
    sparse = open_model(tiny_moefy(tiny_dense, tmp_path / "k2", k=2))
    dense = open_model(tiny_dense)
    prompt = mx.array(dense.tokenizer.encode("hello there"))[None]
    assert not np.allclose(np.array(sparse.model(prompt)), np.array(dense.model(prompt)), atol=1e-3)


def test_bad_requests_are_refused_before_anything_is_written(tiny_dense, tiny_moe, tmp_path):
    with pytest.raises(NightshiftError, match="k must be between 1 and the number of experts"):
        tiny_moefy(tiny_dense, tmp_path / "out", experts=4, k=5)
    with pytest.raises(NightshiftError, match="number of experts must be at least 1"):
        tiny_moefy(tiny_dense, tmp_path / "out", experts=0, k=0)
    with pytest.raises(NightshiftError, match="do not split into 5 equal experts"):
        tiny_moefy(tiny_dense, tmp_path / "out", experts=5, k=2)
    with pytest.raises(UnsupportedModelError, match="MoEfication takes a dense llama"):
        tiny_moefy(tiny_moe, tmp_path / "out", experts=4, k=2)
    assert not list(tmp_path.iterdir())


def test_cli_moefy_refuses_to_replace_a_model_and_needs_a_source(home, tiny_dense, capsys):
    (home / "models" / "taken").mkdir(parents=True)
    assert main(["model", "moefy", "--source", str(tiny_dense), "--name", "taken"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["model", "moefy"]) == 1
    assert "nightshift model default" in capsys.readouterr().err


def test_cli_moefy_refuses_a_calibration_text_too_short(home, tiny_dense, tmp_path, capsys):
    (tmp_path / "short.txt").write_text("only a few words here")
    assert main(["model", "moefy", "--source", str(tiny_dense), "--calibration", str(tmp_path / "short.txt")]) == 1
    assert "has 5 words; give at least 200" in capsys.readouterr().err


def test_cli_moefy_writes_a_model_into_the_data_dir(home, tiny_dense, tmp_path, capsys):
    (tmp_path / "text.txt").write_text(SHORT_CALIBRATION)
    command = ["model", "moefy", "--source", str(tiny_dense), "--calibration", str(tmp_path / "text.txt")]
    assert main([*command, "--experts", "4", "--k", "3", "--name", "m"]) == 0
    config = json.loads((home / "models" / "m" / "config.json").read_text())
    assert (config["num_experts"], config["num_experts_per_tok"]) == (4, 3)
    assert not [p for p in (home / "models").iterdir() if p.name.startswith(".")]


def test_down_slices_hold_the_quantized_values_exactly(tiny_dense, tiny_moe):
    dense = mx.load(str(tiny_dense / "model.safetensors"))
    sparse = mx.load(str(tiny_moe / "model.safetensors"))
    prefix = "model.layers.1.mlp"
    weight, scales, biases = (dense[f"{prefix}.down_proj.{part}"] for part in ("weight", "scales", "biases"))
    levels = np.array(mx.dequantize(weight, mx.ones(scales.shape), mx.zeros(biases.shape), group_size=32, bits=4))
    exact = levels.astype(np.float64) * np.repeat(np.array(scales, np.float64), 32, axis=1) + np.repeat(
        np.array(biases, np.float64), 32, axis=1
    )
    slices = np.array(sparse[f"{prefix}.switch_mlp.down_proj.weight"])  # (experts, hidden, size)
    # Which neuron each column came from: match gate rows, which are copied untouched.
    gate = np.array(dense[f"{prefix}.gate_proj.weight"])
    expert_gate = np.array(sparse[f"{prefix}.switch_mlp.gate_proj.weight"]).reshape(-1, gate.shape[1])
    neuron_of = [int(np.flatnonzero((gate == row).all(axis=1))[0]) for row in expert_gate]
    assert sorted(neuron_of) == list(range(TINY["ffn"]))
    assert np.array_equal(slices.transpose(1, 0, 2).reshape(TINY["hidden"], -1), exact[:, neuron_of])


def test_a_moefied_model_loads_without_a_transformers_warning(tiny_moe):
    """transformers is told what llama_moe is (engine/models), so loading the tokenizer warns no one about it."""
    code = "import sys; from nightshift.engine.runtime import open_model; open_model(sys.argv[1]).close()"
    result = subprocess.run([sys.executable, "-c", code, str(tiny_moe)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "llama_moe" not in result.stderr
