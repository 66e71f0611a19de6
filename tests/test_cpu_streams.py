"""A decode step's experts spread over CPU streams compute the same bits as one call, and the split fires,
counted by each model's own instruments."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

from bench.helpers.reference import greedy_tokens
from nightshift.engine.bench.decode import time_decode
from nightshift.engine.cpu_prefill import PrefillQuantizedSwitchLinear, PrefillSwitchLinear, use_gemm_prefill
from nightshift.engine.cpu_streams import ENV, MIN_PART_BYTES, cpu_streams, split_experts, stream_count
from nightshift.engine.errors import SettingError
from nightshift.engine.instruments.probes import Instruments
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.store.families import module_at, switch_sites
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.manifest import read_manifest
from nightshift.engine.store.synth import synthesize
from tests.helpers.stores import import_tiny

IN, OUT, EXPERTS = 512, 384, 12  # a 4-bit expert's weight: 96 KiB, over MIN_PART_BYTES


def _switch(kind: str, inputs: int = IN) -> SwitchLinear | QuantizedSwitchLinear:
    """A switch linear of `kind`: float, 4-bit affine or mxfp4, with random weights."""
    mx.random.seed(3)
    layer = SwitchLinear(inputs, OUT, EXPERTS, bias=kind == "float")
    layer.weight = mx.random.normal(layer.weight.shape) * 0.05
    if kind == "float":
        return layer
    mode = {"affine4": "affine", "mxfp4": "mxfp4"}[kind]
    return layer.to_quantized(group_size=32, bits=4, mode=mode)


def _prefill_kind(layer):
    return PrefillSwitchLinear if isinstance(layer, SwitchLinear) else PrefillQuantizedSwitchLinear


@pytest.mark.parametrize("kind", ["float", "affine4", "mxfp4"])
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("per_slot", [False, True], ids=["shared-x", "x-per-slot"])
def test_split_over_streams_is_bit_identical_to_one_call(monkeypatch, kind, rows, per_slot):
    layer = _switch(kind)
    k = 5  # an odd count: the parts are unequal
    indices = mx.array(np.random.default_rng(rows).choice(EXPERTS, (rows, k), replace=False).astype(np.uint32))
    x = mx.random.normal((rows, k if per_slot else 1, 1, IN))  # gate/up see one x, down one per slot
    want = np.array(type(layer).__call__(layer, x, indices))
    layer.__class__ = _prefill_kind(layer)
    layer.instruments = Instruments()
    monkeypatch.setenv(ENV, "2")
    got = np.array(layer(x, indices))
    assert layer.instruments.split_calls == 1  # the split did run
    np.testing.assert_array_equal(got, want)
    monkeypatch.setenv(ENV, "1")
    assert split_experts(lambda *a: None, x, indices, 1 << 30) is None  # 1 turns it off


def test_one_expert_per_row_is_not_split(monkeypatch):
    monkeypatch.setenv(ENV, "2")
    assert split_experts(lambda *a: None, mx.zeros((3, 1, 1, IN)), mx.zeros((3, 1), dtype=mx.uint32), 1 << 30) is None


def test_experts_too_small_to_pay_for_a_thread_stay_on_one_stream(monkeypatch):
    monkeypatch.setenv(ENV, "2")
    layer = _switch("affine4", inputs=64)  # 12 KiB an expert: two a part is under MIN_PART_BYTES
    layer.__class__ = PrefillQuantizedSwitchLinear
    layer.instruments = Instruments()
    indices = mx.array([[0, 1, 2, 3]], dtype=mx.uint32)
    x = mx.random.normal((1, 1, 1, 64))
    np.testing.assert_array_equal(
        np.array(layer(x, indices)), np.array(QuantizedSwitchLinear.__call__(layer, x, indices))
    )
    assert layer.instruments.split_calls == 0
    kernel = partial(QuantizedSwitchLinear.__call__, layer)
    assert split_experts(kernel, x, indices, MIN_PART_BYTES // 2) is not None  # two at the line: split


@pytest.mark.parametrize("said", ["0", "-1", "two", " "])
def test_a_bad_stream_count_is_refused_naming_the_variable(monkeypatch, said):
    monkeypatch.setenv(ENV, said)
    with pytest.raises(SettingError, match=ENV):
        stream_count()


def test_the_callers_stream_comes_first_and_none_twice(monkeypatch):
    monkeypatch.setenv(ENV, "2")
    outer = cpu_streams()
    assert outer[0] == mx.default_stream(mx.cpu) and len(set(map(str, outer))) == 2
    # mlx-lm decodes on a stream of its own: the split's first part stays on it; one of ours as the current
    # stream is not handed out again.
    for current in (mx.new_stream(mx.cpu), outer[1]):
        with mx.stream(current):
            inner = cpu_streams()
        assert inner[0] == current and len(inner) == 2 and inner[1] != current


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> Path:
    """The small preset (0.42 MB experts: worth a stream each), 3 layers: 2 MoE layers of 64 experts, 8 active."""
    root = tmp_path_factory.mktemp("kimi")
    return import_tiny(root, synthesize("kimi_k3", "small", root / "src", seed=1, layers=3), "store")


def test_streamed_and_in_ram_decode_spread_the_experts_and_keep_their_tokens(monkeypatch, small_store):
    resident = load_store(small_store)[0]
    in_ram = Instruments()
    for site in switch_sites(resident):  # the prompt's experts as the streamed layers compute them
        use_gemm_prefill(module_at(resident, site.path), in_ram)
    monkeypatch.setenv(ENV, "1")
    one_stream = greedy_tokens(resident)
    assert in_ram.split_calls == 0  # one stream: nothing split
    monkeypatch.setenv(ENV, "2")
    assert greedy_tokens(resident) == one_stream
    assert in_ram.split_calls > 0  # the in-RAM decode split its experts
    # No cache: every expert is read. Half the experts' bytes: some run from the cache, the rest as they land.
    for budget in (0, read_manifest(small_store).expert_bytes // 2):
        instruments = Instruments()
        model, _, stream = load_streaming(
            small_store, StreamSettings(cache_bytes=budget, overlap=True), instruments=instruments
        )
        try:
            assert greedy_tokens(model) == one_stream
        finally:
            stream.close()
        assert stream.figures().resident_layers == 0 and (stream.figures().cache_hits > 0) == (budget > 0)
        assert instruments.spread_experts > 0  # landed experts ran on the second stream


@pytest.mark.slow
def test_two_streams_in_one_process_count_apart(monkeypatch, small_store):
    """Each model counts into the instruments it was opened with, and a model opened without any counts nowhere."""
    monkeypatch.setenv(ENV, "2")
    settings = StreamSettings(cache_bytes=0, overlap=True)
    first, second = Instruments(routing=[]), Instruments(routing=[])
    # float32_prefill: this bf16 store's prompt through the grouped GEMM (opt-in; the kernel is the default)
    opened = [load_streaming(small_store, settings, instruments=i, float32_prefill=True) for i in (first, second)]
    bare_model, _, bare = load_streaming(small_store, settings, float32_prefill=True)
    try:
        prompt = list(range(40, 80))  # 40 rows x 8 experts: a prompt through the grouped GEMM
        tokens = time_decode(opened[0][0], 3, prompt).tokens
        counted = first.counts()
        assert counted["spread_experts"] > 0 and counted["expert_gemm_calls"] > 0 and first.routing
        assert second.counts() == dict.fromkeys(counted, 0) and second.routing == []  # the other stream: nothing
        assert time_decode(opened[1][0], 3, prompt).tokens == tokens
        assert second.counts() == counted and second.routing == first.routing  # the same decode, counted apart
        assert first.counts() == counted
        assert time_decode(bare_model, 3, prompt).tokens == tokens
        assert first.counts() == counted and second.counts() == counted and bare.instruments is None
    finally:
        for _, _, stream in opened:
            stream.close()
        bare.close()


@pytest.mark.parametrize("mode", ["affine", "mxfp4"])
@pytest.mark.parametrize("rows", [1, 3])
def test_a_wide_quantized_layers_outputs_spread_over_streams_keep_its_bits(monkeypatch, mode, rows):
    """A quantized linear with a bias and a quantized tied head (an embedding's `as_linear`), few rows: each part of
    the outputs on its own stream gives the one-call product exactly; the spread is counted; one stream spreads
    nothing, nor does a layer whose parts would hold under MIN_PART_BYTES of weight."""
    mx.random.seed(5)
    linear = nn.Linear(IN, 2 * OUT, bias=True).to_quantized(group_size=32, bits=4, mode=mode)  # 192 KiB
    head = nn.Embedding(2 * OUT, IN).to_quantized(group_size=32, bits=4, mode=mode)
    small = nn.Linear(IN, 64).to_quantized(group_size=32, bits=4, mode=mode)  # 16 KiB of weight
    x = mx.random.normal((rows, 1, IN))
    whole = [linear(x), head.as_linear(x), small(x)]
    model = nn.Sequential(linear, head, small)
    instruments = Instruments()
    monkeypatch.setenv(ENV, "2")
    assert use_gemm_prefill(model, instruments) == 3
    spread = [linear(x), head.as_linear(x), small(x)]
    assert all(mx.array_equal(a, b).item() for a, b in zip(whole, spread))
    assert instruments.spread_calls == 2 and linear.weight.nbytes // 2 >= MIN_PART_BYTES
    monkeypatch.setenv(ENV, "1")
    assert mx.array_equal(head.as_linear(x), whole[1]).item() and instruments.spread_calls == 2
