"""Routing traces of a MoEfied llama, and a Kimi K3 bench model whose routers replay them.

A trace records, per token and MoE layer, the experts a llama_moe model picks (and the next-layer guesses);
`nightshift model synth --routing` writes a kimi_k3_replay checkpoint whose gates replay it. Checked here: the
trace is what the model picks, scaling keeps every set's overlap, the replaying model asks the streaming layer
for exactly the trace's experts at each position (streamed and in RAM, the same tokens), its router hands the
predictor the recorded guesses, and each sequence of a batch replays its own recorded text.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from nightshift.app.cli import main
from nightshift.engine.errors import ModelFormatError, NightshiftError
from nightshift.engine.instruments.probes import Instruments
from nightshift.engine.io.drives import Drive
from nightshift.engine.models import get_classes
from nightshift.engine.models.kimi_k3_replay import ReplayCursor, ReplayRouter
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.runtime import open_model
from nightshift.engine.store import routing_trace
from nightshift.engine.store.gguf_import import convert_gguf
from nightshift.engine.store.importer import ImportOptions, import_checkpoint
from nightshift.engine.store.moefy import CALIBRATION_TEXT, DenseReference, moefy
from nightshift.engine.store.synth import synthesize
from tests.helpers.gguf_files import write_tiny_llama

LENGTHS = [9, 5, 12]  # tokens of the three recorded sequences
EXPERTS, K, LAYERS = 8, 2, 2  # the tiny kimi_k3 preset: 8 experts, 2 active, layers 1-2 routed


def random_trace(experts: int = EXPERTS, k: int = K, layers: int = LAYERS, seed: int = 0) -> routing_trace.RoutingTrace:
    """A trace with distinct experts per (token, layer), as a top-k gives."""
    rng = np.random.default_rng(seed)
    total = sum(LENGTHS)

    def picks() -> np.ndarray:
        return np.stack([[rng.permutation(experts)[:k] for _ in range(layers)] for _ in range(total)]).astype(np.int16)

    return routing_trace.RoutingTrace(
        experts, k, np.arange(total, dtype=np.int32), np.concatenate([[0], np.cumsum(LENGTHS)]),
        np.array([4, 2, 6], np.int32), picks(), {name: picks() for name in routing_trace.GUESSES},
        {"model": "random", "names": ["a", "b", "c"]},
    )  # fmt: skip


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory) -> Path:
    return routing_trace.save(random_trace(), tmp_path_factory.mktemp("trace") / "trace.npz")


@pytest.fixture(scope="module")
def replay_checkpoint(trace_file, tmp_path_factory) -> Path:
    return synthesize("kimi_k3", "tiny", tmp_path_factory.mktemp("replay") / "ckpt", seed=3, routing=trace_file)


@pytest.fixture(scope="module")
def replay_store(replay_checkpoint, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("replay-store")
    store = root / "store"
    import_checkpoint(replay_checkpoint, store, [Drive(f"d{i}", root / f"drive{i}") for i in range(2)], ImportOptions())
    return store


def tap_indices(model) -> dict[int, list[np.ndarray]]:
    """Wrap every MoE layer's experts so the indices they are asked for are kept, by decoder layer."""
    seen: dict[int, list[np.ndarray]] = {}
    for number, layer in enumerate(model.layers):
        moe = layer.mlp
        if not hasattr(moe, "switch_mlp"):
            continue
        experts = moe.switch_mlp

        def tapped(x, indices, experts=experts, number=number):
            seen.setdefault(number, []).append(np.array(indices))
            return experts(x, indices)

        object.__setattr__(moe, "switch_mlp", tapped)  # a plain function: not a child module
    return seen


def test_trace_round_trips_and_a_wrong_file_is_refused(trace_file, tmp_path):
    trace, back = random_trace(), routing_trace.load(trace_file)
    assert back.lengths == LENGTHS and back.names() == ["a", "b", "c"]
    assert np.array_equal(back.chosen, trace.chosen) and np.array_equal(back.prompt_tokens, trace.prompt_tokens)
    assert all(np.array_equal(back.guesses[name], trace.guesses[name]) for name in routing_trace.GUESSES)
    (tmp_path / "junk.npz").write_bytes(b"not a trace")
    with pytest.raises(ModelFormatError, match="not a routing trace"):
        routing_trace.load(tmp_path / "junk.npz")


def test_scaling_splits_each_expert_and_keeps_every_overlap():
    trace = random_trace(experts=4, k=2, layers=6)
    scaled = routing_trace.scale(trace, 12, 4)
    assert scaled.factor == 3 and scaled.source_layers == [1, 2, 3, 4]  # consecutive, centred
    assert scaled.chosen.shape == (sum(LENGTHS), 4, 6)
    for token in (0, 7, 20):
        for layer, source in enumerate(scaled.source_layers):
            expected = {3 * e + j for e in trace.chosen[token, source] for j in range(3)}
            assert set(scaled.chosen[token, layer].tolist()) == expected
    a, b = (set(scaled.chosen[t, 0].tolist()) for t in (3, 4))
    original = set(trace.chosen[3, 1].tolist()) & set(trace.chosen[4, 1].tolist())
    assert len(a & b) == 3 * len(original)
    assert routing_trace.layer_map(3, 5) == [0, 1, 2, 0, 1]  # more layers than recorded: round again
    with pytest.raises(NightshiftError, match="multiple of 4"):
        routing_trace.scale(trace, 10, 4)


def test_synth_writes_a_replay_checkpoint_and_refuses_other_families(replay_checkpoint, trace_file, tmp_path):
    config = json.loads((replay_checkpoint / "config.json").read_text())
    assert config["model_type"] == "kimi_k3_replay" and config["replay_lengths"] == LENGTHS
    assert config["num_experts_per_token"] == K and config["replay_source"]["layers"] == [0, 1]
    with pytest.raises(NightshiftError, match="--arch kimi_k3"):
        synthesize("qwen3_moe", "tiny", tmp_path / "q", routing=trace_file)


def test_replay_in_ram_asks_for_the_traced_experts_at_each_position(replay_checkpoint):
    model, _ = load_model(replay_checkpoint, get_model_classes=get_classes)
    seen = tap_indices(model)
    trace = random_trace()
    cache = make_prompt_cache(model)
    model(mx.array([[1, 2, 3, 4]]), cache=cache)  # positions 0-3 of sequence 0 (the first fresh cache)
    for _ in range(8):  # positions 4-11: past sequence 0's 9 tokens the replay starts it over
        model(mx.array([[5]]), cache=cache)
    for moe, number in enumerate(sorted(seen)):
        got = np.concatenate([calls.reshape(-1, K) for calls in seen[number]])
        positions = [p % LENGTHS[0] for p in range(12)]
        assert np.array_equal(got, trace.chosen[positions, moe])


def test_replay_router_hands_the_predictor_the_recorded_guess(replay_checkpoint):
    model, _ = load_model(replay_checkpoint, get_model_classes=get_classes)
    gates = [layer.mlp.gate for layer in model.layers if isinstance(layer.mlp.get("gate"), ReplayRouter)]
    trace = random_trace()
    model.restart_replay(1)
    cache = make_prompt_cache(model)
    model(mx.array([[7, 8, 9]]), cache=cache)  # sequence 1, positions 0-2
    start = trace.rows(1).start
    for moe, gate in enumerate(gates):
        logits = np.array(gate(mx.zeros((3, 64))))  # the predictor's call: the input's values are not used
        top = np.argsort(-logits, axis=-1, kind="stable")[:, :K]
        assert np.array_equal(top, trace.guesses["guessed"][start : start + 3, moe])


def test_streamed_replay_reads_the_traced_experts_and_matches_in_ram(replay_store):
    trace = random_trace()
    in_ram = open_model(replay_store)
    tokens = [c.token for c in in_ram.generate_tokens([3, 1, 4], max_tokens=6)]
    in_ram.close()
    again = open_model(replay_store)
    assert [c.token for c in again.generate_tokens([3, 1, 4], max_tokens=6)] == tokens  # deterministic
    again.close()
    instruments = Instruments(routing=[])
    streamed = open_model(replay_store, stream=StreamSettings(cache_bytes=0, prefetch=False), instruments=instruments)
    assert [c.token for c in streamed.generate_tokens([3, 1, 4], max_tokens=6)] == tokens
    calls = instruments.routing
    streamed.close()
    moe_layers = sorted({layer for layer, *_ in calls})
    for moe, layer in enumerate(moe_layers):
        steps = [experts for number, experts, *_ in calls if number == layer]
        prompt = set(trace.chosen[0:2, moe].reshape(-1).tolist())
        assert set(steps[0]) == prompt  # the prompt but its last token in one pass (mlx-lm's split): their union
        for position, experts in enumerate(steps[1:], start=2):  # then the last prompt token, then one a step
            assert list(experts) == sorted(trace.chosen[position, moe].tolist())


def test_the_engines_next_layer_recall_is_the_traces_guess_against_its_choice(replay_store):
    """Counted over decode steps against the whole guess (what bench/trained_routing.py counts), whatever part of
    it the prefetch caps read ahead; the prompt's pass of many rows is not scored."""
    trace = random_trace()
    model = open_model(replay_store, stream=StreamSettings(cache_bytes=0))
    try:
        list(model.generate_tokens([3, 1, 4], max_tokens=6))  # sequence 0: positions 0-1 in one pass, then 2-8
        figures = model.stream.figures()
    finally:
        model.close()
    positions = range(2, 9)  # mlx-lm builds the pass after the last token it yields: 7 one-row passes
    named = sum(len(set(trace.guesses["guessed"][p, 1].tolist()) & set(trace.chosen[p, 1].tolist())) for p in positions)
    assert (figures.recall_needed, figures.recall_hits) == (len(positions) * K, named)
    assert figures.recall_read_ahead <= figures.recall_hits


def test_each_sequence_of_a_batch_replays_its_own_text(replay_checkpoint):
    model, _ = load_model(replay_checkpoint, get_model_classes=get_classes)
    first, second = make_prompt_cache(model), make_prompt_cache(model)
    model(mx.array([[1, 2]]), cache=first)  # a fresh cache: sequence 0
    model(mx.array([[1, 2]]), cache=second)  # the next fresh one: sequence 1
    copied = copy.deepcopy(first)  # a shared prefix copied for another prompt: the next sequence, from position 2
    model(mx.array([[6]]), cache=copied)  # its own prompt part: sequence 2, position 2
    model(mx.array([[6]]), cache=first)
    model(mx.array([[6]]), cache=second)
    assert [cache[-1][0].item() for cache in (first, second, copied)] == [0, 1, 2]
    batch = [type(a).merge([a, b, c]) for a, b, c in zip(first, second, copied, strict=True)]
    assert isinstance(batch[-1], ReplayCursor)
    seen = tap_indices(model)
    model(mx.array([[4], [4], [4]]), cache=batch)  # one decode step, position 3 of each
    trace = random_trace()
    for moe, number in enumerate(sorted(seen)):
        rows = seen[number][0].reshape(-1, K)
        assert np.array_equal(rows, trace.chosen[[trace.rows(s).start + 3 for s in range(3)], moe])


def test_a_recorded_trace_is_what_the_moefied_model_picks(tmp_path):
    dense = convert_gguf(write_tiny_llama(tmp_path / "tiny.gguf"), tmp_path / "dense")
    moe = moefy(dense, tmp_path / "moe", experts=8, k=2, calibration=CALIBRATION_TEXT.read_text()[:2500],
                say=lambda message: None)  # fmt: skip
    model, _ = load_model(moe, get_model_classes=get_classes)
    tokens = DenseReference(dense).tokenizer.encode("The ledger balances at month end after every invoice is matched.")
    trace = routing_trace.record(model, [("note", tokens, 4)], {"model": "tiny"})
    assert trace.experts == 8 and trace.k == 2 and trace.lengths == [len(tokens)] and trace.names() == ["note"]
    inputs, picked = [], []
    for layer in model.model.layers:
        experts = layer.mlp.switch_mlp

        def tapped(x, indices, experts=experts):
            inputs.append(x[0])
            picked.append(np.sort(np.array(indices[0]), axis=-1))
            return experts(x, indices)

        object.__setattr__(layer.mlp, "switch_mlp", tapped)
    model(mx.array(tokens)[None])
    for layer in range(len(picked)):
        assert np.array_equal(picked[layer], np.sort(trace.chosen[:, layer], axis=-1))
    # Layer 1's guess: its router on layer 0's MoE input, most confident first.
    scores = np.array(model.model.layers[1].mlp.router(inputs[0]))
    assert np.array_equal(trace.guesses["guessed"][:, 1], np.argsort(-scores, axis=-1, kind="stable")[:, :2])


def test_cli_synth_routing_flag(home, trace_file, tmp_path, capsys):
    out = tmp_path / "bench-replay"
    assert main(["model", "synth", "--arch", "kimi_k3", "--routing", str(trace_file), "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["model_type"] == "kimi_k3_replay"
    assert main(["model", "synth", "--arch", "kimi_k3", "--routing", str(tmp_path / "none.npz")]) == 1
    assert "not a routing trace" in capsys.readouterr().err
