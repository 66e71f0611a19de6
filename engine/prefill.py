"""Prompt processing in mlx-lm's steps, expert-major: every row of a chunk goes through layer L before L+1.

The prompt is split as mlx-lm's `generate_step` splits it: all but the last token in chunks of `chunk` rows
(mlx-lm's `prefill_step_size`; the default is its default), then the last token alone, whose logits give the first
token. The same split gives the same bits: a matmul over other rows or other key lengths may sum in another order,
and "the same greedy tokens as mlx-lm" is meant token for token (tests/test_family_conformance.py).

mlx-lm's model call already runs a whole chunk layer by layer, so a streaming layer sees all of a chunk's rows at
once and reads each expert they select once; the last token's pass reads its own top-k again (from the expert cache
when one is kept). The chunk size is a setting whose effect on reads is measured (read amplification).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from nightshift.engine.errors import NightshiftError
from nightshift.engine.generation import DEFAULT_CHUNK

if TYPE_CHECKING:
    from nightshift.engine.moe.stream import ExpertStream, PrefillReads


def fill_cache(
    model: nn.Module,
    tokens: list[int],
    cache: list,
    chunk: int = DEFAULT_CHUNK,
    progress: Callable[[int, int], None] | None = None,
    total: int | None = None,
) -> None:
    """Run `tokens` through `model` into `cache`, `chunk` rows a pass (mlx-lm's prefill loop); no logits.
    `progress(done, total)` after each pass (`total`: the whole prompt's length, default len(tokens))."""
    if chunk < 1:
        raise NightshiftError(f"prefill chunk size {chunk}: it must be at least 1 row")
    rows = mx.array(tokens)
    for start in range(0, len(tokens), chunk):
        model(rows[None, start : start + chunk], cache=cache)
        mx.eval([c.state for c in cache])
        if progress is not None:
            progress(min(start + chunk, len(tokens)), total or len(tokens))


def prefill(
    model: nn.Module,
    prompt: list[int],
    cache: list,
    chunk: int = DEFAULT_CHUNK,
    progress: Callable[[int, int], None] | None = None,
) -> mx.array:
    """Run `prompt` through `model` (filling `cache`) as mlx-lm's generate_step does: `prompt[:-1]` `chunk` rows at
    a time, then the last token alone; that token's log-probabilities."""
    if not prompt:
        raise NightshiftError("the prompt is empty: give at least one token")
    fill_cache(model, prompt[:-1], cache, chunk, progress, len(prompt))
    logits = model(mx.array(prompt[-1:])[None], cache=cache)[:, -1, :]
    logprobs = (logits - mx.logsumexp(logits, keepdims=True)).squeeze(0)
    mx.eval(logprobs)
    if progress is not None:
        progress(len(prompt), len(prompt))
    return logprobs


def counted_prefill(
    model: nn.Module,
    prompt: list[int],
    cache: list,
    chunk: int,
    stream: ExpertStream | None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[mx.array, PrefillReads | None]:
    """`prefill`, with the streamed model's prefill reads (bytes read, unique expert bytes) when it streams."""
    if stream is None:
        return prefill(model, prompt, cache, chunk, progress), None
    stream.begin_prefill()
    logprobs = prefill(model, prompt, cache, chunk, progress)
    return logprobs, stream.end_prefill()
