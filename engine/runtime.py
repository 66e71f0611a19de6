"""Open a model directory and generate from it: the engine's face to the app.

Generation streams `Chunk`s, each with the text decoded so far for that token and
live statistics, so callers (the CLI, the review runner, the daemon) can show
progress while a long generation runs, and stop it through a cancel event.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Nothing leaves the machine: transformers and huggingface_hub must never reach a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import load as load_tokenizer
from mlx_lm.utils import load_model

from nightshift.engine.batch import chat_batch
from nightshift.engine.cpu_prefill import use_gemm_prefill
from nightshift.engine.decoding import logits_processors
from nightshift.engine.errors import ModelFormatError, ModelNotFoundError, NightshiftError
from nightshift.engine.generation import (
    DEFAULT_CHUNK,
    BatchProgress,
    ChatBatch,
    Chunk,
    Decoding,
    DraftStats,
    GenerationStats,
    LogitsProcessor,
    Message,
    ReadFigures,
    chat_prompt,
    token_chunks,
)
from nightshift.engine.instruments.probes import Instruments
from nightshift.engine.io.ceilings import Ceilings
from nightshift.engine.io.drives import Drive
from nightshift.engine.models import get_classes
from nightshift.engine.moe.load import cap_buffer_cache_for, load_streaming
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.stream import ExpertStream
from nightshift.engine.prefill import counted_prefill, prefill
from nightshift.engine.speculative import Pair, check_depth, check_pair, default_depth, speculative_tokens
from nightshift.engine.store.head import vocab_size
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.manifest import is_store
from nightshift.engine.store.share import StoreShare


class Model:
    """A model loaded from a model directory, with its tokenizer and chat template.

    A store opened with `stream` settings keeps its routed experts on the drives and reads
    them as the router asks (`self.stream`); otherwise every weight is loaded into RAM. On the CPU, prompts are
    read through BLAS where that gives mlx-lm's tokens, and through MLX's kernels elsewhere; `float32_prefill`
    takes BLAS for 16-bit checkpoints too, faster but not mlx-lm's tokens (engine/cpu_prefill.py).
    """

    def __init__(
        self,
        path: Path,
        stream: StreamSettings | None = None,
        drives: list[Drive] | None = None,
        ceilings: Ceilings | None = None,
        drafter: Path | None = None,
        stage: StoreShare | None = None,
        instruments: Instruments | None = None,
        float32_prefill: bool = False,
    ):
        self.path = Path(path)
        self.stream: ExpertStream | None = None
        self.drafter: Model | None = None
        if not is_store(self.path) and not (self.path / "config.json").is_file():
            raise ModelNotFoundError(f"no model at {self.path} (config.json missing)")
        if stream is not None and not is_store(self.path):
            raise ModelFormatError(
                f"{self.path} is not a store, so its experts cannot be streamed; "
                "import it with `nightshift model import` first"
            )
        try:
            if stream is not None:
                self.model, config, self.stream = load_streaming(
                    self.path, stream, drives, ceilings, stage, instruments, float32_prefill
                )
            elif is_store(self.path):
                self.model, config = load_store(self.path)
            else:
                self.model, config = load_model(self.path, get_model_classes=get_classes)
            self.tokenizer = load_tokenizer(self.path, eos_token_ids=config.get("eos_token_id"))
            use_gemm_prefill(self.model, instruments, float32_prefill)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelFormatError(f"the model at {self.path} cannot be loaded: {exc}") from exc
        self.vocab_size = vocab_size(config)
        if drafter is not None:
            self.drafter = Model(drafter)
            check_pair(
                self.tokenizer.get_vocab(),
                self.vocab_size,
                self.drafter.tokenizer.get_vocab(),
                self.drafter.vocab_size,
                str(drafter),
            )

    def chat_tokens(self, messages: list[Message]) -> list[int]:
        """Token ids of `messages` formatted with the model's chat template, ready to answer."""
        return chat_prompt(self.tokenizer, messages)

    def generate(self, messages: list[Message], **options: Any) -> Iterator[Chunk]:
        """Stream the answer to `messages`, chat-formatted; `options` are `generate_tokens`' (greedy by default)."""
        yield from self.generate_tokens(self.chat_tokens(messages), **options)

    def generate_tokens(
        self,
        prompt: list[int],
        *,
        max_tokens: int = 256,
        temp: float = 0.0,
        seed: int = 0,
        cancel: threading.Event | None = None,
        prefill_chunk: int = DEFAULT_CHUNK,
        draft_depth: int | None = None,
        on_prefill: Callable[[GenerationStats], None] | None = None,
        decoding: Decoding | None = None,
        draft_switch_off: bool = True,
        forced: list[int] | None = None,
    ) -> Iterator[Chunk]:
        """Stream a continuation of the token ids `prompt`, prefilled `prefill_chunk` rows at a time.

        `decoding` (engine/decoding.py: numerals blocked, a repetition penalty) shapes every token's logits, the
        first one's too, from the tokens generated so far, not the prompt. Not with a drafter.

        `on_prefill` sees the statistics after each prefilled chunk (`prompt_done` of `prompt_tokens`):
        on a slow machine reading the prompt takes most of a generation's time.

        With a drafter, `draft_depth` tokens are drafted per verify pass (None: the measured best
        depth for this model and drafter, see `engine.speculative.default_depth`; 0: no drafting);
        drafting switches itself off when it stops paying unless `draft_switch_off` is False (sweeps).

        `forced`: the ids to yield, `max_tokens` of them, each fed to the next step whatever the logits said (`temp`
        unused): the model timed and routed over a given text, as a bench compares engines on the same tokens.

        The last chunk yields the first token and ends with the last row's EOS check, as
        mlx-lm's `stream_generate` does: an end token is yielded (its text empty) and ends the stream.
        """
        mx.random.seed(seed)
        stats = GenerationStats(prompt_tokens=len(prompt))
        if self.drafter is not None:
            depth = default_depth(self.path, self.drafter.path) if draft_depth is None else check_depth(draft_depth)
            stats.draft = DraftStats(depth=depth)
        elif draft_depth:
            raise NightshiftError(f"draft depth {draft_depth} needs a drafter: open the model with one (--drafter)")
        if forced is not None and len(forced) < max_tokens:
            raise NightshiftError(f"forced: {len(forced)} ids for {max_tokens} tokens: give at least one id a token")
        if forced is not None and stats.draft is not None:
            raise NightshiftError("forced ids are not drafted: open the model without a drafter")
        processors = logits_processors(decoding, self.tokenizer, str(self.path))
        if processors and stats.draft is not None:
            raise NightshiftError(
                "a decoding's processors do not apply to drafted tokens: open the model without a drafter"
            )
        start = time.perf_counter()
        before = self.figures()  # this generation's figures: deltas (a loaded model serves many)

        def reads(stats: GenerationStats) -> None:
            stats.count_reads(self.figures(settled=True), before)

        def prefilled(done: int, total: int) -> None:
            stats.prompt_done, stats.elapsed = done, time.perf_counter() - start
            reads(stats)
            if on_prefill is not None:
                on_prefill(stats)

        def timed() -> Iterator[tuple[int, float]]:
            sampler = make_sampler(temp=temp) if forced is None else forcing_sampler(forced)
            for token in self._token_ids(
                prompt, max_tokens, sampler, prefill_chunk, stats, draft_switch_off, prefilled, processors
            ):
                stats.peak_memory_bytes = mx.get_peak_memory()
                yield token, time.perf_counter() - start

        yield from token_chunks(timed(), self.tokenizer, stats, max_tokens, cancel, reads)

    def generate_batch(
        self,
        conversations: list[list[Message]],
        max_tokens: int,
        *,
        prefill_chunk: int = DEFAULT_CHUNK,
        cancel: threading.Event | None = None,
        progress: BatchProgress | None = None,
        decodings: list[Decoding] | None = None,
    ) -> ChatBatch:
        """Greedy answers to several chats, decoded together (`engine.batch.chat_batch`); `decodings`, one per
        chat (`generate_tokens`)."""
        prompts = [self.chat_tokens(messages) for messages in conversations]
        if decodings is not None and len(decodings) != len(prompts):
            raise NightshiftError(f"{len(decodings)} decodings for {len(prompts)} chats: give one per chat")
        processors = (
            None if decodings is None else [logits_processors(d, self.tokenizer, str(self.path)) for d in decodings]
        )
        before = self.figures()  # the stream's counters since this batch began (a shared model)

        def reads(stats: GenerationStats) -> None:
            stats.count_reads(self.figures(settled=True), before)

        return chat_batch(
            self.model,
            self.tokenizer,
            self.stream,
            prompts,
            max_tokens,
            prefill_chunk,
            cancel,
            progress,
            reads,
            processors,
        )

    def _token_ids(
        self,
        prompt: list[int],
        max_tokens: int,
        sampler,
        prefill_chunk: int,
        stats: GenerationStats,
        draft_switch_off: bool = True,
        prefilled: Callable[[int, int], None] | None = None,
        processors: list[LogitsProcessor] | None = None,
    ) -> Iterator[int]:
        """Token ids: the first from the prefill's last row, the rest from mlx-lm's decode loop on the same cache."""
        cache = make_prompt_cache(self.model)
        logprobs, reads = counted_prefill(self.model, prompt, cache, prefill_chunk, self.stream, prefilled)
        if reads is not None:
            stats.prefill_bytes_read, stats.prefill_unique_bytes = reads.bytes_read, reads.unique_bytes
        logits = logprobs[None]
        for processor in processors or []:
            logits = processor(mx.array([], dtype=mx.int32), logits)
        first = sampler(logits).item()
        yield first
        if max_tokens > 1 and self.drafter is not None and stats.draft is not None and stats.draft.depth > 0:
            yield from self._drafted(
                self.drafter,
                prompt,
                first,
                max_tokens - 1,
                cache,
                sampler,
                prefill_chunk,
                stats.draft,
                draft_switch_off,
            )
        elif max_tokens > 1:
            steps = generate_step(
                mx.array([first]),
                self.model,
                prompt_cache=cache,
                sampler=sampler,
                max_tokens=max_tokens - 1,
                logits_processors=list(processors or []),
            )
            yield from (int(token) for token, _ in steps)

    def _drafted(
        self,
        drafter: Model,
        prompt: list[int],
        first: int,
        limit: int,
        cache: list,
        sampler,
        prefill_chunk: int,
        stats: DraftStats,
        switch_off: bool,
    ) -> Iterator[int]:
        """Tokens after `first` drafted by the drafter and verified by this model (engine/speculative.py)."""
        draft_cache = make_prompt_cache(drafter.model)
        prefill(drafter.model, prompt, draft_cache, prefill_chunk)
        pair = Pair(self.model, cache, drafter.model, draft_cache, sampler, self.stream)
        yield from speculative_tokens(pair, first, stats.depth, stats, limit=limit, switch_off=switch_off)

    def figures(self, settled: bool = False) -> ReadFigures:
        """What the stream has read and served since the model was opened (nothing for a model held in RAM).

        `settled` (`ExpertStream.figures`): the pass mlx-lm has queued beyond the token just made is left to the
        next count; after the last token that pass is one mlx-lm computes and nobody uses, so the figures of a
        generation are its own tokens' (the next generation's first count takes that pass in).
        """
        if self.stream is None:
            return ReadFigures()
        figures = self.stream.figures(settled=settled)
        barriers = self.stream.trace.barrier_counts()
        return ReadFigures(
            drive_bytes={name: d.bytes for name, d in figures.drives.items()},
            cache_hits=figures.cache_hits,
            cache_misses=figures.cache_misses,
            cache_budget=figures.cache_budget,
            cache_used=figures.cache_used,
            recall_hits=figures.recall_hits,
            recall_needed=figures.recall_needed,
            last_landed=max(barriers, key=lambda drive: barriers[drive]) if barriers else "",
        )

    def close(self) -> None:
        """Stop the reader threads of a streamed model (a no-op otherwise)."""
        if self.stream is not None:
            self.stream.close()


def open_model(
    path: Path,
    stream: StreamSettings | None = None,
    drives: list[Drive] | None = None,
    ceilings: Ceilings | None = None,
    drafter: Path | None = None,
    stage: StoreShare | None = None,
    instruments: Instruments | None = None,
    float32_prefill: bool = False,
) -> Model:
    """Load the model directory at `path`; a store with `stream` settings streams its experts from `drives`
    (default: the drives its manifest names), starting its read estimates from `ceilings` if given.
    `drafter`: a small model directory sharing the tokenizer, held in RAM, for speculative decoding.
    `stage`: this process is one rank of a pipeline over several hosts (engine/distributed).
    `instruments`: a benchmark's counters and hooks (engine/instruments/probes.py), kept by this model alone.
    `float32_prefill`: read prompts through float32 BLAS on 16-bit checkpoints too (faster; not mlx-lm's tokens).

    A store held in RAM caps MLX's buffer cache as the streamed open does (`cap_buffer_cache_for`). Its drafter
    (opened by `Model`) does not: it would cut the cap the model beside it set for its own steps."""
    model = Model(path, stream, drives, ceilings, drafter, stage, instruments, float32_prefill)
    if stream is None and is_store(model.path):
        cap_buffer_cache_for(model.path)
    return model


def forcing_sampler(ids: list[int]) -> Callable[[mx.array], mx.array]:
    """A sampler giving `ids` in turn whatever the logits (mlx-lm's sampler signature), then the last one again:
    mlx-lm's decode loop queues one pass past its last token, whose token nobody reads."""
    queue = iter(ids)

    def sample(logits: mx.array) -> mx.array:
        return mx.array([next(queue, ids[-1])], dtype=mx.uint32)

    return sample
