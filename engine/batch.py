"""Several sequences decoded together, so that each step reads the experts their rows select once for all.

When experts stream, a MoE layer costs the union of the experts its rows select, and with skewed
routing that union grows much more slowly than the number of rows. The prompts' shared beginning (a split
narrative's system message and findings list) is read once, in whole prefill chunks, and its cache copied
for each sequence: those are the chunks each prompt reads alone, so the copy is its own cache bit for bit.
The rest of each prompt is read alone, expert-major, exactly as a single generation reads it
(engine/prefill.py), from where the shared chunks end. The sequences' caches are
then merged into mlx-lm's batch caches (left-padded to one length and masked), and every step runs one
row per live sequence through the model, where a streaming layer reads each selected expert once. A
sequence that ends (an end token or its own token limit) leaves the batch and the others go on.

Greedy tokens equal each sequence generated alone as long as the batched kernels sum in the same order
as the one-row ones (on the CPU they did, bit for bit, in every case of tests/test_batch.py); where a
kernel does not, the two agree until a near-tie of the top logits, which that test then shows.
"""

from __future__ import annotations

import copy
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from nightshift.engine.errors import NightshiftError
from nightshift.engine.generation import (
    DEFAULT_CHUNK,
    AnswerFigures,
    BatchProgress,
    BatchStats,
    BatchText,
    ChatBatch,
    GenerationStats,
    LogitsProcessor,
)
from nightshift.engine.moe.stream import ExpertStream
from nightshift.engine.prefill import fill_cache, prefill


def _unheard(sequence: int, rows: int) -> None:
    """No one listening to a batch's prompt reads."""


def _told_after(told: Callable[[int, int], None], sequence: int, shared: int, rows: int, _: int) -> None:
    """A prompt's own rows read, told with the shared beginning before them."""
    told(sequence, shared + rows)


def batch_tokens(
    model: nn.Module,
    prompts: list[list[int]],
    max_tokens: int,
    stream: ExpertStream | None = None,
    eos: set[int] | frozenset[int] = frozenset(),
    prefill_chunk: int = DEFAULT_CHUNK,
    stats: BatchStats | None = None,
    on_token: Callable[[int, int], None] | None = None,
    logits_processors: list[list[LogitsProcessor]] | None = None,
    on_read: Callable[[int, int], None] | None = None,
) -> list[list[int]]:
    """Greedy tokens for every prompt, decoded together; each list ends at its first end token or `max_tokens`.

    `on_token(sequence, token)` sees every token as it comes (the first ones after each prompt is read).
    `logits_processors`, one list per prompt, shape that sequence's logits given its own tokens so far, as alone.
    `on_read(sequence, rows)` hears how much of a prompt is in its cache, after each chunk read (the shared
    beginning counts for every prompt once it is read).
    """
    if not prompts or any(not p for p in prompts):
        raise NightshiftError("a batch needs at least one prompt, and every prompt at least one token")
    if max_tokens < 1:
        raise NightshiftError(f"max_tokens {max_tokens}: ask for at least 1 token")
    stats = stats if stats is not None else BatchStats(width=len(prompts))
    start = time.perf_counter()
    stats.shared_prefix = shared = shared_prefix(prompts, prefill_chunk)
    read_once = make_prompt_cache(model)
    told = on_read if on_read is not None else _unheard
    if shared:

        def everyone(rows: int, _: int) -> None:
            for i in range(len(prompts)):
                told(i, rows)

        # whole chunks, as each alone reads them
        fill_cache(model, prompts[0][:shared], read_once, prefill_chunk, everyone)
    caches, out = [], []
    for i, prompt in enumerate(prompts):
        cache = copy.deepcopy(read_once) if shared else make_prompt_cache(model)
        own = functools.partial(_told_after, told, i, shared)
        logits = prefill(model, prompt[shared:], cache, prefill_chunk, own)[None]
        first = int(mx.argmax(_processed(logits, [], logits_processors[i] if logits_processors else [])).item())
        caches.append(cache)
        out.append([first])
        if on_token is not None:
            on_token(i, first)
    stats.prefill_seconds = time.perf_counter() - start
    live = [i for i in range(len(prompts)) if not _done(out[i], max_tokens, eos)]
    batch = _merged(caches, live)
    del caches
    before = stream.call_counts() if stream is not None else None
    start = time.perf_counter()
    while live:
        rows = mx.array([[out[i][-1]] for i in live])
        logits = model(rows, cache=batch)[:, -1, :]
        if logits_processors:
            logits = mx.concatenate([_processed(logits[k : k + 1], out[i], logits_processors[i])
                                     for k, i in enumerate(live)])  # fmt: skip
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        chosen = mx.argmax(logprobs, axis=-1).tolist()
        stats.steps += 1
        stats.rows += len(live)
        for i, token in zip(live, chosen, strict=True):
            out[i].append(int(token))
            if on_token is not None:
                on_token(i, int(token))
        keep = [k for k, i in enumerate(live) if not _done(out[i], max_tokens, eos)]
        if len(keep) < len(live):
            live = [live[k] for k in keep]
            if live:
                for layer_cache in batch:
                    layer_cache.filter(mx.array(keep))
    stats.decode_seconds = time.perf_counter() - start
    if stream is not None and before is not None:
        after = stream.call_counts()
        stats.layer_calls, stats.experts_read = after.calls - before.calls, after.unique - before.unique
    stats.tokens = [len(tokens) for tokens in out]
    return out


def _processed(logits: mx.array, tokens: list[int], processors: list[LogitsProcessor]) -> mx.array:
    """One row's logits (1, vocab) through the processors, given that sequence's tokens so far."""
    for processor in processors:
        logits = processor(mx.array(tokens, dtype=mx.int32), logits)
    return logits


def shared_prefix(prompts: list[list[int]], chunk: int) -> int:
    """Tokens every prompt begins with, in whole chunks of `chunk`, each prompt keeping at least one of its own.

    Whole chunks, because a prompt read alone is read in those chunks from its start: a shared part ending
    elsewhere would be summed in other passes than alone (another chunk's rows in the experts' GEMM, Kimi's
    delta attention's chunking) and the tokens could part at a near-tie.
    """
    if len(prompts) < 2 or chunk < 1:
        return 0
    common = next((i for i, column in enumerate(zip(*prompts)) if len(set(column)) > 1), min(map(len, prompts)))
    common = min(common, min(map(len, prompts)) - 1)
    return common // chunk * chunk


def _done(tokens: list[int], max_tokens: int, eos: set[int] | frozenset[int]) -> bool:
    return len(tokens) >= max_tokens or tokens[-1] in eos


def _merged(caches: list[list], live: list[int]) -> list:
    """The live sequences' per-layer caches as one batch cache per layer (mlx-lm's `merge`)."""
    if not live:
        return []
    merged = []
    for layer in range(len(caches[live[0]])):
        kind = type(caches[live[0]][layer])
        if not hasattr(kind, "merge"):
            raise NightshiftError(f"this model's {kind.__name__} cannot decode in a batch (mlx-lm has no merge for it)")
        merged.append(kind.merge([caches[i][layer] for i in live]))
    return merged


class _Cancelled(Exception):
    """Raised from inside the decode loop to leave it between tokens."""


def chat_batch(
    model: nn.Module,
    tokenizer: Any,
    stream: ExpertStream | None,
    prompts: list[list[int]],
    max_tokens: int,
    prefill_chunk: int = DEFAULT_CHUNK,
    cancel: threading.Event | None = None,
    progress: BatchProgress | None = None,
    reads: Callable[[GenerationStats], None] | None = None,
    logits_processors: list[list[LogitsProcessor]] | None = None,
) -> ChatBatch:
    """Greedy answers to several chat prompts, decoded together (`batch_tokens`) and detokenized one by one
    (`runtime.Model.generate_batch`).

    `progress` sees the summed statistics and every text so far before the first prompt is read, after
    each chunk of a prompt read, after each token and at the end; its tokens count from when every prompt
    has been read (until then a progress line says the prompt is being read), so their first tokens count
    then, together. The statistics' `answers` hold each answer's own figures (its prompt read, its tokens,
    how it ended): the batch's real plan. `reads` brings the statistics' reads up to date before each
    progress call. `cancel` is looked at after each token, and a cancelled batch returns what was written
    with finish reason "cancelled". `logits_processors`: one list per prompt (`batch_tokens`).
    """
    eos = set(tokenizer.eos_token_ids)
    detokenizers = [tokenizer.detokenizer for _ in prompts]
    answers = [AnswerFigures(len(prompt), max_tokens) for prompt in prompts]
    generation = GenerationStats(prompt_tokens=sum(len(p) for p in prompts), answers=answers)
    stats = BatchStats(width=len(prompts))
    firsts: list[float] = []
    lasts = [0.0] * len(prompts)
    counts = [0] * len(prompts)
    start = time.perf_counter()
    if progress is not None:
        progress(generation, ["" for _ in prompts])  # the prompts are being read: minutes on a slow machine

    def shown(now: float) -> None:
        generation.elapsed = now - start
        generation.peak_memory_bytes = mx.get_peak_memory()
        if reads is not None:
            reads(generation)
        if progress is not None:
            progress(generation, [d.text for d in detokenizers])

    def on_read(sequence: int, rows: int) -> None:
        answers[sequence].prompt_done = rows
        generation.prompt_done = sum(answer.prompt_done for answer in answers)
        if rows < len(prompts[sequence]):  # its last chunk is told with its first token
            shown(time.perf_counter())

    def on_token(sequence: int, token: int) -> None:
        now = time.perf_counter()
        answer = answers[sequence]
        if counts[sequence] == 0:
            firsts.append(now)
            on_read(sequence, len(prompts[sequence]))
            if len(firsts) == len(prompts):
                generation.time_to_first_token = now - start  # every prompt read: the batch starts writing
        counts[sequence] += 1
        lasts[sequence] = now
        answer.tokens = counts[sequence]
        if token in eos:
            answer.finish_reason = "stop"
        else:
            detokenizers[sequence].add_token(token)
            answer.finish_reason = "length" if answer.tokens >= max_tokens else None
        generation.generated_tokens = sum(counts) if len(firsts) == len(prompts) else 0
        shown(now)
        if cancel is not None and cancel.is_set():
            raise _Cancelled

    try:
        tokens = batch_tokens(model, prompts, max_tokens, stream, eos, prefill_chunk, stats, on_token,
                              logits_processors, on_read)  # fmt: skip
    except _Cancelled:
        tokens = None
    parts = []
    decode_start = max(firsts) if len(firsts) == len(prompts) else time.perf_counter()
    for i, (prompt, detokenizer) in enumerate(zip(prompts, detokenizers, strict=True)):
        detokenizer.finalize()
        ended = tokens[i][-1] in eos if tokens is not None else False
        reason = "cancelled" if tokens is None else ("stop" if ended else "length")
        read = firsts[i] - (firsts[i - 1] if i else start) if i < len(firsts) else 0.0
        parts.append(BatchText(detokenizer.text, len(prompt), counts[i], reason, read,
                               max(lasts[i] - decode_start, 0.0)))  # fmt: skip
    generation.finish_reason = "cancelled" if tokens is None else "stop" if all(
        p.finish_reason == "stop" for p in parts) else "length"  # fmt: skip
    if progress is not None:
        progress(generation, [part.text for part in parts])  # the end, with its finish reason
    return ChatBatch(parts, stats, generation)
