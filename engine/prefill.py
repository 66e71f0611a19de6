"""Prompt processing in chunks, expert-major: every row of a chunk goes through layer L before L+1.

mlx-lm's model call already runs a whole chunk layer by layer, so a streaming layer sees all
of a chunk's rows at once and reads each expert they select exactly once. What this module
adds over mlx-lm's own prefill loop is that the *last* prompt token is part of the last chunk
(mlx-lm processes it alone in the first decode step, which re-reads up to top-k experts per
layer), and that the chunk size is a setting whose effect is measured (read amplification).
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


def prefill(
    model: nn.Module,
    prompt: list[int],
    cache: list,
    chunk: int = DEFAULT_CHUNK,
    progress: Callable[[int, int], None] | None = None,
) -> mx.array:
    """Run `prompt` through `model` (filling `cache`) `chunk` rows at a time; the last row's log-probabilities."""
    if chunk < 1:
        raise NightshiftError(f"prefill chunk size {chunk}: it must be at least 1 row")
    if not prompt:
        raise NightshiftError("the prompt is empty: give at least one token")
    tokens = mx.array(prompt)
    logits = None
    for start in range(0, len(prompt), chunk):
        logits = model(tokens[None, start : start + chunk], cache=cache)[:, -1, :]
        mx.eval([c.state for c in cache])  # the logits only matter after the last chunk
        if progress is not None:
            progress(min(start + chunk, len(prompt)), len(prompt))
    logprobs = (logits - mx.logsumexp(logits, keepdims=True)).squeeze(0)
    mx.eval(logprobs)
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
