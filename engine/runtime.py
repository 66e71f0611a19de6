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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

# Nothing leaves the machine: transformers and huggingface_hub must never reach a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import load as load_tokenizer
from mlx_lm.utils import load_model

from nightshift.engine.cpu_prefill import use_gemm_prefill
from nightshift.engine.errors import ModelFormatError, ModelNotFoundError, NightshiftError
from nightshift.engine.io.ceilings import Ceilings
from nightshift.engine.io.drives import Drive
from nightshift.engine.models import get_classes
from nightshift.engine.moe.load import load_streaming
from nightshift.engine.moe.settings import StreamSettings
from nightshift.engine.moe.stream import ExpertStream, StreamFigures
from nightshift.engine.prefill import DEFAULT_CHUNK, counted_prefill, prefill
from nightshift.engine.speculative import DraftStats, Pair, check_depth, check_pair, default_depth, speculative_tokens
from nightshift.engine.store.loader import load_store
from nightshift.engine.store.manifest import is_store

if TYPE_CHECKING:
    from nightshift.engine.distributed.stage import PipelineStage

Message = dict[str, str]
# mlx-lm's logits processor: (tokens generated so far, logits of shape (1, vocab)) -> logits.
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


@dataclass
class GenerationStats:
    """Live figures of one generation; times in seconds."""

    prompt_tokens: int = 0
    prompt_done: int = 0  # prompt rows prefilled so far (the prompt is read a chunk at a time)
    generated_tokens: int = 0
    time_to_first_token: float = 0.0
    elapsed: float = 0.0
    peak_memory_bytes: int = 0
    finish_reason: str | None = None
    # Streamed stores only, this generation's own (the stream outlives it): bytes read per drive,
    # experts served by the RAM cache, prefetch recall so far.
    drive_bytes: dict[str, int] = field(default_factory=dict)
    cache_hits: int = 0
    cache_misses: int = 0
    # The expert cache's budget now and the bytes it holds (streamed stores with a cache; not deltas).
    cache_budget: int = 0
    cache_used: int = 0
    prefetch_recall: float = 0.0
    # Expert bytes the prompt needed (each (layer, expert) once) and bytes read while prefilling it.
    prefill_unique_bytes: int = 0
    prefill_bytes_read: int = 0
    last_landed: str = ""  # the drive whose read landed last (the barrier) most often in recent passes
    # With a drafter: drafted/accepted tokens, verify passes, union size per verify, switch-off (engine/speculative.py).
    draft: DraftStats | None = None

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first, over the time after the first (prefill excluded)."""
        decode_time = self.elapsed - self.time_to_first_token
        return (self.generated_tokens - 1) / decode_time if self.generated_tokens > 1 and decode_time > 0 else 0.0

    @property
    def prefill_read_amplification(self) -> float:
        """Bytes read during prefill / unique expert bytes the prompt needed (1.0: each expert read once)."""
        return self.prefill_bytes_read / self.prefill_unique_bytes if self.prefill_unique_bytes else 0.0

    @property
    def cache_hit_rate(self) -> float:
        """This generation's expert lookups served from RAM."""
        lookups = self.cache_hits + self.cache_misses
        return self.cache_hits / lookups if lookups else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.time_to_first_token if self.time_to_first_token > 0 else 0.0


@dataclass
class Chunk:
    """One generated token: its id, the text it completes, and the statistics so far."""

    token: int
    text: str
    stats: GenerationStats = field(default_factory=GenerationStats)


class Model:
    """A model loaded from a model directory, with its tokenizer and chat template.

    A store opened with `stream` settings keeps its routed experts on the drives and reads
    them as the router asks (`self.stream`); otherwise every weight is loaded into RAM.
    """

    def __init__(
        self,
        path: Path,
        stream: StreamSettings | None = None,
        drives: list[Drive] | None = None,
        ceilings: Ceilings | None = None,
        drafter: Path | None = None,
        stage: PipelineStage | None = None,
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
                self.model, config, self.stream = load_streaming(self.path, stream, drives, ceilings, stage)
            elif is_store(self.path):
                self.model, config = load_store(self.path)
            else:
                self.model, config = load_model(self.path, get_model_classes=get_classes)
            self.tokenizer = load_tokenizer(self.path, eos_token_ids=config.get("eos_token_id"))
            use_gemm_prefill(self.model)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelFormatError(f"the model at {self.path} cannot be loaded: {exc}") from exc
        self.vocab_size = int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size", 0))
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
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True))

    def generate(self, messages: list[Message], **options) -> Iterator[Chunk]:
        """Stream the answer to `messages`, chat-formatted; `options` are `generate_tokens`' (greedy by default)."""
        yield from self.generate_tokens(self.chat_tokens(messages), **options)

    def generate_tokens(
        self,
        prompt: list[int],
        max_tokens: int = 256,
        temp: float = 0.0,
        seed: int = 0,
        cancel: threading.Event | None = None,
        prefill_chunk: int = DEFAULT_CHUNK,
        draft_depth: int | None = None,
        draft_switch_off: bool = True,
        on_prefill: Callable[[GenerationStats], None] | None = None,
        logits_processors: list[LogitsProcessor] | None = None,
    ) -> Iterator[Chunk]:
        """Stream a continuation of the token ids `prompt`, prefilled `prefill_chunk` rows at a time.

        `logits_processors` (mlx-lm's: a repetition penalty, a mask) shape every token's logits, the first
        one's too; they see the tokens generated so far, not the prompt. Not with a drafter.

        `on_prefill` sees the statistics after each prefilled chunk (`prompt_done` of `prompt_tokens`):
        on a slow machine reading the prompt takes most of a generation's time.

        With a drafter, `draft_depth` tokens are drafted per verify pass (None: the measured best
        depth for this model and drafter, see `engine.speculative.default_depth`; 0: no drafting);
        drafting switches itself off when it stops paying unless `draft_switch_off` is False (sweeps).

        The last chunk yields the first token and ends with the last row's EOS check, as
        mlx-lm's `stream_generate` does: an end token is yielded (its text empty) and ends the stream.
        """
        if max_tokens < 1:
            raise NightshiftError(f"max_tokens {max_tokens}: ask for at least 1 token")
        mx.random.seed(seed)
        stats = GenerationStats(prompt_tokens=len(prompt))
        if self.drafter is not None:
            depth = default_depth(self.path, self.drafter.path) if draft_depth is None else check_depth(draft_depth)
            stats.draft = DraftStats(depth=depth)
        elif draft_depth:
            raise NightshiftError(f"draft depth {draft_depth} needs a drafter: open the model with one (--drafter)")
        if logits_processors and stats.draft is not None:
            raise NightshiftError("logits processors do not apply to drafted tokens: open the model without a drafter")
        detokenizer = self.tokenizer.detokenizer
        start = time.perf_counter()
        before = self.stream.figures() if self.stream is not None else None  # this generation's figures: deltas

        def prefilled(done: int, total: int) -> None:
            stats.prompt_done, stats.elapsed = done, time.perf_counter() - start
            self._stream_figures(stats, before)
            if on_prefill is not None:
                on_prefill(stats)

        for token in self._token_ids(
            prompt,
            max_tokens,
            make_sampler(temp=temp),
            prefill_chunk,
            stats,
            draft_switch_off,
            prefilled,
            logits_processors or [],
        ):
            now = time.perf_counter() - start
            if stats.generated_tokens == 0:
                stats.time_to_first_token = now
            stats.generated_tokens += 1
            stats.elapsed = now
            stats.peak_memory_bytes = mx.get_peak_memory()
            self._stream_figures(stats, before)
            done = token in self.tokenizer.eos_token_ids
            if not done:
                detokenizer.add_token(token)
            if done or stats.generated_tokens == max_tokens:
                detokenizer.finalize()
                stats.finish_reason = "stop" if done else "length"
            yield Chunk(token=token, text=detokenizer.last_segment, stats=stats)
            if stats.finish_reason is not None:
                return
            if cancel is not None and cancel.is_set():
                stats.finish_reason = "cancelled"
                return

    def _token_ids(
        self,
        prompt: list[int],
        max_tokens: int,
        sampler,
        prefill_chunk: int,
        stats: GenerationStats,
        draft_switch_off: bool = True,
        prefilled: Callable[[int, int], None] | None = None,
        processors: list[LogitsProcessor] = (),
    ) -> Iterator[int]:
        """Token ids: the first from the prefill's last row, the rest from mlx-lm's decode loop on the same cache."""
        cache = make_prompt_cache(self.model)
        logprobs, reads = counted_prefill(self.model, prompt, cache, prefill_chunk, self.stream, prefilled)
        if reads is not None:
            stats.prefill_bytes_read, stats.prefill_unique_bytes = reads.bytes_read, reads.unique_bytes
        logits = logprobs[None]
        for processor in processors:
            logits = processor(mx.array([], dtype=mx.int32), logits)
        first = sampler(logits).item()
        yield first
        if max_tokens > 1 and stats.draft is not None and stats.draft.depth > 0:
            yield from self._drafted(
                prompt, first, max_tokens - 1, cache, sampler, prefill_chunk, stats.draft, draft_switch_off
            )
        elif max_tokens > 1:
            steps = generate_step(mx.array([first]), self.model, prompt_cache=cache, sampler=sampler,
                                  max_tokens=max_tokens - 1, logits_processors=list(processors))  # fmt: skip
            yield from (int(token) for token, _ in steps)

    def _drafted(
        self,
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
        draft_cache = make_prompt_cache(self.drafter.model)
        prefill(self.drafter.model, prompt, draft_cache, prefill_chunk)
        pair = Pair(self.model, cache, self.drafter.model, draft_cache, sampler, self.stream)
        yield from speculative_tokens(pair, first, stats.depth, stats, limit=limit, switch_off=switch_off)

    def _stream_figures(self, stats: GenerationStats, before: StreamFigures | None) -> None:
        """The stream's counters since `before` (taken as the generation began): a loaded model serves many.

        Settled (`ExpertStream.figures`): the pass mlx-lm has queued beyond the token just made is left to the
        next count; after the last token that pass is one mlx-lm computes and nobody uses, so the figures of a
        generation are its own tokens' (the next generation's `before` takes that pass in).
        """
        if self.stream is None or before is None:
            return
        figures = self.stream.figures(settled=True)
        stats.drive_bytes = {name: d.bytes - before.drives[name].bytes for name, d in figures.drives.items()}
        stats.cache_hits = figures.cache_hits - before.cache_hits
        stats.cache_misses = figures.cache_misses - before.cache_misses
        stats.cache_budget, stats.cache_used = figures.cache_budget, figures.cache_used
        needed = figures.recall_needed - before.recall_needed
        stats.prefetch_recall = (figures.recall_hits - before.recall_hits) / needed if needed else 0.0
        barriers = self.stream.trace.barrier_counts()
        stats.last_landed = max(barriers, key=barriers.get) if barriers else ""

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
    stage: PipelineStage | None = None,
) -> Model:
    """Load the model directory at `path`; a store with `stream` settings streams its experts from `drives`
    (default: the drives its manifest names), starting its read estimates from `ceilings` if given.
    `drafter`: a small model directory sharing the tokenizer, held in RAM, for speculative decoding.
    `stage`: this process is one rank of a pipeline over several hosts (engine/distributed)."""
    return Model(path, stream, drives, ceilings, drafter, stage)
