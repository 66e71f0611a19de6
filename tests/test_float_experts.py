"""Checkpoints whose experts mlx-lm cannot run on a CPU generate in nightshift: FP8 and bfloat16 experts.

DeepSeek V3 and MiniMax M2 publish their experts in FP8 (per-block scales) or bfloat16; mlx-lm dequantizes FP8 to
bfloat16 and then stops on a CPU ("[GatherMM::eval] Currently only supports float32"). nightshift computes those
experts as MLX does on a GPU: inputs upcast to float32, float32 sums, the output rounded to bfloat16
(engine/cpu_prefill.py). Checked two ways, in RAM and streamed:
- the greedy tokens equal mlx-lm's own model of the checkpoint run with that rule for `gather_mm` (the one
  operation it lacks on a CPU), token for token;
- the prompt's log-probabilities are within bfloat16's rounding of the same weights cast to float32 and run by plain
  mlx-lm (a wrong expert or scale moves them by about their spread, ~0.6). The greedy tokens of the float32
  reference part from the bfloat16 ones after a few steps (docs/results.md, [21]): bfloat16 rounding of the
  activations flips a routing choice or a near-tie, in mlx-lm's own bfloat16 model as in nightshift's.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from nightshift.engine.models import get_classes
from nightshift.engine.prefill import prefill
from nightshift.engine.runtime import open_model
from tests.helpers.moe_families import (
    PROMPT,
    STEPS,
    check_import,
    float32_reference,
    nightshift_tokens,
    write_checkpoint,
    write_fp8_checkpoint,
)
from tests.helpers.reference import greedy_tokens

# bfloat16 keeps 8 bits: log-probabilities of ~-4 move by ~0.02-0.05 over the tiny models' layers (measured).
BF16_ROUNDING = 0.1


def _written(family: str, form: str, out):
    if form == "fp8":
        return write_fp8_checkpoint(family, out)
    return write_checkpoint(family, out, "release", dtype=mx.bfloat16)


def _gather_mm_as_on_a_gpu(gather_mm):
    """`gather_mm` for any float dtype: float32 products and sums, the output in the inputs' promoted dtype."""

    def upcast(a, b, lhs_indices=None, rhs_indices=None, *, sorted_indices=False):
        out = gather_mm(
            a.astype(mx.float32), b.astype(mx.float32), lhs_indices, rhs_indices, sorted_indices=sorted_indices
        )
        return out.astype(mx.result_type(a, b))

    return upcast


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
    src = _written(family, form, tmp_path / "src")
    outcome = check_import(src, tmp_path / "checked")
    assert outcome.refused is None and not outcome.differences, outcome
    assert outcome.tokens_unchecked and "GatherMM" in outcome.tokens_unchecked  # plain mlx-lm cannot run it here
    store = tmp_path / "checked" / "store"
    with monkeypatch.context() as patch:
        patch.setattr(mx, "gather_mm", _gather_mm_as_on_a_gpu(mx.gather_mm))
        expected = greedy_tokens(load_model(src, get_model_classes=get_classes)[0], STEPS, PROMPT)
    for streamed in (False, True):
        tokens, stopped = nightshift_tokens(store, streamed)
        assert tokens == (expected[: len(tokens)] if stopped else expected), f"streamed={streamed}"
    reference = float32_reference(src)
    want = prefill(reference, PROMPT, make_prompt_cache(reference))
    model = open_model(store)
    got = prefill(model.model, PROMPT, make_prompt_cache(model.model)).astype(mx.float32)
    assert np.abs(np.array(got) - np.array(want)).max() < BF16_ROUNDING
