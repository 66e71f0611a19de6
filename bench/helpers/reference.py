"""The reference decode of the tests and study scripts: mlx-lm's own greedy loop over a fixed prompt of token ids, no
tokenizer, so a store opened by nightshift and the checkpoint mlx-lm loads are compared token for token
(bench/trunk_bits.py prints the same comparison at each trunk width)."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.generate import generate_step

PROMPT = [5, 17, 42, 99, 3, 250, 7, 64]
STEPS = 32


def greedy_tokens(model, steps: int = STEPS, prompt: list[int] = PROMPT) -> list[int]:
    """The first `steps` greedy tokens after `prompt` (PROMPT unless a test needs a longer one)."""
    tokens = generate_step(mx.array(prompt), model, max_tokens=steps, sampler=lambda logits: mx.argmax(logits, -1))
    return [int(token) for token, _ in tokens]
