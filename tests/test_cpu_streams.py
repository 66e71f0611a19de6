"""A decode step's experts spread over CPU streams compute the same bits as one call, and the split fires."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

from bench.trunk_bits import greedy_tokens
from nightshift.engine.cpu_prefill import PrefillQuantizedSwitchLinear, PrefillSwitchLinear, use_gemm_prefill
from nightshift.engine.cpu_streams import ENV, SplitCounter, cpu_streams, split_experts, stream_count
from nightshift.engine.errors import SettingError
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.store.families import module_at, switch_sites
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.manifest import read_manifest
from tests.test_store_equivalence import import_tiny, tiny_checkpoint

IN, OUT, EXPERTS = 128, 96, 12


def _switch(kind: str) -> SwitchLinear | QuantizedSwitchLinear:
    """A switch linear of `kind`: float, 4-bit affine or mxfp4, with random weights."""
    mx.random.seed(3)
    layer = SwitchLinear(IN, OUT, EXPERTS, bias=kind == "float")
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
    monkeypatch.setenv(ENV, "2")
    before = SplitCounter.calls
    got = np.array(layer(x, indices))
    assert SplitCounter.calls == before + 1  # the split did run
    np.testing.assert_array_equal(got, want)
    monkeypatch.setenv(ENV, "1")
    assert split_experts(lambda *a: None, x, indices) is None  # 1 turns it off


def test_one_expert_per_row_is_not_split(monkeypatch):
    monkeypatch.setenv(ENV, "2")
    assert split_experts(lambda *a: None, mx.zeros((3, 1, 1, IN)), mx.zeros((3, 1), dtype=mx.uint32)) is None


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


def test_streamed_and_in_ram_decode_spread_the_experts_and_keep_their_tokens(monkeypatch, tmp_path):
    root = tmp_path / "kimi"
    store = import_tiny(root, tiny_checkpoint(root, "kimi_k3"), "store")
    monkeypatch.setenv(ENV, "1")
    one_stream = greedy_tokens(load_store(store)[0])
    monkeypatch.setenv(ENV, "2")
    resident = load_store(store)[0]
    for site in switch_sites(resident):
        use_gemm_prefill(module_at(resident, site.path))
    before = SplitCounter.snapshot()
    assert greedy_tokens(resident) == one_stream
    assert SplitCounter.calls > before["split_calls"]  # the in-RAM decode split its experts
    # No cache: every expert is read. Half the experts' bytes: the cached ones of a step are handed over together.
    for budget in (0, read_manifest(store).expert_bytes // 2):
        model, _, stream = load_streaming(store, StreamSettings(cache_bytes=budget, overlap=True))
        try:
            assert greedy_tokens(model) == one_stream
        finally:
            stream.close()
        assert stream.figures().resident_layers == 0 and (stream.figures().cache_hits > 0) == (budget > 0)
    assert SplitCounter.spread_experts > before["spread_experts"]  # landed experts ran on the second stream
