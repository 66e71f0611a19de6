"""Checkpoints whose experts mlx-lm cannot run on a CPU generate in nightshift: FP8 and bfloat16 experts.

DeepSeek V3 and MiniMax M2 publish their experts in FP8 (per-block scales) or bfloat16; mlx-lm dequantizes FP8 to
bfloat16 and then stops on a CPU ("[GatherMM::eval] Currently only supports float32"). nightshift computes those
experts as MLX does on a GPU: inputs upcast to float32, float32 sums, the output rounded to bfloat16
(engine/cpu_prefill.py). Checked in RAM and streamed:
- the greedy tokens equal mlx-lm's own model of the checkpoint run with that rule for `gather_mm` (the one
  operation it lacks on a CPU), token for token;
- against the same weights cast to float32 and run by plain mlx-lm (the reference): the tokens are equal, or part
  only at a near-tie (bench/helpers/routing_ties.py). Followed layer by layer, the routers' scores agree within
  bfloat16's rounding until the first position where a router takes another expert, and there the reference's
  own k-th and (k+1)-th scores were closer than that rounding moved them; with the reference's routing forced on
  nightshift's model, every step's log-probabilities are within bfloat16's rounding of the reference's and its
  token is the reference's, or the reference's own top two were closer than that (docs/results.md, [21]).
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.switch_layers import SwitchLinear
from mlx_lm.utils import load_model

from bench.gpu_gather_mm import gather_mm_as_on_a_gpu
from bench.helpers.moe_families import (
    PROMPT,
    STEPS,
    check_import,
    float32_reference,
    nightshift_tokens,
)
from bench.helpers.reference import greedy_tokens
from bench.helpers.routing_ties import (
    final_gap,
    flips,
    logprob_shift,
    position_of,
    shift_before,
    teacher_forced,
    write_float_experts,
)
from nightshift.engine.bench.decode import first_difference
from nightshift.engine.cpu_prefill import PrefillSwitchLinear, use_gemm_prefill
from nightshift.engine.models import get_classes
from nightshift.engine.runtime import open_model

# bfloat16 keeps 8 bits: log-probabilities of ~-4 move by ~0.02-0.05 over the tiny models' layers (measured).
BF16_ROUNDING = 0.1
# Router selection scores (sigmoid, ~0.5) move by at most 0.0034 before the first routing flip (measured,
# bench/routing_ties.py); a wrong weight or scale moves them by their spread, 0.1-0.5.
ROUTER_ROUNDING = 0.01


@pytest.mark.parametrize(
    ("family", "form"),
    [
        ("deepseek_v3", "fp8"),
        pytest.param("deepseek_v3", "bf16", marks=pytest.mark.slow),
        pytest.param("minimax", "fp8", marks=pytest.mark.slow),
        pytest.param("minimax", "bf16", marks=pytest.mark.slow),
    ],
)
def test_16bit_experts_generate_on_the_cpu(family, form, tmp_path, monkeypatch):
    src = write_float_experts(family, form, tmp_path / "src")
    outcome = check_import(src, tmp_path / "checked")
    assert outcome.refused is None and not outcome.differences, outcome
    assert outcome.tokens_unchecked and "GatherMM" in outcome.tokens_unchecked  # plain mlx-lm cannot run it here
    store = tmp_path / "checked" / "store"
    with monkeypatch.context() as patch:
        patch.setattr(mx, "gather_mm", gather_mm_as_on_a_gpu(mx.gather_mm))
        expected = greedy_tokens(load_model(src, get_model_classes=get_classes)[0], STEPS, PROMPT)
    for streamed in (False, True):
        tokens, stopped = nightshift_tokens(store, streamed)
        assert tokens == (expected[: len(tokens)] if stopped else expected), f"streamed={streamed}"
    reference = float32_reference(src)
    model = open_model(store)
    try:
        _check_against_float32(reference, model.model, family, tokens)
    finally:
        model.close()


def _check_against_float32(reference, model, family: str, tokens: list[int]) -> None:
    """nightshift's `tokens` against the float32 reference's: equal, or parted only at a near-tie (module docstring)."""
    expected = greedy_tokens(reference, len(tokens), PROMPT)
    own, along = teacher_forced(model, family, tokens), teacher_forced(reference, family, tokens)
    assert own.picks == tokens  # the side-by-side pass is the runtime's
    assert logprob_shift(along, own, 0) < BF16_ROUNDING  # the prompt
    parted = first_difference(tokens, expected)
    if parted is not None:
        first = next(iter(flips(along, own)), None)
        if first is not None and first.position <= position_of(parted):
            assert shift_before(along, own, first.position) < ROUTER_ROUNDING
            assert first.gap < first.shift < ROUTER_ROUNDING, f"step {parted}: not a near-tie: {first}"
        else:
            shift = logprob_shift(along, own, parted)
            assert final_gap(along, parted) < shift < BF16_ROUNDING, f"step {parted}: no routing flip, no near-tie"
    chosen = teacher_forced(reference, family, expected)
    forced = teacher_forced(model, family, expected, forced=chosen.chosen)
    assert chosen.picks == expected  # the side-by-side pass is mlx-lm's own loop
    for step, (pick, want) in enumerate(zip(forced.picks, expected)):
        shift = logprob_shift(chosen, forced, step)
        assert shift < BF16_ROUNDING, f"step {step}, the reference's routing forced"
        assert pick == want or final_gap(chosen, step) < shift, f"step {step}, the reference's routing forced"


@pytest.mark.parametrize("step", ["decode", "prefill"])
def test_16bit_switch_layer_sums_as_gather_mm_does(step, monkeypatch):
    """nightshift's switch layer on bfloat16 experts gives, bit for bit, mlx-lm's `SwitchLinear` with `gather_mm` on
    float32 copies (the rule of the tokens above): a decode step's row through 4 experts, and a prefill's 160
    (row, expert) pairs sorted by expert as `SwitchGLU` sorts them. A grouped float32 GEMM sums in BLAS's order,
    which at 192 inputs differs from gather_mm's in the last float32 bits (the prefill case fails with it), and
    rounding to bfloat16 turns some of those into a whole bfloat16 step: on a 192-neuron export one such step in a
    decode step's expert product parted the tokens from mlx-lm's at the second token (docs/results.md)."""
    mx.random.seed(3)
    layer = SwitchLinear(192, 576, num_experts=8, bias=False)
    layer.set_dtype(mx.bfloat16)
    if step == "decode":
        x, indices, ordered = mx.random.normal((1, 1, 1, 1, 192)), mx.array([[[5, 0, 2, 7]]]), False
    else:
        x, indices, ordered = mx.random.normal((160, 1, 192)), mx.sort(mx.random.randint(0, 8, (160,))), True
    x = x.astype(mx.bfloat16)
    with monkeypatch.context() as patch:
        patch.setattr(mx, "gather_mm", gather_mm_as_on_a_gpu(mx.gather_mm))
        expected = layer(x, indices, sorted_indices=ordered)
    use_gemm_prefill(layer)
    assert isinstance(layer, PrefillSwitchLinear)
    got = layer(x, indices, sorted_indices=ordered)
    assert got.dtype == mx.bfloat16 and mx.array_equal(got, expected)


def test_a_16bit_expert_alone_gives_the_bits_it_gets_in_a_stack():
    """A decode step runs each 16-bit expert alone, on a stack of one (every index 0, never read back): its output
    is the one it gets among the others."""
    mx.random.seed(4)
    layer = SwitchLinear(192, 576, num_experts=4, bias=False)
    layer.set_dtype(mx.bfloat16)
    use_gemm_prefill(layer)
    x = mx.random.normal((1, 1, 1, 1, 192)).astype(mx.bfloat16)
    stacked = layer(x, mx.array([[[3, 1, 2]]], dtype=mx.uint32))
    alone = SwitchLinear(192, 576, num_experts=1, bias=False)
    use_gemm_prefill(alone)
    alone.weight = layer.weight[1:2]
    got = alone(x, mx.zeros((1, 1, 1), dtype=mx.uint32))
    assert mx.array_equal(got[..., 0, :, :], stacked[..., 1, :, :])
